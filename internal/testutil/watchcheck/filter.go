package watchcheck

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
)

// never is the effective point of an update the registrar never applied.
const never = math.MaxUint64

// svcSet is a stream's filter: nil means all services.
type svcSet map[string]bool

func (s svcSet) has(svc string) bool { return s == nil || s[svc] }

func (s svcSet) String() string {
	if s == nil {
		return "all"
	}
	return fmt.Sprint(slices.Sorted(maps.Keys(s)))
}

// filterPlan is a stream's filter over the history: sets[0] until the first
// update takes effect, then sets[k+1] for events with a sequence above
// at[k], the point where the registrar applied update k (under its lock, so
// between two sequences). A WatchEndpoints stream has one set and no updates.
type filterPlan struct {
	sets  []svcSet
	at    []uint64
	added [][]string       // services update k actually added: its SERVICES_SNAPSHOT's
	snaps map[int]snapshot // by message index of a SERVICES_SNAPSHOT's first chunk
}

type snapshot struct {
	update int
	seq    uint64
}

// set is the filter in force for the event at seq.
func (p *filterPlan) set(seq uint64) svcSet {
	j := 0
	for j < len(p.at) && p.at[j] < seq {
		j++
	}
	return p.sets[j]
}

// plan works out the stream's filter over time from the updates its client
// sent (see Check, "Subscribe streams"). start is the stream's start
// position: the registrar applies updates only after the start.
func (c *streamCheck) plan(msgs []*registrarv1.EndpointEvent, start uint64) {
	var initial svcSet
	if len(c.r.Services) > 0 {
		initial = svcSet{}
		for _, s := range c.r.Services {
			initial[s] = true
		}
	}
	ups := c.r.Updates()
	p := &filterPlan{sets: []svcSet{initial}, snaps: map[int]snapshot{}}
	c.flt = p
	for _, u := range ups {
		prev := p.sets[len(p.sets)-1]
		var next svcSet // an all-services stream cannot change: the registrar refuses
		var added []string
		if prev != nil {
			next = maps.Clone(prev)
			for _, s := range u.Remove {
				delete(next, s)
			}
			for _, s := range u.Add {
				if !next[s] {
					next[s] = true
					added = append(added, s)
				}
			}
			sort.Strings(added)
		}
		p.sets = append(p.sets, next)
		p.added = append(p.added, added)
		p.at = append(p.at, never)
	}
	// maxBefore is the highest sequence among the first n messages.
	maxBefore := func(n int) uint64 {
		var m uint64
		for _, x := range msgs[:min(n, len(msgs))] {
			m = max(m, x.GetSequence())
		}
		return m
	}

	// Each SERVICES_SNAPSHOT answers the next update that added services,
	// and pins where that update took effect.
	next := 0
	var lastAt uint64
	for i := 0; i < len(msgs); i++ {
		if msgs[i].GetType() != registrarv1.EndpointEvent_SERVICES_SNAPSHOT {
			continue
		}
		first, seq := i, msgs[i].GetSequence()
		var eps []*registryv1.ServiceEndpoint
		complete := false
		for ; i < len(msgs) && msgs[i].GetType() == registrarv1.EndpointEvent_SERVICES_SNAPSHOT; i++ {
			m := msgs[i]
			if m.GetSequence() != seq || !slices.Equal(m.GetServices(), msgs[first].GetServices()) {
				c.bad(Faithful, "services snapshot chunk %d at %d for %v, first chunk at %d for %v", i-first, m.GetSequence(), m.GetServices(), seq, msgs[first].GetServices())
			}
			eps = append(eps, m.GetEndpoints()...)
			if !m.GetSnapshotContinues() {
				complete = true
				break
			}
		}
		if !complete && i < len(msgs) {
			c.bad(Faithful, "services snapshot at %d interrupted by %v", seq, msgs[i].GetType())
		}
		if !complete {
			i-- // look at the interrupting message again
		}
		k := next
		for k < len(ups) && len(p.added[k]) == 0 {
			k++
		}
		if k == len(ups) {
			c.bad(Faithful, "services snapshot at %d for %v that no update asked for", seq, msgs[first].GetServices())
			continue
		}
		for j := next; j < k; j++ {
			if len(p.added[j]) > 0 {
				c.bad(Faithful, "update %d added %v but got no services snapshot, while a later update did", j, p.added[j])
			}
		}
		next = k + 1
		p.snaps[first] = snapshot{update: k, seq: seq}
		p.at[k] = seq
		if ups[k].After > first {
			c.bad(Faithful, "services snapshot at message %d answers update %d, sent only after message %d", first, k, ups[k].After)
		}
		if !slices.Equal(msgs[first].GetServices(), p.added[k]) {
			c.bad(Faithful, "services snapshot at %d is for %v, update %d added %v", seq, msgs[first].GetServices(), k, p.added[k])
		}
		if b := maxBefore(ups[k].After); seq < b || seq < start || seq < lastAt {
			c.bad(Ordered, "services snapshot of update %d at %d, older than what the stream had before (start %d, message at %d, previous update at %d)", k, seq, start, b, lastAt)
		}
		lastAt = max(lastAt, seq)
		if complete {
			c.servicesSnapshot(seq, p.added[k], eps)
		}
	}

	// An update that added nothing shows no marker: it took effect somewhere
	// after the client sent it. Take the earliest point that explains what
	// was delivered: just after the last delivered event of a service it
	// removed. A dropped event before that point is then a gap (reliable),
	// and one after a later update's known point is outside the filter.
	applied := true
	lastAt = start
	for k, u := range ups {
		if p.at[k] != never {
			lastAt = p.at[k]
			continue
		}
		if len(p.added[k]) > 0 || !applied {
			applied = false // unanswered: never applied, nor anything after it
			continue
		}
		upper := uint64(never)
		for j := k + 1; j < len(ups); j++ {
			if p.at[j] != never {
				upper = p.at[j]
				break
			}
		}
		at := max(lastAt, maxBefore(u.After))
		removed := svcSet{}
		for s := range p.sets[k] {
			if !p.sets[k+1][s] {
				removed[s] = true
			}
		}
		if len(removed) > 0 {
			for _, m := range msgs {
				if isChange(m) && removed[m.GetEndpoint().GetService()] && m.GetSequence() > at && m.GetSequence() <= upper {
					at = m.GetSequence()
				}
			}
		}
		p.at[k] = min(at, upper)
		lastAt = p.at[k]
	}
}

