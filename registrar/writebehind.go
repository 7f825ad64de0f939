package registrar

import (
	"context"
	"time"

	"github.com/aethermesh/aether/internal/retry"
	"github.com/aethermesh/aether/registrar/internal/core"
)

// maxFlushOps bounds one Apply call. A normal flush is far smaller (one
// transaction of at most --write-batch-size writes); this only splits the
// backlog that builds up while the backend is down.
const maxFlushOps = 1024

// flushTimeout bounds one flush. etcd commits a healthy batch in
// milliseconds (a 1024-operation backlog flush in tens of milliseconds); a
// flush still waiting after this is stuck and is better retried, the writes
// staying queued meanwhile. The commonest way to get stuck is a leader
// crash: a proposal a follower had forwarded to the dead leader is dropped
// without an answer, so the flush waits for this timeout although a new
// leader is elected in about a second. Retrying sooner keeps that stall,
// during which other replicas do not see this one's writes, short.
const flushTimeout = 2 * time.Second

// flushBackoff spaces the retries of a failing flush.
var flushBackoff = retry.Backoff{Base: 50 * time.Millisecond, Max: 5 * time.Second}

// runFlusher persists queued writes, when and as core.PlanFlush says:
// spaced WriteBatchInterval apart, leading-edge, at once for a batch's
// worth. A failed flush is retried with backoff; its writes stay queued
// (and keep winning over the backend's view) until one succeeds.
func (r *Registrar) runFlusher(ctx context.Context) {
	var lastFlush time.Time
	failures := 0 // flushes failed in a row
	for {
		r.mu.Lock()
		in := core.FlushInput{
			Now:       r.clock.Now(),
			LastFlush: lastFlush,
			Pending:   r.st.Pending(),
			RetryAt:   r.st.NextRetry(),
			Interval:  r.opts.WriteBatchInterval,
			BatchSize: r.opts.WriteBatchSize,
		}
		r.mu.Unlock()
		if plan := core.PlanFlush(in); !plan.Flush {
			var t Timer
			var timeout <-chan time.Time
			if plan.Timer {
				t = r.clock.NewTimer(plan.Wait)
				timeout = t.C()
			}
			select {
			case <-ctx.Done():
			case <-r.kick:
			case <-timeout:
			}
			if t != nil {
				t.Stop()
			}
			if ctx.Err() != nil {
				return
			}
			continue
		}
		lastFlush = r.clock.Now()
		if _, err := r.flushOnce(ctx); err != nil {
			if isClosed(ctx, err) {
				return
			}
			r.metrics.flushErrors.Inc()
			// One flusher retrying its own store has no crowd to spread,
			// so it waits the plain exponential step.
			backoff := flushBackoff.Ceiling(failures)
			failures++
			r.log.Warn("write-behind flush failed; writes stay queued", "err", err, "pending", r.PendingWrites(), "retry_in", backoff)
			if !retry.Sleep(ctx, backoff, nil) {
				return
			}
			lastFlush = time.Time{} // retry as soon as the backoff is over
			continue
		}
		failures = 0
	}
}

// flush writes batches until the queue is empty or a write fails; for
// shutdown, which has no reason to space its flushes.
func (r *Registrar) flush(ctx context.Context) error {
	for {
		n, err := r.flushOnce(ctx)
		if err != nil || n == 0 {
			return err
		}
	}
}

// flushOnce writes one batch of pending writes (at most maxFlushOps) and
// says how many it wrote. The backend keeps, per key, the newest stamp
// (ApplyOrdered): a write another replica overtook is settled by taking
// the newer value into the snapshot; a write the backend refuses
// permanently is isolated, and the rest of the batch lands regardless.
func (r *Registrar) flushOnce(ctx context.Context) (int, error) {
	r.mu.Lock()
	b := r.st.TakeBatch(maxFlushOps, r.now())
	r.mu.Unlock()
	if len(b) == 0 {
		return 0, nil
	}
	start := r.clock.Now()
	actx, cancel := context.WithTimeout(ctx, flushTimeout)
	outs, err := r.backend.ApplyOrdered(actx, b)
	cancel()
	now := r.now()
	landed, refused := 0, 0
	r.mu.Lock()
	if outs == nil {
		r.st.BatchFailed(b)
	} else {
		r.act(r.st.BatchSettled(b, outs, now))
		r.settleBatch(b, outs)
		for i, o := range outs {
			switch {
			case o.Landed:
				landed++
			case o.Superseded:
				landed++
				r.metrics.superseded.Inc()
			case o.Err != nil:
				refused++
				k, _ := b[i].ID.Key()
				r.log.Error("the backend refused a write permanently; it is isolated and retried now and then, the other writes go on",
					"key", k, "err", o.Err, "retry_in", core.IsolationRetry)
			}
		}
	}
	if err != nil {
		r.persist.lastErr, r.persist.lastErrAt = err.Error(), now
	} else {
		r.persist.lastFlushAt = now
	}
	r.mu.Unlock()
	if refused > 0 {
		r.metrics.writesRefused.Add(float64(refused))
	}
	if err != nil {
		return landed, err
	}
	r.metrics.batchSize.Observe(float64(len(b)))
	r.metrics.flushDuration.Observe(r.clock.Now().Sub(start).Seconds())
	return len(b), nil
}
