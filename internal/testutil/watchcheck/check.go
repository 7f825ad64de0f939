package watchcheck

import (
	"fmt"
	"sort"
	"strings"

	"google.golang.org/protobuf/proto"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/registry"
)

// Property names a watch guarantee.
type Property string

const (
	// Ordered: change events arrive in strictly increasing sequence, and
	// bookmarks never go backwards.
	Ordered Property = "ordered"
	// Unique: no event arrives twice, and none that the stream's snapshot
	// already reflects.
	Unique Property = "unique"
	// Reliable: between the stream's start and its last change event,
	// every matching event of the history was delivered.
	Reliable Property = "reliable"
	// Atomic: a batch is never split (see Check).
	Atomic Property = "atomic"
	// Resumable: a resume delivers exactly the missed matching events,
	// then PROGRESS.
	Resumable Property = "resumable"
	// Bookmarkable: a PROGRESS at s follows every matching event <= s.
	Bookmarkable Property = "bookmarkable"
	// Filtered: no event or snapshot entry outside the filter, and a
	// snapshot is exactly the filtered state as of its sequence.
	Filtered Property = "filtered"
	// Faithful: every message is well-formed and of this epoch, and every
	// change event is the history's event at its sequence.
	Faithful Property = "faithful"
	// Reference: the history itself is inconsistent (see History.Validate).
	Reference Property = "reference"
)

// Violation is one broken guarantee on one stream.
type Violation struct {
	Stream   string
	Property Property
	Detail   string
}

func (v Violation) String() string { return fmt.Sprintf("%s: %s: %s", v.Stream, v.Property, v.Detail) }

// Check validates h (History.Validate) and then every stream against it.
//
// For each stream, with filter F (empty = all services) and start position
// pos (the sequence of its FULL_SNAPSHOT, or of the PROGRESS that ends a
// resume), "matching events" are the history's change events of services in
// F:
//
//   - faithful: every version is "<h.Epoch>:<sequence>"; every change event
//     equals (type and endpoint) the history's event at its sequence; a fresh
//     stream starts with a complete FULL_SNAPSHOT whose chunks share one
//     version; no snapshot arrives after the start.
//   - filtered: no change event or snapshot entry is of a service outside F;
//     the snapshot at S equals the history replayed to S restricted to F.
//   - unique: no sequence is delivered twice, and no change event with
//     sequence <= pos follows a snapshot.
//   - ordered: each change event's sequence exceeds every change sequence
//     delivered before it; a PROGRESS never has a lower sequence than a
//     change or PROGRESS delivered before it.
//   - reliable: every matching event in (pos, m] was delivered, where m is
//     the highest delivered change sequence.
//   - bookmarkable: at each PROGRESS with sequence s, every matching event
//     in (pos, s] was delivered before it; a change event <= s after it is
//     also a violation.
//   - resumable: a stream opened with a token of h.Epoch that does not start
//     with a snapshot delivers, before its first PROGRESS at P, exactly the
//     matching events in (token, P] in order (nothing <= token); a snapshot
//     instead is a violation only if the recorder says ExpectResume; a
//     resume from a token of another epoch is a violation.
//   - atomic, for each batch [lo, hi] of h with matching events M: the
//     stream's start pos does not fall inside it with events of M on both
//     sides; if it delivered two events of M it delivered every event of M
//     between them; and no other message (another change or a PROGRESS)
//     arrives between the first and last delivered events of M. A stream
//     that ends (e.g. eviction) midway through a batch does not break
//     atomicity: its client resumes from the last event it got.
//
// Subscribe streams (see Subscribe and RecordUpdate) change their filter
// while they live. The registrar applies an update under its lock, between
// two sequences: events after that point are filtered by the new set. An
// update that adds services is answered by a SERVICES_SNAPSHOT of exactly
// the services it added, at the point it took effect; an update that only
// removes shows no marker, so its point is taken as the earliest one that
// explains what was delivered (after the last delivered event of a removed
// service, and not before what the client had received when it sent the
// update). "Matching" above then means matching the filter in force at the
// event's sequence, and in addition:
//
//   - faithful: every SERVICES_SNAPSHOT answers, in order, an update sent
//     before it that added exactly its services; an update that added
//     services is not skipped while a later one is answered.
//   - filtered: a SERVICES_SNAPSHOT at S is exactly the history replayed to
//     S restricted to its services.
//   - ordered: a SERVICES_SNAPSHOT at S follows no change above S, is not
//     older than what the client had when it sent the update, nor than an
//     earlier update's; no change at or below S follows it (unique if its
//     service is one the snapshot reflected).
//   - resumable: no SERVICES_SNAPSHOT inside a resume (before its bookmark).
//   - atomic: a SERVICES_SNAPSHOT does not split a batch's events of its
//     services.
//
// Stream endings (errors) are not judged; tests assert those themselves.
func Check(h History, streams ...*Recorder) []Violation {
	vs := h.Validate()
	for _, r := range streams {
		vs = append(vs, checkStream(&h, r)...)
	}
	return vs
}

