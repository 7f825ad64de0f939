package core

import (
	"sort"
	"time"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/registry"
)

// What the shell may ask of the State, so that it never reads the State's
// fields: the State keeps its invariants only if every change goes
// through its operations.

// Node is the node record the State holds under id (nil: none).
func (s *State) Node(id registry.NodeID) *registryv1.Node { return s.nodes[id] }

// HasNode reports whether the State holds a record of node id: the test
// the ghost sweep applies.
func (s *State) HasNode(id registry.NodeID) bool {
	_, ok := s.nodes[id]
	return ok
}

// Nodes are the node records held, in no order. They are shared and
// immutable.
func (s *State) Nodes() []*registryv1.Node {
	out := make([]*registryv1.Node, 0, len(s.nodes))
	for _, n := range s.nodes {
		out = append(out, n)
	}
	return out
}

// HeldCount is how many of a node's endpoints the State holds, and how
// many of those serve.
type HeldCount struct{ Held, Serving uint32 }

// Held counts the endpoints of every node with a record, from the
// per-node counters, as one consistent snapshot.
func (s *State) Held() map[registry.NodeID]HeldCount {
	out := make(map[registry.NodeID]HeldCount, len(s.nodes))
	for n := range s.nodes {
		if held := s.byNode[n]; held > 0 {
			out[n] = HeldCount{Held: uint32(held), Serving: uint32(s.byNodeServing[n])}
		}
	}
	return out
}

// ClusterCounts are the snapshot's endpoints per cluster (a copy).
func (s *State) ClusterCounts() map[string]int {
	out := make(map[string]int, len(s.byCount))
	for k, v := range s.byCount {
		out[k] = v
	}
	return out
}

// BackendRevision is the backend revision the snapshot reflects.
func (s *State) BackendRevision() int64 { return s.backendRv }

// Depth counts endpoints with acknowledged, unpersisted writes.
func (s *State) Depth() int { return s.queue.depth() }

// Pending counts writes waiting for the flusher (not in flight, not
// isolated).
func (s *State) Pending() int { return len(s.queue.pending) }

// NextRetry is when the first isolated write is due to be offered to the
// backend again (zero when none is isolated).
func (s *State) NextRetry() time.Time { return s.queue.nextRetry() }

// Oldest is when the oldest unpersisted write was acknowledged (zero when
// none is).
func (s *State) Oldest() time.Time { return s.queue.oldest() }

// Isolated is a write the backend refused permanently.
type Isolated struct {
	ID     registry.EndpointID
	Key    string
	Reason string
	Since  time.Time
}

// IsolatedWrites are the writes the backend refused permanently, by key.
func (s *State) IsolatedWrites() []Isolated {
	var out []Isolated
	for id, w := range s.queue.isolated {
		k, _ := id.Key()
		out = append(out, Isolated{ID: id, Key: k, Reason: w.reason, Since: w.since})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// Refused reports, for the write of id stamped stamp, whether the write
// the queue isolated for id is that one or a newer one, and why the
// backend refused it.
func (s *State) Refused(id registry.EndpointID, stamp *registryv1.WriteStamp) (reason string, ok bool) {
	iw, ok := s.queue.isolated[id]
	if !ok || registry.CompareStamps(iw.w.stamp, stamp) < 0 {
		return "", false
	}
	return iw.reason, true
}

// Unsettled reports whether the queue still holds a write of id at or
// after stamp: until then the write stamped so is not persisted.
func (s *State) Unsettled(id registry.EndpointID, stamp *registryv1.WriteStamp) bool {
	q := &s.queue
	after := func(w queued, ok bool) bool { return ok && registry.CompareStamps(w.stamp, stamp) >= 0 }
	w, ok := q.pending[id]
	if after(w, ok) {
		return true
	}
	w, ok = q.inflight[id]
	if after(w, ok) {
		return true
	}
	iw, ok := q.isolated[id]
	return after(iw.w, ok)
}

// Services are the snapshot's services, in no order.
func (s *State) Services() []string {
	out := make([]string, 0, len(s.endpoints))
	for svc := range s.endpoints {
		out = append(out, svc)
	}
	return out
}

// ServiceSize counts a service's endpoints.
func (s *State) ServiceSize(svc string) int { return len(s.endpoints[svc]) }
