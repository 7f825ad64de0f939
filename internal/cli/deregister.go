package cli

import (
	"context"

	"github.com/spf13/cobra"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	"github.com/aethermesh/aether/registry"
)

func newDeregisterCmd() *cobra.Command {
	return endpointCmd(&cobra.Command{
		Use:   "deregister",
		Short: "Remove an endpoint",
		Long: `Remove an endpoint from the registrar. The endpoint is identified by
service, protocol and IP; --protocol defaults to http like in "register".`,
		Example: `  aether deregister --service web --ip 10.0.0.1
  aether deregister --service api --ip 10.0.0.2 --protocol grpc`,
	}, "deregister", "deregistered", func(ctx context.Context, c registrarv1.RegistrarClient, id registry.EndpointID, wait bool) (string, bool, error) {
		// The reference for registrars that read it, the same identity in
		// the flat fields for those that predate it; the two agree, which
		// is what a newer registrar checks.
		resp, err := c.UnregisterEndpoint(ctx, &registrarv1.UnregisterEndpointRequest{Endpoint: id.Ref(), Service: id.Service, Protocol: id.Protocol, Ip: id.IP, WaitPersisted: wait})
		return resp.GetVersion(), resp.GetPersisted(), err
	})
}
