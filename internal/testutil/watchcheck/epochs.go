package watchcheck

import (
	"fmt"
	"sort"
	"strings"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
)

// Durable: a restarted registrar's new epoch starts from exactly the state
// its predecessor ended in: no acknowledged write lost, no removed endpoint
// back, no stale value.
const Durable Property = "durable"

// Epoch is one incarnation of a registrar: its history (from a reference
// stream opened on it before anything else changed) and the streams opened
// against it, including those that resumed with a token of an earlier
// incarnation.
type Epoch struct {
	History History
	Streams []*Recorder
}

// CheckEpochs is Check for a registrar that restarted (on the same backend)
// one or more times: epochs are its incarnations, oldest first. Each epoch's
// history and streams are checked as by Check, with these additions:
//
//   - faithful: no two incarnations share an epoch (a token of one would
//     resume in the other).
//   - resumable: as in Check, a stream opened with a token of an earlier
//     epoch must start with a FULL_SNAPSHOT of its own epoch, never resume;
//     and a stream whose messages carry an earlier epoch's versions is a
//     faithful violation.
//   - durable: each incarnation's history starts (BaseState) from exactly
//     the state its predecessor ended in: the predecessor's history replayed
//     to its end.
//
// A registrar ends its streams when it shuts down and then answers the writes
// still in flight, and each stream ends at its own point: the reference may
// miss the last events, which other streams saw. So the acks of an
// incarnation (but the last) beyond its history are taken as its last
// events, in sequence order: they must continue the history without a gap,
// and a register's ack must carry the endpoint as the registrar returned it.
// An event another stream got beyond that is not in the history (faithful):
// keep other writers, whose changes have no ack, quiet while a registrar
// shuts down.
//
// The backend must not change between incarnations other than through them
// (e.g. by another writer while the registrar is down), and each reference
// must be opened before anything changes in its incarnation: the durable
// check compares the last state of one with the first of the next.
func CheckEpochs(epochs ...Epoch) []Violation {
	var vs []Violation
	seen := map[string]int{}
	for i, e := range epochs {
		h := e.History
		if j, ok := seen[h.Epoch]; ok {
			vs = append(vs, Violation{Stream: fmt.Sprintf("incarnation %d", i), Property: Faithful,
				Detail: fmt.Sprintf("reuses the epoch %q of incarnation %d", h.Epoch, j)})
		}
		seen[h.Epoch] = i
		name := ""
		if i < len(epochs)-1 {
			name = fmt.Sprintf("restart %s→%s", h.Epoch, epochs[i+1].History.Epoch)
			// The late acks are the incarnation's last events: other
			// streams, which end at their own points, may have seen them.
			var problems []string
			if h, problems = extendLate(h); problems != nil {
				for _, p := range problems {
					vs = append(vs, Violation{Stream: name, Property: Reference, Detail: p})
				}
				vs = append(vs, Check(h, e.Streams...)...)
				continue
			}
		}
		vs = append(vs, Check(h, e.Streams...)...)
		if name == "" {
			break
		}
		next := epochs[i+1].History
		end := h.stateAt(h.Last())
		got, _ := stateOf(next.BaseState) // duplicates: next's Validate reports them
		for _, d := range diff(end, got) {
			vs = append(vs, Violation{Stream: name, Property: Durable,
				Detail: fmt.Sprintf("the new epoch starts at %d with a state unlike the old one's end at %d: %s", next.Base, h.Last(), durableWhat(d))})
		}
	}
	return vs
}

// extendLate returns h with its late acks, those beyond its last event,
// appended as events. They must continue h without a gap (anything else
// that changed in between is unknown): a register is the endpoint as the
// registrar returned it, an unregister removes the last value. If they do
// not, h is returned without them and the problems are described.
func extendLate(h History) (History, []string) {
	var in, late []Ack
	for _, a := range h.Acks {
		if epoch, seq, err := ParseVersion(a.Version); err == nil && epoch == h.Epoch && seq > h.Last() {
			late = append(late, a)
		} else {
			in = append(in, a)
		}
	}
	if len(late) == 0 {
		return h, nil
	}
	sort.Slice(late, func(i, j int) bool { return seqOf(late[i]) < seqOf(late[j]) })
	s := h.stateAt(h.Last())
	var evs []*registrarv1.EndpointEvent
	for i, a := range late {
		seq := h.Last() + uint64(i) + 1
		if got := seqOf(a); got != seq {
			h.Acks = in
			return h, []string{fmt.Sprintf("acks after the reference ended do not continue it: %s at %d, want %d; the old epoch's end is unknown", key(a.Endpoint), got, seq)}
		}
		k := key(a.Endpoint)
		ev := &registrarv1.EndpointEvent{Sequence: seq, Version: fmt.Sprintf("%s:%d", h.Epoch, seq), Endpoint: a.Endpoint}
		prev, had := s[k]
		switch {
		case a.Op == OpUnregister && !had:
			h.Acks = in
			return h, []string{fmt.Sprintf("late ack at %d unregisters %s, which was not there", seq, k)}
		case a.Op == OpUnregister:
			ev.Type, ev.Endpoint = registrarv1.EndpointEvent_ENDPOINT_REMOVED, prev
			delete(s, k)
		case had:
			ev.Type = registrarv1.EndpointEvent_ENDPOINT_UPDATED
			s[k] = a.Endpoint
		default:
			ev.Type = registrarv1.EndpointEvent_ENDPOINT_ADDED
			s[k] = a.Endpoint
		}
		evs = append(evs, ev)
	}
	h.Events = append(append([]*registrarv1.EndpointEvent(nil), h.Events...), evs...)
	return h, nil
}

func seqOf(a Ack) uint64 {
	_, seq, _ := ParseVersion(a.Version)
	return seq
}

// durableWhat names what a difference between the end and the new start
// means.
func durableWhat(d string) string {
	if k, ok := strings.CutPrefix(d, "missing "); ok {
		return "lost " + k
	}
	if k, ok := strings.CutPrefix(d, "unexpected "); ok {
		return "resurrected or invented " + k
	}
	return d
}