type streamCheck struct {
	h     *History
	r     *Recorder
	flt   *filterPlan // the stream's filter over time
	vs    []Violation
	pos   uint64 // start position once known
	start bool   // the start (snapshot or resume) is complete
}

func (c *streamCheck) bad(p Property, format string, args ...any) {
	c.vs = append(c.vs, Violation{Stream: c.r.Name, Property: p, Detail: fmt.Sprintf(format, args...)})
}

// matchesAt reports whether the stream's filter in force for the event at
// seq takes svc.
func (c *streamCheck) matchesAt(svc string, seq uint64) bool { return c.flt.set(seq).has(svc) }

// matching lists the history's matching sequences in (lo, hi].
func (c *streamCheck) matching(lo, hi uint64) []uint64 {
	var out []uint64
	for _, ev := range c.h.Events {
		if s := ev.GetSequence(); s > lo && s <= hi && c.matchesAt(ev.GetEndpoint().GetService(), s) {
			out = append(out, s)
		}
	}
	return out
}

func checkStream(h *History, r *Recorder) []Violation {
	c := &streamCheck{h: h, r: r}
	msgs := r.Messages()
	if len(msgs) == 0 {
		return nil
	}
	for i, m := range msgs {
		if want := (registry.Position{Epoch: h.Epoch, Seq: m.GetSequence()}).String(); m.GetVersion() != want {
			c.bad(Faithful, "message %d (%v) has version %q, want %q", i, m.GetType(), m.GetVersion(), want)
		}
		// The epoch field is what a client compares instead of parsing the
		// token, so it must name the same incarnation. A registrar that
		// predates it sends none.
		if e := m.GetEpoch(); e != "" && e != h.Epoch {
			c.bad(Faithful, "message %d (%v) names epoch %q, its stream is in %q", i, m.GetType(), e, h.Epoch)
		}
	}
	var rest []*registrarv1.EndpointEvent
	var resumedFrom uint64
	resuming := false
	if msgs[0].GetType() == registrarv1.EndpointEvent_FULL_SNAPSHOT {
		if r.ExpectResume {
			c.bad(Resumable, "resume from %q inside the window got a FULL_SNAPSHOT", r.LastVersion)
		}
		c.plan(msgs, msgs[0].GetSequence())
		n, ok := c.snapshot(msgs)
		if !ok {
			return c.vs
		}
		rest = msgs[n:]
	} else {
		if r.LastVersion == "" {
			c.bad(Faithful, "fresh stream starts with %v, not FULL_SNAPSHOT", msgs[0].GetType())
			return c.vs
		}
		epoch, seq, err := ParseVersion(r.LastVersion)
		if err != nil || epoch != h.Epoch {
			c.bad(Resumable, "resumed from token %q of another epoch (or malformed) instead of sending a snapshot", r.LastVersion)
			return c.vs
		}
		resumedFrom, resuming, c.pos, rest = seq, true, seq, msgs
		start := seq
		for _, m := range msgs {
			if m.GetType() == registrarv1.EndpointEvent_PROGRESS {
				start = max(start, m.GetSequence())
				break
			}
		}
		c.plan(msgs, start)
	}
	c.follow(rest, len(msgs)-len(rest), resuming, resumedFrom)
	return c.vs
}

