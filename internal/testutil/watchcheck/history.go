package watchcheck

import (
	"fmt"
	"sort"

	"google.golang.org/protobuf/proto"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/registry"
)

// Op is what an acknowledged write did.
type Op int

const (
	// OpRegister is a RegisterEndpoint (or DrainEndpoint) that changed the
	// endpoint: its version names an ADDED or UPDATED event of it.
	OpRegister Op = iota
	// OpUnregister is an UnregisterEndpoint: its version names the
	// endpoint's REMOVED event.
	OpUnregister
)

// Ack is one acknowledged write, as the writer saw it: the endpoint it wrote
// (for OpUnregister only the identity fields matter) and the version the
// response returned. Writes must change something: a no-op register is
// acknowledged with the current version, which names some other event.
type Ack struct {
	Op       Op
	Endpoint *registryv1.ServiceEndpoint
	Version  string
}

// History is the authoritative change sequence of one registrar epoch.
type History struct {
	// Epoch is the registrar incarnation every version must belong to.
	Epoch string
	// Base is the sequence the history starts from, and BaseState the full,
	// unfiltered set of endpoints as of Base (the reference's snapshot).
	Base      uint64
	BaseState []*registryv1.ServiceEndpoint
	// Events are the changes with sequences Base+1, Base+2, ... in order.
	Events []*registrarv1.EndpointEvent
	// Batches are inclusive sequence ranges known to have been applied
	// together (e.g. one etcd transaction). A stream does not show batch
	// boundaries (every event is its own message), so they come from the
	// writers; see BatchOf.
	Batches [][2]uint64
	// Acks are the writers' acknowledged writes.
	Acks []Ack
	// Final, if FinalVersion is set, is the registrar's own listing
	// (ListAllEndpoints) as of FinalVersion.
	Final        []*registryv1.ServiceEndpoint
	FinalVersion string
}

// Last is the sequence of the last event in the history.
func (h *History) Last() uint64 { return h.Base + uint64(len(h.Events)) }

// HistoryFrom builds a history from a fresh, unfiltered reference stream: its
// FULL_SNAPSHOT is the base and its change events the sequence. Problems that
// make the recording unusable as a reference are returned as violations of
// property "reference".
func HistoryFrom(ref *Recorder) (History, []Violation) {
	var h History
	var vs []Violation
	bad := func(format string, args ...any) {
		vs = append(vs, Violation{Stream: ref.Name, Property: Reference, Detail: fmt.Sprintf(format, args...)})
	}
	if len(ref.Services) != 0 || ref.LastVersion != "" {
		bad("the reference stream must be fresh and unfiltered (services %v, last_version %q)", ref.Services, ref.LastVersion)
	}
	msgs := ref.Messages()
	i := 0
	for ; i < len(msgs); i++ {
		m := msgs[i]
		if m.GetType() != registrarv1.EndpointEvent_FULL_SNAPSHOT {
			bad("message %d is %v before the snapshot ended", i, m.GetType())
			return h, vs
		}
		epoch, seq, err := ParseVersion(m.GetVersion())
		if err != nil {
			bad("snapshot: %v", err)
			return h, vs
		}
		if i == 0 {
			h.Epoch, h.Base = epoch, seq
		} else if epoch != h.Epoch || seq != h.Base {
			bad("snapshot chunk %d at %s, first chunk at %s:%d", i, m.GetVersion(), h.Epoch, h.Base)
		}
		h.BaseState = append(h.BaseState, m.GetEndpoints()...)
		if !m.GetSnapshotContinues() {
			i++
			break
		}
	}
	if h.Epoch == "" {
		bad("no snapshot")
		return h, vs
	}
	for ; i < len(msgs); i++ {
		m := msgs[i]
		switch m.GetType() {
		case registrarv1.EndpointEvent_PROGRESS:
			continue
		case registrarv1.EndpointEvent_ENDPOINT_ADDED, registrarv1.EndpointEvent_ENDPOINT_UPDATED, registrarv1.EndpointEvent_ENDPOINT_REMOVED:
			h.Events = append(h.Events, m)
		default:
			bad("message %d: unexpected %v", i, m.GetType())
		}
	}
	return h, vs
}

