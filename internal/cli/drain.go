package cli

import (
	"context"

	"github.com/spf13/cobra"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	"github.com/aethermesh/aether/registry"
)

func newDrainCmd() *cobra.Command {
	return endpointCmd(&cobra.Command{
		Use:   "drain",
		Short: "Mark an endpoint DRAINING (phase one of removing it)",
		Long: `Mark an endpoint DRAINING. It stays listed, marked, so proxies stop
sending it new requests while in-flight ones finish. Remove it afterwards
with "aether deregister" (phase two).`,
		Example: `  aether drain --service web --ip 10.0.0.1
  aether deregister --service web --ip 10.0.0.1`,
	}, "drain", "draining", func(ctx context.Context, c registrarv1.RegistrarClient, id registry.EndpointID, wait bool) (string, bool, error) {
		// The reference for registrars that read it, the same identity in
		// the flat fields for those that predate it; the two agree, which
		// is what a newer registrar checks.
		resp, err := c.DrainEndpoint(ctx, &registrarv1.DrainEndpointRequest{Endpoint: id.Ref(), Service: id.Service, Protocol: id.Protocol, Ip: id.IP, WaitPersisted: wait})
		return resp.GetVersion(), resp.GetPersisted(), err
	})
}
