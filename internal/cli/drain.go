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

func newDrainCmd() *cobra.Command {
	var service, ip, protocol string
	var cf *clientFlags
	cmd := &cobra.Command{
		Use:   "drain",
		Short: "Mark an endpoint DRAINING (phase one of removing it)",
		Long: `Mark an endpoint DRAINING. It stays listed, marked, so proxies stop
sending it new requests while in-flight ones finish. Remove it afterwards
with "aether deregister" (phase two).`,
		Example: `  aether drain --service web --ip 10.0.0.1
  aether deregister --service web --ip 10.0.0.1`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			id, err := identityFlags(service, ip, protocol)
			if err != nil {
				return err
			}
			if err := cf.validate(); err != nil {
				return err
			}
			proto := registry.ProtocolName(id.Protocol)
			what := fmt.Sprintf("drain %s %s (%s)", id.Service, id.IP, proto)
			client, done, err := cf.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			ctx, cancel := context.WithTimeout(cmd.Context(), cf.timeout)
			defer cancel()
			resp, err := client.DrainEndpoint(ctx, &registrarv1.DrainEndpointRequest{Service: id.Service, Protocol: id.Protocol, Ip: id.IP})
			if err != nil {
				mapped := cf.rpcError(what, err)
				if status.Code(err) == codes.NotFound {
					mapped = fmt.Errorf("%w (check --protocol; see what is registered with: aether list --service %s)", mapped, id.Service)
				}
				return mapped
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "draining %s %s (%s) version %s\n", id.Service, id.IP, proto, resp.GetVersion())
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&service, "service", "", "service name (required)")
	f.StringVar(&ip, "ip", "", "IP address of the endpoint (required)")
	f.StringVar(&protocol, "protocol", "http", "protocol: "+registry.ProtocolNames)
	cf = addClientFlags(cmd)
	return cmd
}