// BatchOf finds the events of the given endpoints (by identity) after
// sequence after in the history and returns their sequence range, for
// writes known to be atomic, e.g. one etcd transaction. It is an error if an
// endpoint has no event there, or if other events fall inside the range: the
// registrar split the atomic write in its own sequence.
func (h *History) BatchOf(after uint64, eps ...*registryv1.ServiceEndpoint) ([2]uint64, error) {
	want := map[string]bool{}
	for _, e := range eps {
		want[key(e)] = true
	}
	var lo, hi uint64
	n := 0
	for _, ev := range h.Events {
		if ev.GetSequence() <= after || !want[key(ev.GetEndpoint())] {
			continue
		}
		if n == 0 {
			lo = ev.GetSequence()
		}
		hi = ev.GetSequence()
		delete(want, key(ev.GetEndpoint()))
		n++
	}
	switch {
	case n == 0 || len(want) > 0:
		return [2]uint64{}, fmt.Errorf("%d of the %d endpoints have no event after %d", len(want), len(eps), after)
	case hi-lo+1 != uint64(n):
		return [2]uint64{lo, hi}, fmt.Errorf("atomic write of %d endpoints spread over sequences %d..%d with other events between", n, lo, hi)
	}
	return [2]uint64{lo, hi}, nil
}

// Clone copies a recording, under a new name, for deliberate corruption.
func (r *Recorder) Clone(name string) *Recorder {
	c := &Recorder{Name: name, Services: append([]string(nil), r.Services...), LastVersion: r.LastVersion, ExpectResume: r.ExpectResume}
	c.msgs = r.Messages()
	c.updates = r.Updates()
	return c
}

// Without returns a copy of the recording without its i-th message.
func (r *Recorder) Without(i int) *Recorder {
	c := r.Clone(r.Name + "-corrupted")
	c.msgs = append(c.msgs[:i:i], c.msgs[i+1:]...)
	for j := range c.updates {
		if c.updates[j].After > i {
			c.updates[j].After--
		}
	}
	return c
}

func key(e *registryv1.ServiceEndpoint) string {
	id := registry.IDOf(e)
	return fmt.Sprintf("%s/%s/%s/%d/%s", id.Region, id.Cluster, id.Service, id.Protocol, id.IP)
}

// state is a replayed set of endpoints by identity.
type state map[string]*registryv1.ServiceEndpoint

func stateOf(eps []*registryv1.ServiceEndpoint) (state, []string) {
	s := state{}
	var dups []string
	for _, e := range eps {
		k := key(e)
		if _, ok := s[k]; ok {
			dups = append(dups, k)
		}
		s[k] = e
	}
	return s, dups
}

// apply folds one change into s, describing what is inconsistent about it.
func (s state) apply(ev *registrarv1.EndpointEvent) string {
	e := ev.GetEndpoint()
	if e == nil {
		return fmt.Sprintf("%v at %d carries no endpoint", ev.GetType(), ev.GetSequence())
	}
	k := key(e)
	prev, had := s[k]
	var problem string
	switch ev.GetType() {
	case registrarv1.EndpointEvent_ENDPOINT_ADDED:
		if had {
			problem = "ADDED an endpoint already present: " + k
		}
		s[k] = e
	case registrarv1.EndpointEvent_ENDPOINT_UPDATED:
		if !had {
			problem = "UPDATED an absent endpoint: " + k
		} else if proto.Equal(prev, e) {
			problem = "UPDATED to an identical value: " + k
		}
		s[k] = e
	case registrarv1.EndpointEvent_ENDPOINT_REMOVED:
		if !had {
			problem = "REMOVED an absent endpoint: " + k
		}
		delete(s, k)
	default:
		problem = fmt.Sprintf("not a change: %v", ev.GetType())
	}
	return problem
}

// stateAt replays the history up to and including sequence seq
// (Base <= seq <= Last).
func (h *History) stateAt(seq uint64) state {
	s, _ := stateOf(h.BaseState)
	for _, ev := range h.Events {
		if ev.GetSequence() > seq {
			break
		}
		s.apply(ev)
	}
	return s
}

