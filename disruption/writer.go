package disruption

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
)

// writer sends the rolls' writes through replica A, failing over to B only
// while A is down, as a deployment controller behind a Service would.
type writer struct {
	conns   []registrarv1.RegistrarClient // A, B
	timeout time.Duration                 // give up on a write after this long
}

// do retries call until it succeeds, on A first and then B, for as long as
// the registrars are unavailable; any other error, or one lasting longer
// than the timeout, is returned.
func (w *writer) do(what string, call func(ctx context.Context, c registrarv1.RegistrarClient) error) error {
	deadline := time.Now().Add(w.timeout)
	for {
		var err error
		for _, c := range w.conns {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			err = call(ctx, c)
			cancel()
			if err == nil {
				return nil
			}
			if code := status.Code(err); code != codes.Unavailable && code != codes.DeadlineExceeded {
				return fmt.Errorf("%s: %w", what, err)
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: still failing after %v: %w", what, w.timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (w *writer) register(p *pod) error {
	return w.do("register "+p.ip, func(ctx context.Context, c registrarv1.RegistrarClient) error {
		_, err := c.RegisterEndpoint(ctx, &registrarv1.RegisterEndpointRequest{Endpoint: &registryv1.ServiceEndpoint{
			Service: p.svc, Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: p.ip, Ports: p.ports,
			Zone: "z1", State: registryv1.State_STATE_SERVING,
			// No Node: static endpoints, never ghost-swept.
		}})
		return err
	})
}

func (w *writer) drain(p *pod) error {
	return w.do("drain "+p.ip, func(ctx context.Context, c registrarv1.RegistrarClient) error {
		_, err := c.DrainEndpoint(ctx, &registrarv1.DrainEndpointRequest{Service: p.svc, Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: p.ip})
		return err
	})
}

func (w *writer) unregister(p *pod) error {
	return w.do("unregister "+p.ip, func(ctx context.Context, c registrarv1.RegistrarClient) error {
		_, err := c.UnregisterEndpoint(ctx, &registrarv1.UnregisterEndpointRequest{Service: p.svc, Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: p.ip})
		if status.Code(err) == codes.NotFound {
			return nil
		}
		return err
	})
}
