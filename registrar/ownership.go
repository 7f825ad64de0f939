package registrar

import (
	"fmt"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
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

func (e *ownedError) Is(target error) bool { return target == ErrOwned }

func (e *ownedError) Error() string {
	return fmt.Sprintf("endpoint %s belongs to live node %q, whose agent registers it again; remove it from that agent's --endpoint/--endpoints-file (the agent drains and removes it), or stop the agent; once the node is gone it can be removed",
		e.id, e.node)
}

// OwnerCheck is the WriteCheck of an unregister made for node owner (""
// when the request names none) by a caller authenticated as node identity
// ("" when it is not a node): it refuses, with ErrOwned, the removal of a
// live node's endpoint for anyone else. It validates owner first
// (*registry.FieldError, field "owner_node").
func (r *Registrar) OwnerCheck(owner, identity string) (WriteCheck, error) {
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