// event returns the history's event at sequence seq, if any.
func (h *History) event(seq uint64) *registrarv1.EndpointEvent {
	if seq <= h.Base || seq > h.Last() {
		return nil
	}
	return h.Events[seq-h.Base-1]
}

// Validate cross-checks the history instead of trusting it: versions are of
// the history's epoch and match their sequence; sequences start at Base+1,
// strictly increase and have no gaps; every change replays consistently
// (no ADDED of a present endpoint, no UPDATED or REMOVED of an absent one);
// batches are well-formed; every ack names an event of its endpoint of the
// right kind; and the replayed state as of FinalVersion equals Final.
// Violations have property "reference".
func (h *History) Validate() []Violation {
	var vs []Violation
	bad := func(format string, args ...any) {
		vs = append(vs, Violation{Stream: "reference", Property: Reference, Detail: fmt.Sprintf(format, args...)})
	}
	s, dups := stateOf(h.BaseState)
	for _, d := range dups {
		bad("base snapshot lists %s twice", d)
	}
	for i, ev := range h.Events {
		want := h.Base + uint64(i) + 1
		if ev.GetSequence() != want {
			bad("event %d has sequence %d, want %d (gap, duplicate or reorder)", i, ev.GetSequence(), want)
			return vs // positions are meaningless from here on
		}
		if v := fmt.Sprintf("%s:%d", h.Epoch, want); ev.GetVersion() != v {
			bad("event at %d has version %q, want %q", want, ev.GetVersion(), v)
		}
		if p := s.apply(ev); p != "" {
			bad("at %d: %s", want, p)
		}
	}
	for _, b := range h.Batches {
		if b[0] > b[1] || b[0] <= h.Base || b[1] > h.Last() {
			bad("batch %v is not a range of the history (%d, %d]", b, h.Base, h.Last())
		}
	}
	for _, a := range h.Acks {
		epoch, seq, err := ParseVersion(a.Version)
		if err != nil || epoch != h.Epoch {
			bad("ack of %s has version %q, not of epoch %s (%v)", key(a.Endpoint), a.Version, h.Epoch, err)
			continue
		}
		ev := h.event(seq)
		if ev == nil {
			bad("ack of %s at %d is outside the history (%d, %d]", key(a.Endpoint), seq, h.Base, h.Last())
			continue
		}
		if key(ev.GetEndpoint()) != key(a.Endpoint) {
			bad("ack of %s at %d, but the event there is of %s", key(a.Endpoint), seq, key(ev.GetEndpoint()))
			continue
		}
		removed := ev.GetType() == registrarv1.EndpointEvent_ENDPOINT_REMOVED
		if removed != (a.Op == OpUnregister) {
			bad("ack of %s at %d is op %d, but the event there is %v", key(a.Endpoint), seq, a.Op, ev.GetType())
		}
	}
	if h.FinalVersion != "" {
		epoch, seq, err := ParseVersion(h.FinalVersion)
		switch {
		case err != nil || epoch != h.Epoch:
			bad("final listing at %q, not of epoch %s (%v)", h.FinalVersion, h.Epoch, err)
		case seq < h.Base || seq > h.Last():
			bad("final listing at %d, outside the history [%d, %d]", seq, h.Base, h.Last())
		default:
			want := h.stateAt(seq)
			got, dups := stateOf(h.Final)
			for _, d := range dups {
				bad("final listing has %s twice", d)
			}
			for _, d := range diff(want, got) {
				bad("final listing at %d: %s", seq, d)
			}
		}
	}
	return vs
}

// diff describes how got differs from want, values compared exactly.
func diff(want, got state) []string { return diffBy(want, got, eqProto) }

func eqProto(a, b *registryv1.ServiceEndpoint) bool { return proto.Equal(a, b) }

// diffBy describes how got differs from want, values compared by eq.
func diffBy(want, got state, eq func(a, b *registryv1.ServiceEndpoint) bool) []string {
	var out []string
	for k, w := range want {
		g, ok := got[k]
		switch {
		case !ok:
			out = append(out, "missing "+k)
		case !eq(w, g):
			out = append(out, "different value of "+k)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			out = append(out, "unexpected "+k)
		}
	}
	sort.Strings(out)
	return out
}
