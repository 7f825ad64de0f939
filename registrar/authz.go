package registrar

import (
	"context"
	"errors"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/authz"
)

// guard authenticates and authorizes gRPC calls when the registrar requires
// client certificates (GRPCConfig.Authorize). Without a client CA the
// service has no guard: plaintext or server-only TLS, development mode, and
// every caller may do everything.
//
// Writes are authorized against the endpoint AS STORED, from inside the
// registrar's lock (a WriteCheck): the stored node cannot change between
// the look-up and the write, so there is no window in which a node could
// slip a write past a concurrent change of ownership.
type guard struct {
	r              *Registrar
	trustDomain    string
	operatorPrefix string
	policy         authz.Policy
}

func newGuard(r *Registrar, c GRPCConfig) *guard {
	if !c.Authorize {
		return nil
	}
	prefix, _ := authz.NormalizeOperatorPrefix(c.TrustDomain, c.OperatorPrefix) // checked by the process's Validate
	return &guard{r: r, trustDomain: c.TrustDomain, operatorPrefix: prefix}
}

// identity authenticates the caller. A nil guard authenticates no one and
// allows everything (the zero Identity is never looked at then).
func (g *guard) identity(ctx context.Context, method string) (authz.Identity, error) {
	if g == nil {
		return authz.Identity{}, nil
	}
	id, err := authz.FromContext(ctx, g.trustDomain, g.operatorPrefix)
	if err != nil {
		return id, g.denied(method, err)
	}
	return id, nil
}

// read authenticates a read call.
func (g *guard) read(ctx context.Context, method string) error {
	if g == nil {
		return nil
	}
	id, err := g.identity(ctx, method)
	if err != nil {
		return err
	}
	return g.denied(method, g.policy.AuthorizeRead(id))
}

// node authorizes a write of node record name.
func (g *guard) node(ctx context.Context, method, op, name string) error {
	if g == nil {
		return nil
	}
	id, err := g.identity(ctx, method)
	if err != nil {
		return err
	}
	return g.denied(method, g.policy.AuthorizeNodeWrite(id, op, name))
}

// endpoint authenticates the caller of an endpoint write and returns the
// WriteCheck that authorizes it under the registrar's lock (nil without a
// guard): the node of the endpoint to be stored, and the node of the one
// already stored under its key. The check only decides; the handler
// records a denial through denied, outside the lock.
func (g *guard) endpoint(ctx context.Context, method, op string) (WriteCheck, error) {
	if g == nil {
		return nil, nil
	}
	id, err := g.identity(ctx, method)
	if err != nil {
		return nil, err
	}
	return func(ep, stored *registryv1.ServiceEndpoint) error {
		if ep != nil {
			if err := g.policy.AuthorizeEndpointWrite(id, op, ep.GetNode()); err != nil {
				return err
			}
		}
		if stored != nil {
			if err := g.policy.AuthorizeEndpointWrite(id, op, stored.GetNode()); err != nil {
				return err
			}
		}
		return nil
	}, nil
}

// denied counts and logs a refusal (an *authz.Error in err's chain) and
// returns err; any other error, and nil, pass through untouched.
func (g *guard) denied(method string, err error) error {
	var ae *authz.Error
	if g == nil || !errors.As(err, &ae) {
		return err
	}
	g.r.metrics.authzDenied.WithLabelValues(ae.Rule).Inc()
	identity := ae.Identity.URI
	if identity == "" {
		identity = "unauthenticated"
	}
	g.r.log.Warn("request denied", "method", method, "identity", identity, "rule", ae.Rule, "code", ae.Code.String(), "reason", ae.Msg)
	return ae
}
