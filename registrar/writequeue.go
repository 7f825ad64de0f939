package registrar

import (
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/etcdstore"
	"github.com/aethermesh/aether/registry"
)

// writeQueue holds local writes that are acknowledged but not yet persisted.
// It coalesces per endpoint: only the latest intent for a key is kept, and a
// register followed by an unregister of an endpoint the backend never saw
// nets out to nothing.
//
// A write is "pending" until the flusher takes it, then "in flight" until the
// backend confirms it. A failed batch returns to pending unless a newer write
// for the same key arrived meanwhile. Nothing leaves the queue except by a
// confirmed flush or netting out, so an acknowledged write is never dropped.
type writeQueue struct {
	limit    int
	pending  map[registry.EndpointID]queued
	inflight map[registry.EndpointID]queued
}

type queued struct {
	ep *registryv1.ServiceEndpoint // nil: delete
	// fresh: the key did not exist when this pending run of writes began,
	// and no earlier write of it is in flight; so the backend has never
	// seen it from us, and an unregister can simply drop the put.
	fresh bool
}

func newWriteQueue(limit int) writeQueue {
	return writeQueue{
		limit:    limit,
		pending:  map[registry.EndpointID]queued{},
		inflight: map[registry.EndpointID]queued{},
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
	return n
}

func (q *writeQueue) holds(id registry.EndpointID) bool {
	if _, ok := q.pending[id]; ok {
		return true
	}
	_, ok := q.inflight[id]
	return ok
}

// admits reports whether a write to id fits: a key already queued costs
// nothing more.
func (q *writeQueue) admits(id registry.EndpointID) bool {
	return q.holds(id) || q.depth() < q.limit
}

func (q *writeQueue) put(id registry.EndpointID, ep *registryv1.ServiceEndpoint, created bool) {
	fresh := created
	if prev, ok := q.pending[id]; ok {
		fresh = prev.fresh
	}
	if _, ok := q.inflight[id]; ok {
		fresh = false
	}
	q.pending[id] = queued{ep: ep, fresh: fresh}
}

func (q *writeQueue) del(id registry.EndpointID) {
	if prev, ok := q.pending[id]; ok && prev.fresh {
		delete(q.pending, id)
		return
	}
	q.pending[id] = queued{}
}

func (q *writeQueue) take(max int) []etcdstore.Mutation {
	if len(q.pending) == 0 {
		return nil
	}
	var b []etcdstore.Mutation
	for id, w := range q.pending {
		if _, busy := q.inflight[id]; busy {
			continue // one write per key in flight keeps flush order per key
		}
		if len(b) == max {
			break
		}
		b = append(b, etcdstore.Mutation{ID: id, Endpoint: w.ep})
		q.inflight[id] = w
		delete(q.pending, id)
	}
	return b
}

func (q *writeQueue) done(b []etcdstore.Mutation) {
	for _, m := range b {
		delete(q.inflight, m.ID)
	}
}

func (q *writeQueue) failed(b []etcdstore.Mutation) {
	for _, m := range b {
		w := q.inflight[m.ID]
		delete(q.inflight, m.ID)
		if _, newer := q.pending[m.ID]; !newer {
			w.fresh = false
			q.pending[m.ID] = w
		}
	}
}
