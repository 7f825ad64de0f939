package replicator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/aethermesh/aether/internal/retry"
)

// drainEvents bounds how many events already queued on the watch channel
// one apply takes together. Catching up after a slow patch then costs a few
// Txns of MaxTxnOps instead of one round trip per local revision.
//
// clientv3 hands queued responses over one at a time through a one-slot
// channel, so "already queued" cannot be seen with a non-blocking receive:
// the drain waits up to drainLinger for each next response. That delays an
// isolated change by at most drainLinger, far below a cross-region round
// trip.
const (
	drainEvents = 1024
	drainLinger = time.Millisecond
)

// Backoff between re-establishing a local watch that ended (local side
// only; the peer session continues).
const (
	minLocalWatchBackoff = 50 * time.Millisecond
	maxLocalWatchBackoff = 2 * time.Second
)

// mirror applies the local subtree's changes after rev to the peer until
// something on the peer side fails, the watch cannot resume (compaction),
// or ctx ends. A local watch that merely ends is resumed from the last
// mirrored revision.
func (p *peer) mirror(ctx context.Context, cli *clientv3.Client, lease clientv3.LeaseID, fenceRev, rev int64) error {
	last := rev
	bo := retry.Backoff{Base: minLocalWatchBackoff, Max: maxLocalWatchBackoff}
	attempt := 0
	for {
		err := p.watchOnce(ctx, cli, lease, fenceRev, &last, &attempt)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var le *localError
		if !errors.As(err, &le) {
			return err
		}
		d := bo.Spread(attempt, jitterPct)
		attempt++
		p.log.Warn("local watch ended; resuming", "resume_revision", last+1, "err", err, "backoff", d)
		if !retry.Sleep(ctx, d, nil) {
			return ctx.Err()
		}
	}
}

// watchOnce runs one local watch from *last+1 and applies what it delivers,
// advancing *last after each applied batch and restarting the caller's
// backoff (*attempt) once something was applied.
func (p *peer) watchOnce(ctx context.Context, cli *clientv3.Client, lease clientv3.LeaseID, fenceRev int64, last *int64, attempt *int) error {
	// RequireLeader: a local member cut off from its quorum ends the watch
	// instead of silently serving nothing.
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := p.r.cfg.Local.Watch(wctx, p.r.prefix,
		clientv3.WithPrefix(),
		clientv3.WithRev(*last+1),
		clientv3.WithProgressNotify(),
	)
	var pending *clientv3.WatchResponse
	for {
		var resp clientv3.WatchResponse
		if pending != nil {
			resp, pending = *pending, nil
		} else {
			var ok bool
			if resp, ok = <-wch; !ok {
				if err := ctx.Err(); err != nil {
					return err
				}
				return &localError{errors.New("watch channel closed")}
			}
		}
		if resp.CompactRevision != 0 {
			return fmt.Errorf("%w: resume revision %d (compacted up to %d)", errCompacted, *last+1, resp.CompactRevision)
		}
		if err := resp.Err(); err != nil {
			return &localError{err}
		}
		if resp.Created {
			continue
		}
		if resp.IsProgressNotify() {
			// Sent only to a watcher that is caught up, so the header
			// revision is exact: nothing in the subtree up to it is
			// unmirrored.
			if h := resp.Header.GetRevision(); h > *last {
				*last = h
				p.setMirrored(h, 0)
			}
			continue
		}
		evs := fresh(resp.Events, *last)
		linger := time.NewTimer(drainLinger)
	drain:
		for len(evs) < drainEvents {
			select {
			case next, ok := <-wch:
				if !ok {
					break drain // the closed channel is seen again above
				}
				if next.CompactRevision != 0 || next.Err() != nil || next.Created || next.IsProgressNotify() {
					pending = &next
					break drain
				}
				after := *last
				if n := len(evs); n > 0 {
					after = evs[n-1].Kv.ModRevision
				}
				evs = append(evs, fresh(next.Events, after)...)
				linger.Reset(drainLinger)
			case <-linger.C:
				break drain
			}
		}
		linger.Stop()
		if len(evs) == 0 {
			continue // a replay of what was already mirrored
		}
		if err := p.apply(ctx, cli, lease, fenceRev, evs); err != nil {
			return err
		}
		*last = evs[len(evs)-1].Kv.ModRevision
		// Applying means the watch works; the next local failure starts
		// the backoff afresh.
		*attempt = 0
	}
}

// fresh drops events at or below after: a re-established watch (ours, or
// clientv3's own transparent resume) may replay them. etcd never splits one
// revision across responses, so filtering by revision is exact.
func fresh(evs []*clientv3.Event, after int64) []*clientv3.Event {
	i := 0
	for i < len(evs) && evs[i].Kv.ModRevision <= after {
		i++
	}
	return evs[i:]
}

// apply writes evs to the peer: the last event per key, puts under lease, in
// Txns of at most MaxTxnOps. The mirrored revision and key count advance only
// once every Txn committed.
func (p *peer) apply(ctx context.Context, cli *clientv3.Client, lease clientv3.LeaseID, fenceRev int64, evs []*clientv3.Event) error {
	pos := make(map[string]int, len(evs))
	ops := make([]clientv3.Op, 0, len(evs))
	isPut := make([]bool, 0, len(evs))
	var delta int64
	for _, ev := range evs {
		key := string(ev.Kv.Key)
		var op clientv3.Op
		put := ev.Type == mvccpb.PUT
		if put {
			op = clientv3.OpPut(key, string(ev.Kv.Value), clientv3.WithLease(lease))
			if ev.Kv.Version == 1 { // created at this revision
				delta++
			}
		} else {
			op = clientv3.OpDelete(key)
			delta--
		}
		if i, ok := pos[key]; ok {
			ops[i], isPut[i] = op, put
			continue
		}
		pos[key] = len(ops)
		ops = append(ops, op)
		isPut = append(isPut, put)
	}
	maxOps := p.r.cfg.MaxTxnOps
	for lo := 0; lo < len(ops); lo += maxOps {
		hi := min(lo+maxOps, len(ops))
		if err := p.commit(ctx, cli, lease, fenceRev, ops[lo:hi]); err != nil {
			if lo > 0 {
				return fmt.Errorf("after %d of %d ops committed: %w", lo, len(ops), err)
			}
			return err
		}
	}
	var puts, dels int
	for _, put := range isPut {
		if put {
			puts++
		} else {
			dels++
		}
	}
	p.r.m.ops.WithLabelValues(p.cfg.Region, "put").Add(float64(puts))
	p.r.m.ops.WithLabelValues(p.cfg.Region, "delete").Add(float64(dels))
	p.setMirrored(evs[len(evs)-1].Kv.ModRevision, delta)
	return nil
}
