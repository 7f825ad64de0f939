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
		if err := cf.validate(); err != nil {
			return err
		}
		proto := registry.ProtocolName(id.Protocol)
		what := fmt.Sprintf("%s %s %s (%s)", verb, id.Service, id.IP, proto)
		client, closeConn, err := cf.connect(cmd.Context())
		if err != nil {
			return err
		}
		defer closeConn()
		ctx, cancel := context.WithTimeout(cmd.Context(), cf.timeout)
		defer cancel()
		version, err := call(ctx, client, id)
		if err != nil {
			mapped := cf.rpcError(what, err)
			if status.Code(err) == codes.NotFound {
				mapped = fmt.Errorf("%w (check --protocol; see what is registered with: aether list --service %s)", mapped, id.Service)
			}
			return mapped
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
