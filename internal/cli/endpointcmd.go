package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	"github.com/aethermesh/aether/registry"
)

// endpointCmd builds a command that acts on one registered endpoint named by
// --service, --ip and --protocol (deregister, drain): same flags, same
// validation, same NotFound hint; only the RPC and the verb differ.
// call makes the RPC, asking for wait_persisted when wait is set, and
// returns the version and persisted of its answer.
func endpointCmd(cmd *cobra.Command, verb, done string, call func(ctx context.Context, c registrarv1.RegistrarClient, id registry.EndpointID, wait bool) (string, bool, error)) *cobra.Command {
	var service, ip, protocol string
	var cf *clientFlags
	var wf *waitFlags
	cmd.Args = cobra.NoArgs
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		id, err := identityFlags(service, ip, protocol)
		if err != nil {
			return err
		}
		if err := wf.validate(); err != nil {
			return err
		}
		proto := registry.ProtocolName(id.Protocol)
		what := fmt.Sprintf("%s %s %s (%s)", verb, id.Service, id.IP, proto)
		var version string
		var persisted bool
		var callErr error
		ucf := wf.callFlags(cf) // wait.go
		if err := ucf.unary(cmd.Context(), what, func(ctx context.Context, c registrarv1.RegistrarClient) error {
			version, persisted, callErr = call(ctx, c, id, wf.wait)
			return callErr
		}); err != nil {
			if werr := wf.failed(what, callErr); werr != nil {
				return werr
			}
			if status.Code(callErr) == codes.NotFound {
				err = fmt.Errorf("%w (check --protocol; see what is registered with: aether list --service %s)", err, id.Service)
			}
			return err
		}
		if err := wf.confirm(what, ucf.addr, persisted); err != nil {
			return err
		}
		_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s %s %s (%s) version %s%s\n", done, id.Service, id.IP, proto, version, note(persisted))
		return err
	}
	f := cmd.Flags()
	f.StringVar(&service, "service", "", "service name (required)")
	f.StringVar(&ip, "ip", "", "IP address of the endpoint (required)")
	f.StringVar(&protocol, "protocol", "http", "protocol: "+registry.ProtocolNames)
	cf = addClientFlags(cmd)
	wf = addWaitFlags(cmd)
	return cmd
}
