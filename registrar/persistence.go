package registrar

import (
	"context"
	"fmt"
	"time"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/registrar/replica"
	"github.com/aethermesh/aether/registry"
)

// What an acknowledgement means. A write is acknowledged once it is in
// this replica's snapshot, broadcast to its watchers and queued for the
// backend; the flusher persists it within --write-batch-interval while the
// backend is healthy. A caller that needs more asks for it per request
// (wait_persisted): the answer then waits until the write, or a newer
// write of the same endpoint, is in the backend. The status below is what
// the shell reports about that gap: how many writes wait, how long the
// oldest has, and which the backend refused.

// maxPersistWait bounds a wait for persistence when the request carries no
// deadline of its own.
const maxPersistWait = 30 * time.Second

// errPersistWait marks a wait for persistence that ended before the write
// was persisted; the write stays acknowledged and queued.
var errPersistWait = replica.ErrNotPersisted

// errRefused marks a write the backend refused permanently.
var errRefused = replica.ErrRefused

// persistTracker is the shell's write-behind bookkeeping, under the
// Registrar's mu.
type persistTracker struct {
	waiters     map[registry.EndpointID][]persistWaiter
	lastErr     string
	lastErrAt   time.Time
	lastFlushAt time.Time
}

type persistWaiter struct {
	stamp *registryv1.WriteStamp
	done  chan error // buffered: settle never blocks
}

func newPersistTracker() persistTracker {
	return persistTracker{waiters: map[registry.EndpointID][]persistWaiter{}}
}

// settle answers the waiters of id whose write is at or before stamp:
// persisted (err nil) or refused.
func (p *persistTracker) settle(id registry.EndpointID, stamp *registryv1.WriteStamp, err error) {
	ws := p.waiters[id]
	if len(ws) == 0 {
		return
	}
	keep := ws[:0]
	for _, w := range ws {
		if registry.CompareStamps(w.stamp, stamp) <= 0 {
			w.done <- err
			continue
		}
		keep = append(keep, w)
	}
	if len(keep) == 0 {
		delete(p.waiters, id)
		return
	}
	p.waiters[id] = keep
}

func (p *persistTracker) drop(id registry.EndpointID, done chan error) {
	ws := p.waiters[id]
	for i, w := range ws {
		if w.done == done {
			ws = append(ws[:i], ws[i+1:]...)
			break
		}
	}
	if len(ws) == 0 {
		delete(p.waiters, id)
		return
	}
	p.waiters[id] = ws
}

// settleBatch answers the waiters of a flushed batch from its outcomes.
// Called under mu.
func (r *Registrar) settleBatch(b []backend.Mutation, outs []backend.Outcome) {
	for i, m := range b {
		o := outs[i]
		st := m.Stamp
		if m.Endpoint != nil {
			st = m.Endpoint.GetStamp()
		}
		switch {
		case o.Landed, o.Superseded:
			r.persist.settle(m.ID, st, nil)
		case o.Err != nil:
			r.persist.settle(m.ID, st, fmt.Errorf("%w: %v", errRefused, o.Err))
		}
	}
}

// WaitPersisted waits until the write of id stamped stamp, or a newer
// write of id, is persisted in the backend, or ctx ends (at most
// maxPersistWait without a deadline). An error says the write is not
// persisted yet (it stays acknowledged and queued) or was refused.
func (r *Registrar) WaitPersisted(ctx context.Context, id registry.EndpointID, stamp *registryv1.WriteStamp) error {
	r.mu.Lock()
	if reason, ok := r.st.Refused(id, stamp); ok {
		r.mu.Unlock()
		return fmt.Errorf("%w: %s", errRefused, reason)
	}
	if !r.st.Unsettled(id, stamp) {
		r.mu.Unlock()
		return nil
	}
	done := make(chan error, 1)
	r.persist.waiters[id] = append(r.persist.waiters[id], persistWaiter{stamp: stamp, done: done})
	r.mu.Unlock()
	var cancel context.CancelFunc
	if dl, ok := ctx.Deadline(); ok {
		// Give up a little before the caller does, so that the caller
		// hears that its write is acknowledged and queued rather than a
		// bare deadline of its own.
		margin := min(time.Until(dl)/10, 500*time.Millisecond)
		ctx, cancel = context.WithDeadline(ctx, dl.Add(-margin))
	} else {
		ctx, cancel = context.WithTimeout(ctx, maxPersistWait)
	}
	defer cancel()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		r.mu.Lock()
		r.persist.drop(id, done)
		r.mu.Unlock()
		select {
		case err := <-done: // settled meanwhile
			return err
		default:
		}
		return fmt.Errorf("%w (%v): the write is acknowledged and queued; %d endpoints' writes wait for the backend", errPersistWait, ctx.Err(), r.PendingWrites())
	}
}

// IsolatedWrite is a write the backend refused permanently.
type IsolatedWrite struct {
	Key    string
	Reason string
	Since  time.Time
}

// PersistenceStatus is what the registrar can say about its write-behind.
type PersistenceStatus struct {
	// Pending counts endpoints with acknowledged, unpersisted writes.
	Pending int
	// Oldest is the age of the oldest of them (0 when none).
	Oldest time.Duration
	// Isolated are the writes the backend refused permanently; they are
	// retried now and then, and replaced by any newer write of their key.
	Isolated []IsolatedWrite
	// LastFlushError is the last failed flush's error, at LastFlushErrorAt;
	// LastFlushAt is when a flush last succeeded.
	LastFlushError   string
	LastFlushErrorAt time.Time
	LastFlushAt      time.Time
}

// PersistenceStatus reports the write-behind's state now.
func (r *Registrar) PersistenceStatus() PersistenceStatus {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	st := PersistenceStatus{
		Pending:          r.st.Depth(),
		LastFlushError:   r.persist.lastErr,
		LastFlushErrorAt: r.persist.lastErrAt,
		LastFlushAt:      r.persist.lastFlushAt,
	}
	if t := r.st.Oldest(); !t.IsZero() {
		st.Oldest = max(now.Sub(t), 0)
	}
	for _, w := range r.st.IsolatedWrites() { // in key order
		st.Isolated = append(st.Isolated, IsolatedWrite{Key: w.Key, Reason: w.Reason, Since: w.Since})
	}
	return st
}
