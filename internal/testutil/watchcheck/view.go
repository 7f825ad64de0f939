package watchcheck

import (
	"fmt"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/registry"
)

// Properties of a view (see CheckView).
const (
	// Consistent: the view's changes replay: no ADDED of an endpoint it
	// holds, no UPDATED or REMOVED of one it does not, every UPDATED changes
	// something, and REMOVED and UPDATED's Previous name the value held.
	Consistent Property = "consistent"
	// Monotonic: each endpoint takes, in the view, values the history gave
	// it, in the history's order: nothing invented, nothing stale after
	// something newer, no flapping.
	Monotonic Property = "monotonic"
	// Converged: the view ends equal to its own listing and to the
	// history's last state.
	Converged Property = "converged"
)

// ViewChange is one change of a view derived from registrar streams, such as
// the client library's cache (its OnChange) or another region's registrar
// fed by the replicator.
type ViewChange struct {
	// Type is ENDPOINT_ADDED, ENDPOINT_UPDATED or ENDPOINT_REMOVED.
	Type registrarv1.EndpointEvent_EventType
	// Endpoint is the new value; for REMOVED the last one.
	Endpoint *registryv1.ServiceEndpoint
	// Previous is, for UPDATED, the value replaced; nil skips that check.
	Previous *registryv1.ServiceEndpoint
}

// View is what a consumer derived from the registrar: every change it
// reported, in order, starting from nothing, and its listing at the end.
type View struct {
	Name string
	// Services the view holds; empty means all.
	Services []string
	Changes  []ViewChange
	Final    []*registryv1.ServiceEndpoint
}

// CheckView checks a view that followed a registrar across reconnects,
// resumes and restarts against the histories of the incarnations it
// followed, oldest first (validate them with Check or CheckEpochs; the
// first must start before the view's first change). A view does not show
// sequences, and it may skip intermediate values (a snapshot after a
// reconnect replaces what it missed), so it is judged per endpoint.
// Values are compared by attributes (registry.SameAttributes): a view may
// show its own optimistic writes before the registrar stamps them.
//
//   - consistent, and filtered (no change of a service outside Services);
//   - monotonic: per endpoint, the sequence of values the view took
//     (absence included) is a subsequence of the values the histories gave
//     it, absence included, the histories joined in order;
//   - converged: the view replayed equals Final and the last history's last
//     state, both restricted to Services.
func CheckView(hs []History, v View) []Violation {
	var vs []Violation
	bad := func(p Property, format string, args ...any) {
		vs = append(vs, Violation{Stream: v.Name, Property: p, Detail: fmt.Sprintf(format, args...)})
	}
	if len(hs) == 0 {
		bad(Reference, "no history to judge the view by")
		return vs
	}
	in := svcSet(nil)
	if len(v.Services) > 0 {
		in = svcSet{}
		for _, s := range v.Services {
			in[s] = true
		}
	}

	// Each endpoint's values across the histories; nil is absence.
	tl := map[string][]*registryv1.ServiceEndpoint{}
	cur, _ := stateOf(hs[0].BaseState)
	for k, e := range cur {
		tl[k] = []*registryv1.ServiceEndpoint{e}
	}
	move := func(k string, e *registryv1.ServiceEndpoint) {
		if _, ok := tl[k]; !ok {
			tl[k] = []*registryv1.ServiceEndpoint{nil}
		}
		tl[k] = append(tl[k], e)
		if e == nil {
			delete(cur, k)
		} else {
			cur[k] = e
		}
	}
	for i, h := range hs {
		if i > 0 {
			next, _ := stateOf(h.BaseState)
			for k, e := range next {
				if c, ok := cur[k]; !ok || !registry.SameAttributes(c, e) {
					move(k, e)
				}
			}
			for k := range cur {
				if _, ok := next[k]; !ok {
					move(k, nil)
				}
			}
		}
		for _, ev := range h.Events {
			k := key(ev.GetEndpoint())
			if ev.GetType() == registrarv1.EndpointEvent_ENDPOINT_REMOVED {
				move(k, nil)
			} else {
				move(k, ev.GetEndpoint())
			}
		}
	}

	held := state{}
	pos := map[string]int{} // index in tl of the value the view holds; -1 before any
	same := func(a, b *registryv1.ServiceEndpoint) bool {
		return (a == nil) == (b == nil) && (a == nil || registry.SameAttributes(a, b))
	}
	for i, ch := range v.Changes {
		e := ch.Endpoint
		if e == nil {
			bad(Consistent, "change %d (%v) carries no endpoint", i, ch.Type)
			continue
		}
		k := key(e)
		if !in.has(e.GetService()) {
			bad(Filtered, "change %d: %v of %s, outside the services %v", i, ch.Type, k, v.Services)
		}
		prev, had := held[k]
		var now *registryv1.ServiceEndpoint
		switch ch.Type {
		case registrarv1.EndpointEvent_ENDPOINT_ADDED:
			if had {
				bad(Consistent, "change %d: ADDED %s, which the view holds", i, k)
			}
			now = e
		case registrarv1.EndpointEvent_ENDPOINT_UPDATED:
			switch {
			case !had:
				bad(Consistent, "change %d: UPDATED %s, which the view does not hold", i, k)
			case registry.SameAttributes(prev, e):
				bad(Consistent, "change %d: UPDATED %s to the value it had", i, k)
			case ch.Previous != nil && !registry.SameAttributes(prev, ch.Previous):
				bad(Consistent, "change %d: UPDATED %s from a value the view did not hold", i, k)
			}
			now = e
		case registrarv1.EndpointEvent_ENDPOINT_REMOVED:
			switch {
			case !had:
				bad(Consistent, "change %d: REMOVED %s, which the view does not hold", i, k)
			case !registry.SameAttributes(prev, e):
				bad(Consistent, "change %d: REMOVED %s with a value the view did not hold", i, k)
			}
		default:
			bad(Consistent, "change %d: %v is not a change", i, ch.Type)
			continue
		}
		if now == nil {
			delete(held, k)
		} else {
			held[k] = now
		}
		p, seen := pos[k]
		if !seen {
			p = -1
		}
		vals := tl[k]
		j := p + 1
		for j < len(vals) && !same(vals[j], now) {
			j++
		}
		if j == len(vals) {
			what := "absent"
			if now != nil {
				what = "a value"
			}
			if len(vals) == 0 {
				bad(Monotonic, "change %d: %v of %s, which no history has", i, ch.Type, k)
			} else {
				bad(Monotonic, "change %d: %v makes %s %s that the history does not give it after its value %d of %d (stale, invented or flapping)", i, ch.Type, k, what, p+1, len(vals))
			}
			continue
		}
		pos[k] = j
	}

	final, dups := stateOf(v.Final)
	for _, d := range dups {
		bad(Converged, "final listing has %s twice", d)
	}
	for k, e := range final {
		if !in.has(e.GetService()) {
			delete(final, k)
		}
	}
	last := hs[len(hs)-1]
	want := last.stateAt(last.Last())
	for k, e := range want {
		if !in.has(e.GetService()) {
			delete(want, k)
		}
	}
	for _, d := range sameDiff(held, final) {
		bad(Converged, "the view's changes end unlike its listing: %s", d)
	}
	for _, d := range sameDiff(want, held) {
		bad(Converged, "the view ends unlike the history's last state at %d: %s", last.Last(), d)
	}
	return vs
}

// sameDiff is diff by attributes.
func sameDiff(want, got state) []string { return diffBy(want, got, registry.SameAttributes) }