// servicesSnapshot checks a SERVICES_SNAPSHOT at seq of services against the
// history.
func (c *streamCheck) servicesSnapshot(seq uint64, services []string, got []*registryv1.ServiceEndpoint) {
	if seq < c.h.Base || seq > c.h.Last() {
		c.bad(Faithful, "services snapshot at %d is outside the history [%d, %d]; cannot check it", seq, c.h.Base, c.h.Last())
		return
	}
	in := svcSet{}
	for _, s := range services {
		in[s] = true
	}
	gs, dups := stateOf(got)
	for _, d := range dups {
		c.bad(Filtered, "services snapshot at %d lists %s twice", seq, d)
	}
	for k, e := range gs {
		if !in[e.GetService()] {
			c.bad(Filtered, "services snapshot at %d of %v has %s", seq, services, k)
			delete(gs, k)
		}
	}
	want := c.h.stateAt(seq)
	for k, e := range want {
		if !in[e.GetService()] {
			delete(want, k)
		}
	}
	for _, d := range diff(want, gs) {
		c.bad(Filtered, "services snapshot at %d of %v: %s", seq, services, d)
	}
	// Taken under the registrar's lock: never inside an atomic write.
	for _, b := range c.h.Batches {
		var before, after bool
		for s := b[0]; s <= b[1]; s++ {
			if ev := c.h.event(s); ev != nil && in[ev.GetEndpoint().GetService()] {
				before = before || s <= seq
				after = after || s > seq
			}
		}
		if before && after {
			c.bad(Atomic, "services snapshot at %d of %v splits batch %v", seq, services, b)
		}
	}
}

func isChange(m *registrarv1.EndpointEvent) bool {
	switch m.GetType() {
	case registrarv1.EndpointEvent_ENDPOINT_ADDED, registrarv1.EndpointEvent_ENDPOINT_UPDATED, registrarv1.EndpointEvent_ENDPOINT_REMOVED:
		return true
	}
	return false
}
