package core

import registrarv1 "github.com/aethermesh/aether/api/registrar/v1"

// Effects is what an operation on the State asks of the shell. The State
// does no I/O, so anything that must happen outside it (watchers told,
// the flusher or the ghost sweep woken) is handed back here, and the shell
// acts on it in one place. Events must be published under the same lock
// as the operation that made them: that is what keeps every stream's
// events in sequence order with the snapshot it started from.
type Effects struct {
	// Events are the snapshot's changes, in sequence order, for watchers.
	Events []*registrarv1.EndpointEvent
	// Flush asks for the flusher to be woken: the queue stopped being
	// empty, or holds a batch's worth. In between, a wake-up would only
	// re-arm the timer it already runs.
	Flush bool
	// Sweep asks for the ghost sweep: a node record went away, so its
	// endpoints may have become ghosts.
	Sweep bool
	// Peer are the local writes just acknowledged, for peer-watch to
	// stream to the other replicas (in acknowledgement order).
	Peer []PeerWrite
	// PeerApplied counts peer writes applied; Echoes counts backend
	// reports recognised as the echo of a peer write (metrics).
	PeerApplied, Echoes int
}

// Add merges o into e, keeping the events in order.
func (e *Effects) Add(o Effects) {
	e.Events = append(e.Events, o.Events...)
	e.Flush = e.Flush || o.Flush
	e.Sweep = e.Sweep || o.Sweep
	e.Peer = append(e.Peer, o.Peer...)
	e.PeerApplied += o.PeerApplied
	e.Echoes += o.Echoes
}

// event is Effects of one event (nil: none).
func event(ev *registrarv1.EndpointEvent) Effects {
	if ev == nil {
		return Effects{}
	}
	return Effects{Events: []*registrarv1.EndpointEvent{ev}}
}