// snapshot checks the FULL_SNAPSHOT chunks at the head of msgs and returns
// how many messages they took; ok is false if it is incomplete or cannot be
// checked.
func (c *streamCheck) snapshot(msgs []*registrarv1.EndpointEvent) (n int, ok bool) {
	seq := msgs[0].GetSequence()
	var got []*registryv1.ServiceEndpoint
	complete := false
	for n < len(msgs) && msgs[n].GetType() == registrarv1.EndpointEvent_FULL_SNAPSHOT {
		m := msgs[n]
		n++
		if m.GetSequence() != seq {
			c.bad(Faithful, "snapshot chunk %d at %d, first chunk at %d", n-1, m.GetSequence(), seq)
		}
		got = append(got, m.GetEndpoints()...)
		if !m.GetSnapshotContinues() {
			complete = true
			break
		}
	}
	if !complete {
		if n < len(msgs) {
			c.bad(Faithful, "snapshot interrupted by %v", msgs[n].GetType())
		}
		return n, false
	}
	if seq < c.h.Base || seq > c.h.Last() {
		c.bad(Faithful, "snapshot at %d is outside the history [%d, %d]; cannot check it", seq, c.h.Base, c.h.Last())
		return n, false
	}
	gs, dups := stateOf(got)
	for _, d := range dups {
		c.bad(Filtered, "snapshot at %d lists %s twice", seq, d)
	}
	initial := c.flt.sets[0]
	for k, e := range gs {
		if !initial.has(e.GetService()) {
			c.bad(Filtered, "snapshot at %d has %s outside the filter %v", seq, k, c.r.Services)
			delete(gs, k)
		}
	}
	want := c.h.stateAt(seq)
	for k, e := range want {
		if !initial.has(e.GetService()) {
			delete(want, k)
		}
	}
	for _, d := range diff(want, gs) {
		c.bad(Filtered, "snapshot at %d: %s", seq, d)
	}
	c.pos, c.start = seq, true
	return n, true
}

// follow checks the messages after a snapshot, or all of a resumed stream's;
// msgs[0] is the recording's message off.
func (c *streamCheck) follow(msgs []*registrarv1.EndpointEvent, off int, resuming bool, token uint64) {
	delivered := map[uint64]int{} // sequence -> message index
	var missed []uint64           // sequences delivered during the resume
	var maxChange, maxAny, lastBookmark uint64
	maxChange, maxAny = c.pos, c.pos
	// The last SERVICES_SNAPSHOT: changes at or below it may not follow it.
	var svcSnap uint64
	var svcSnapOf svcSet
	for i, m := range msgs {
		seq := m.GetSequence()
		switch m.GetType() {
		case registrarv1.EndpointEvent_SERVICES_SNAPSHOT:
			sn, first := c.flt.snaps[off+i]
			if !first {
				continue // a further chunk, or one plan already reported
			}
			if resuming {
				c.bad(Resumable, "services snapshot at %d inside the resume from %d, before its bookmark", seq, token)
			}
			if seq < maxChange {
				c.bad(Ordered, "services snapshot at %d after the event at %d", seq, maxChange)
			}
			svcSnap, svcSnapOf = max(svcSnap, seq), svcSet{}
			for _, s := range c.flt.added[sn.update] {
				svcSnapOf[s] = true
			}
			maxAny = max(maxAny, seq)
		case registrarv1.EndpointEvent_ENDPOINT_ADDED, registrarv1.EndpointEvent_ENDPOINT_UPDATED, registrarv1.EndpointEvent_ENDPOINT_REMOVED:
			ref := c.h.event(seq)
			switch {
			case ref == nil:
				c.bad(Faithful, "%v at %d is not in the history (%d, %d]", m.GetType(), seq, c.h.Base, c.h.Last())
			case ref.GetType() != m.GetType() || !proto.Equal(ref.GetEndpoint(), m.GetEndpoint()):
				c.bad(Faithful, "event at %d is %v %s, history has %v %s", seq, m.GetType(), key(m.GetEndpoint()), ref.GetType(), key(ref.GetEndpoint()))
			}
			if svc := m.GetEndpoint().GetService(); !c.matchesAt(svc, seq) {
				c.bad(Filtered, "event at %d is of service %q, outside the filter %v in force there", seq, svc, c.flt.set(seq))
			}
			if _, dup := delivered[seq]; dup {
				c.bad(Unique, "event at %d delivered twice", seq)
				continue
			}
			switch {
			case resuming && seq <= token:
				c.bad(Resumable, "resume from %d repeats the event at %d", token, seq)
			case !resuming && seq <= c.pos:
				c.bad(Unique, "event at %d after the stream's snapshot at %d already reflected it", seq, c.pos)
			case seq <= svcSnap && svcSnapOf[m.GetEndpoint().GetService()]:
				c.bad(Unique, "event at %d after the services snapshot at %d already reflected it", seq, svcSnap)
			case seq <= svcSnap:
				c.bad(Ordered, "event at %d after the services snapshot at %d", seq, svcSnap)
			case seq < maxChange:
				c.bad(Ordered, "event at %d after the event at %d", seq, maxChange)
			}
			if lastBookmark > 0 && seq <= lastBookmark {
				c.bad(Bookmarkable, "event at %d arrived after a bookmark at %d", seq, lastBookmark)
			}
			delivered[seq] = i
			if resuming {
				missed = append(missed, seq)
			}
			maxChange = max(maxChange, seq)
			maxAny = max(maxAny, seq)
		case registrarv1.EndpointEvent_PROGRESS:
			if seq < maxAny {
				c.bad(Ordered, "bookmark at %d after a message at %d", seq, maxAny)
			}
			if seq > c.h.Last() {
				c.bad(Faithful, "bookmark at %d is beyond the history's last event %d", seq, c.h.Last())
			}
			if resuming {
				want := c.matching(token, seq)
				if !equalSeqs(want, missed) {
					c.bad(Resumable, "resume from %d to %d delivered %v, want exactly %v", token, seq, missed, want)
				}
				resuming, c.pos, c.start = false, seq, true
				maxChange = max(maxChange, seq)
			} else {
				var lost []uint64
				for _, s := range c.matching(c.pos, seq) {
					if _, ok := delivered[s]; !ok {
						lost = append(lost, s)
					}
				}
				if len(lost) > 0 {
					c.bad(Bookmarkable, "bookmark at %d before events %v were delivered", seq, lost)
				}
			}
			lastBookmark = max(lastBookmark, seq)
			maxAny = max(maxAny, seq)
		default:
			c.bad(Faithful, "unexpected %v at message %d after the stream's start", m.GetType(), i)
		}
	}
	if !c.start {
		return // a resume that never finished: nothing more to judge
	}
	var gaps []uint64
	for _, s := range c.matching(c.pos, maxChange) {
		if _, ok := delivered[s]; !ok {
			gaps = append(gaps, s)
		}
	}
	if len(gaps) > 0 {
		c.bad(Reliable, "events %v missing between the start at %d and the last event at %d", gaps, c.pos, maxChange)
	}
	c.atomic(msgs, delivered)
}

