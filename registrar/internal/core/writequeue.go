package core

import (
	"time"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/registry"
)

// writeQueue holds local writes that are acknowledged but not yet persisted.
// It coalesces per endpoint: only the latest intent for a key is kept.
//
// A write is "pending" until the flusher takes it, then "in flight" until the
// backend confirms it (or reports a newer write of the key, which settles it
// just as well). A failed batch returns to pending unless a newer write for
// the same key arrived meanwhile. A write the backend refuses permanently
// is "isolated": it stays queued, and keeps guarding the snapshot, but is
// offered to the flusher again only after IsolationRetry, so it cannot
// hold every other write back. Nothing leaves the queue except by a
// confirmed flush, so an acknowledged write is never dropped.
//
// Every write is persisted, a delete of a key the backend never saw
// included: the delete's stamp must reach the backend (as a tombstone) in
// case another replica wrote the key meanwhile with an older stamp.
type writeQueue struct {
	limit    int
	pending  map[registry.EndpointID]queued
	inflight map[registry.EndpointID]queued
	isolated map[registry.EndpointID]isolatedWrite
}

type queued struct {
	ep    *registryv1.ServiceEndpoint // nil: delete
	stamp *registryv1.WriteStamp      // the write's stamp (ep's, for a put)
	// since is when the oldest write of the key not yet persisted was
	// acknowledged: coalescing a newer write keeps it.
	since time.Time
}

// isolatedWrite is a write the backend refused permanently.
type isolatedWrite struct {
	w       queued
	reason  string
	since   time.Time // when it was isolated
	retryAt time.Time
}

// IsolationRetry is how long an isolated write waits before it is offered
// to the backend again (its limits may have been raised meanwhile).
const IsolationRetry = 30 * time.Second

func newWriteQueue(limit int) writeQueue {
	return writeQueue{
		limit:    limit,
		pending:  map[registry.EndpointID]queued{},
		inflight: map[registry.EndpointID]queued{},
		isolated: map[registry.EndpointID]isolatedWrite{},
	}
}

// depth counts distinct endpoints with unpersisted writes.
func (q *writeQueue) depth() int {
	n := len(q.pending)
	for id := range q.inflight {
		if _, ok := q.pending[id]; !ok {
			n++
		}
	}
	for id := range q.isolated {
		if _, ok := q.pending[id]; !ok {
			if _, ok := q.inflight[id]; !ok {
				n++
			}
		}
	}
	return n
}

func (q *writeQueue) holds(id registry.EndpointID) bool {
	if _, ok := q.pending[id]; ok {
		return true
	}
	if _, ok := q.inflight[id]; ok {
		return true
	}
	_, ok := q.isolated[id]
	return ok
}

// latest is the newest unpersisted write of id.
func (q *writeQueue) latest(id registry.EndpointID) (queued, bool) {
	if w, ok := q.pending[id]; ok {
		return w, true
	}
	if w, ok := q.inflight[id]; ok {
		return w, true
	}
	iw, ok := q.isolated[id]
	return iw.w, ok
}

// admits reports whether a write to id fits: a key already queued costs
// nothing more.
func (q *writeQueue) admits(id registry.EndpointID) bool {
	return q.holds(id) || q.depth() < q.limit
}

// oldest is when the oldest unpersisted write was acknowledged (zero when
// none is).
func (q *writeQueue) oldest() time.Time {
	var t time.Time
	see := func(s time.Time) {
		if t.IsZero() || s.Before(t) {
			t = s
		}
	}
	for _, w := range q.pending {
		see(w.since)
	}
	for _, w := range q.inflight {
		see(w.since)
	}
	for _, w := range q.isolated {
		see(w.w.since)
	}
	return t
}

// since is when the oldest unpersisted write of id was acknowledged, or
// now if it has none.
func (q *writeQueue) sinceOf(id registry.EndpointID, now time.Time) time.Time {
	t := now
	see := func(w queued, ok bool) {
		if ok && w.since.Before(t) {
			t = w.since
		}
	}
	w, ok := q.pending[id]
	see(w, ok)
	w, ok = q.inflight[id]
	see(w, ok)
	iw, ok := q.isolated[id]
	see(iw.w, ok)
	return t
}

func (q *writeQueue) put(id registry.EndpointID, ep *registryv1.ServiceEndpoint, now time.Time) {
	q.pending[id] = queued{ep: ep, stamp: ep.GetStamp(), since: q.sinceOf(id, now)}
	delete(q.isolated, id) // superseded by this write
}

func (q *writeQueue) del(id registry.EndpointID, stamp *registryv1.WriteStamp, now time.Time) {
	q.pending[id] = queued{stamp: stamp, since: q.sinceOf(id, now)}
	delete(q.isolated, id)
}

// take hands up to max writes to the flusher: pending ones, and isolated
// ones whose retry time has come.
func (q *writeQueue) take(max int, now time.Time) []backend.Mutation {
	var b []backend.Mutation
	for id, w := range q.isolated {
		if len(b) == max {
			return b
		}
		if now.Before(w.retryAt) {
			continue
		}
		b = append(b, backend.Mutation{ID: id, Endpoint: w.w.ep, Stamp: w.w.stamp})
		q.inflight[id] = w.w
		delete(q.isolated, id)
	}
	for id, w := range q.pending {
		if _, busy := q.inflight[id]; busy {
			continue // one write per key in flight keeps flush order per key
		}
		if len(b) == max {
			break
		}
		b = append(b, backend.Mutation{ID: id, Endpoint: w.ep, Stamp: w.stamp})
		q.inflight[id] = w
		delete(q.pending, id)
	}
	return b
}

// nextRetry is when the first isolated write is due to be offered again
// (zero when none is isolated).
func (q *writeQueue) nextRetry() time.Time {
	var t time.Time
	for _, w := range q.isolated {
		if t.IsZero() || w.retryAt.Before(t) {
			t = w.retryAt
		}
	}
	return t
}

// done settles the in-flight write of id.
func (q *writeQueue) done(id registry.EndpointID) { delete(q.inflight, id) }

// failed returns id's in-flight write to pending, unless a newer write
// took its place.
func (q *writeQueue) failed(id registry.EndpointID) {
	w, ok := q.inflight[id]
	if !ok {
		return
	}
	delete(q.inflight, id)
	if p, newer := q.pending[id]; newer {
		if w.since.Before(p.since) {
			p.since = w.since
			q.pending[id] = p
		}
		return
	}
	q.pending[id] = w
}

// isolate sets id's in-flight write aside after a permanent refusal,
// unless a newer write took its place (which is then tried on its own
// merits).
func (q *writeQueue) isolate(id registry.EndpointID, reason string, now time.Time) {
	w, ok := q.inflight[id]
	if !ok {
		return
	}
	delete(q.inflight, id)
	if _, newer := q.pending[id]; newer {
		return
	}
	q.isolated[id] = isolatedWrite{w: w, reason: reason, since: now, retryAt: now.Add(IsolationRetry)}
}
