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
func endpointCmd(cmd *cobra.Command, verb, done string, call func(context.Context, registrarv1.RegistrarClient, registry.EndpointID) (string, error)) *cobra.Command {
	var service, ip, protocol string
	var cf *clientFlags
	cmd.Args = cobra.NoArgs
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		id, err := identityFlags(service, ip, protocol)
		if err != nil {
			return err
		}
		proto := registry.ProtocolName(id.Protocol)
		what := fmt.Sprintf("%s %s %s (%s)", verb, id.Service, id.IP, proto)
		var version string
		var callErr error
		if err := cf.unary(cmd.Context(), what, func(ctx context.Context, c registrarv1.RegistrarClient) error {
			version, callErr = call(ctx, c, id)
			return callErr
		}); err != nil {
			if status.Code(callErr) == codes.NotFound {
				err = fmt.Errorf("%w (check --protocol; see what is registered with: aether list --service %s)", err, id.Service)
			}
			return err
		}
		_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s %s %s (%s) version %s\n", done, id.Service, id.IP, proto, version)
		return err
	}
	f := cmd.Flags()
	f.StringVar(&service, "service", "", "service name (required)")
	f.StringVar(&ip, "ip", "", "IP address of the endpoint (required)")
	f.StringVar(&protocol, "protocol", "http", "protocol: "+registry.ProtocolNames)
	cf = addClientFlags(cmd)
	return cmd
}