func (c *streamCheck) atomic(msgs []*registrarv1.EndpointEvent, delivered map[uint64]int) {
	for _, b := range c.h.Batches {
		m := c.matching(b[0]-1, b[1])
		if len(m) == 0 {
			continue
		}
		if m[0] <= c.pos && m[len(m)-1] > c.pos {
			c.bad(Atomic, "stream starts at %d, inside batch %v", c.pos, b)
		}
		first, last := -1, -1
		var lo, hi uint64
		for _, s := range m {
			i, ok := delivered[s]
			if !ok {
				continue
			}
			if first < 0 || i < first {
				first, lo = i, s
			}
			if i > last {
				last, hi = i, s
			}
		}
		if first < 0 || first == last {
			continue
		}
		var holes []uint64
		for _, s := range m {
			if _, ok := delivered[s]; !ok && s > min(lo, hi) && s < max(lo, hi) {
				holes = append(holes, s)
			}
		}
		if len(holes) > 0 {
			c.bad(Atomic, "batch %v delivered without %v", b, holes)
		}
		var between []string
		for _, x := range msgs[first+1 : last] {
			if s := x.GetSequence(); x.GetType() == registrarv1.EndpointEvent_PROGRESS || s < b[0] || s > b[1] {
				between = append(between, fmt.Sprintf("%v@%d", x.GetType(), s))
			}
		}
		if len(between) > 0 {
			c.bad(Atomic, "batch %v interleaved with %s", b, strings.Join(between, ", "))
		}
	}
}

func equalSeqs(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Summary renders violations one per line, sorted, for test failures.
func Summary(vs []Violation) string {
	lines := make([]string, len(vs))
	for i, v := range vs {
		lines[i] = v.String()
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}
