package registrar

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/authz"
	"github.com/aethermesh/aether/registry"
)

// Ownership of endpoints. An endpoint whose node field names a live node
// (one whose record this registrar holds) belongs to that node's agent, and
// the agent re-registers what it owns whenever the registrar's state lacks
// it (client re-assertion). An operator's removal of such an endpoint would
// therefore last only until the agent's next look at the registrar, a
// removal undone behind the operator's back; so it is refused, naming the
// node and the fix. The agent's own removals name its node
// (UnregisterEndpointRequest.owner_node), and with client certificates a
// node identity is the owner of its node's endpoints whatever the request
// says. Once the node is gone (no record: it left, or its lease lapsed) no
// agent brings the endpoint back, and anyone may remove it; the ghost sweep
// removes it by itself, through the state directly, so this check never
// holds it back. Drains are not checked: the owner respects a drain set by
// someone else.

// ownedError refuses the removal of a live node's endpoint by anyone but
// that node.
type ownedError struct {
	id   registry.EndpointID
	node string
}

func (e *ownedError) Error() string {
	return fmt.Sprintf("endpoint %s belongs to live node %q, whose agent registers it again; remove it from that agent's --endpoint/--endpoints-file (the agent drains and removes it), or stop the agent; once the node is gone it can be removed",
		e.id, e.node)
}

// ownerCheck is the WriteCheck of an unregister made for node owner (""
// when the request names none) by a caller authenticated as node identity
// ("" when it is not a node). It validates owner first.
func (r *Registrar) ownerCheck(owner, identity string) (WriteCheck, error) {
	if owner != "" {
		if err := registry.ValidateName("owner_node", owner); err != nil {
			return nil, &registry.FieldError{Field: "owner_node", Reason: err.Error()}
		}
	}
	return func(_, stored *registryv1.ServiceEndpoint) error {
		n, ok := nodeOf(registry.IDOf(stored), stored)
		if !ok || n.Name == owner || n.Name == identity || !r.nodeLiveLocked(n) {
			return nil
		}
		return &ownedError{id: registry.IDOf(stored), node: n.Name}
	}, nil
}

// nodeLiveLocked reports whether the registrar holds a record of node id,
// the same test the ghost sweep applies. r.mu must be held: it is called
// from a WriteCheck, which runs under the lock.
func (r *Registrar) nodeLiveLocked(id registry.NodeID) bool {
	return r.st.HasNode(id)
}

// bothChecks runs a, then b; either may be nil.
func bothChecks(a, b WriteCheck) WriteCheck {
	if a == nil || b == nil {
		if a == nil {
			return b
		}
		return a
	}
	return func(ep, stored *registryv1.ServiceEndpoint) error {
		if err := a(ep, stored); err != nil {
			return err
		}
		return b(ep, stored)
	}
}

// ownedStatus maps an ownership refusal to FAILED_PRECONDITION (the
// request is fine; the endpoint's state forbids it), counting it; ok is
// false for any other error.
func (s *service) ownedStatus(op string, err error) (error, bool) {
	var oe *ownedError
	if !errors.As(err, &oe) {
		return nil, false
	}
	s.r.metrics.rejected.WithLabelValues("owned").Inc()
	return status.Error(codes.FailedPrecondition, fmt.Sprintf("%s: %v", op, oe)), true
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
