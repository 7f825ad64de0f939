package grpcapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/authz"
	"github.com/aethermesh/aether/registrar/replica"
)

// guard authenticates and authorizes gRPC calls when the registrar requires
// client certificates (Config.Authz, from --tls-client-ca). Without a client
// CA the service has no guard: plaintext or server-only TLS, development
// mode, and every caller may do everything.
//
// Writes are authorized against the endpoint AS STORED, from inside the
// registrar's lock (a WriteCheck): the stored node cannot change between
// the look-up and the write, so there is no window in which a node could
// slip a write past a concurrent change of ownership.
type guard struct {
	m              *metrics
	log            *slog.Logger
	trustDomain    string
	operatorPrefix string
	policy         authz.Policy
}

func newGuard(a Authz, m *metrics, log *slog.Logger) (*guard, error) {
	prefix, err := authz.NormalizeOperatorPrefix(a.TrustDomain, a.OperatorPrefix)
	if err != nil {
		return nil, fmt.Errorf("authorization: %w", err)
	}
	return &guard{m: m, log: log, trustDomain: a.TrustDomain, operatorPrefix: prefix}, nil
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
func (g *guard) endpoint(ctx context.Context, method, op string) (replica.WriteCheck, error) {
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
	g.m.authzDenied.WithLabelValues(ae.Rule).Inc()
	identity := ae.Identity.URI
	if identity == "" {
		identity = "unauthenticated"
	}
	g.log.Warn("request denied", "method", method, "identity", identity, "rule", ae.Rule, "code", ae.Code.String(), "reason", ae.Msg)
	return ae
}

// nodeIdentity is the node name the caller authenticated as with a client
// certificate, or "" (no guard, or not a node identity).
func (g *guard) nodeIdentity(ctx context.Context) string {
	if g == nil {
		return ""
	}
	id, err := authz.FromContext(ctx, g.trustDomain, g.operatorPrefix)
	if err != nil || id.Kind != authz.Node {
		return ""
	}
	return id.Name
}
