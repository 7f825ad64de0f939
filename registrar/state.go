package registrar

import (
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/registrar/internal/core"
	"github.com/aethermesh/aether/registry"
)

// The registrar's state machine is package core: the snapshot, the event
// sequence and its history, the write queue and the reconciliation of
// local writes with what the backend reports. It does no I/O, so each of
// its operations returns what the shell must do about it (core.Effects),
// and the shell does it in one place, act.

// Errors the state machine returns; the gRPC layer maps them to codes.
var (
	errNotFound  = core.ErrNotFound
	errQueueFull = core.ErrQueueFull
)

// nodeFullError refuses a registration that would give a node more than
// --max-endpoints-per-node endpoints.
type nodeFullError = core.NodeFullError

// listingScope is the services a listing's application must reconcile;
// nil for all of them.
type listingScope = core.Scope

// act carries out what a state transition asks: its events go to the
// watchers, and the flusher and the ghost sweep are woken if it says so.
// r.mu must be held, the same hold as the transition's: publishing under
// that lock is what keeps every stream's events in sequence order with
// the snapshot or resume point it started from. The wake-ups never block.
func (r *Registrar) act(eff core.Effects) {
	if len(eff.Events) > 0 {
		r.hub.publish(eff.Events)
	}
	if eff.Flush {
		select {
		case r.kick <- struct{}{}:
		default:
		}
	}
	if eff.Sweep {
		r.kickSweep()
	}
	r.actPeer(eff) // peer.go
}

// nodeOf is the node an endpoint belongs to; ok is false for an endpoint
// without a node.
func nodeOf(id registry.EndpointID, ep *registryv1.ServiceEndpoint) (registry.NodeID, bool) {
	return core.NodeOf(id, ep)
}
