package replicator

import (
	"context"
	"sort"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/aethermesh/aether/internal/retry"
)

// Lag is measured against a record of when the leader first saw each local
// change: a list of buckets (maxRev, since), ascending, where a bucket holds
// the revisions after the previous bucket's maxRev up to its own, and since
// is when the first of them was seen. A peer's lag is now minus the since of
// the first bucket holding a revision the peer has not mirrored, or 0 when
// it has mirrored them all. Buckets span at most bucketWidth, so the lag is
// an overestimate by less than that; when there are too many (a peer down
// for long under heavy writes) adjacent pairs merge, which keeps the
// overestimate one-sided.
const (
	bucketWidth = 100 * time.Millisecond
	maxBuckets  = 4096
)

type bucket struct {
	maxRev int64
	since  time.Time
}

type headTracker struct {
	mu      sync.Mutex
	buckets []bucket
}

// observe records that revisions up to rev were seen at now.
func (h *headTracker) observe(rev int64, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if n := len(h.buckets); n > 0 {
		last := &h.buckets[n-1]
		if rev <= last.maxRev {
			return
		}
		if now.Sub(last.since) < bucketWidth {
			last.maxRev = rev
			return
		}
	}
	h.buckets = append(h.buckets, bucket{maxRev: rev, since: now})
	if len(h.buckets) > maxBuckets {
		merged := h.buckets[:0]
		for i := 0; i < len(h.buckets); i += 2 {
			b := h.buckets[i]
			if i+1 < len(h.buckets) {
				b.maxRev = h.buckets[i+1].maxRev
			}
			merged = append(merged, b)
		}
		h.buckets = merged
	}
}

// lag is how long the oldest change after mirrored has waited.
func (h *headTracker) lag(mirrored int64, now time.Time) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	i := sort.Search(len(h.buckets), func(i int) bool { return h.buckets[i].maxRev > mirrored })
	if i == len(h.buckets) {
		return 0
	}
	return max(now.Sub(h.buckets[i].since), 0)
}

// trim forgets buckets that every peer has mirrored.
func (h *headTracker) trim(minMirrored int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	i := sort.Search(len(h.buckets), func(i int) bool { return h.buckets[i].maxRev > minMirrored })
	h.buckets = append(h.buckets[:0], h.buckets[i:]...)
}

func (h *headTracker) reset() {
	h.mu.Lock()
	h.buckets = nil
	h.mu.Unlock()
}

// trackHead feeds h from a watch of the local subtree for as long as ctx
// lives. It starts with the local revision at the time it starts: changes
// made before then are dated to then (a leader cannot know older times). When
// its watch breaks it resumes from the last revision it saw; if that is
// compacted it starts over from the current revision, dating the changes it
// missed to the moment it noticed.
func (r *Replicator) trackHead(ctx context.Context, minMirrored func() int64) {
	var last int64
	bo := retry.Backoff{Base: 50 * time.Millisecond, Max: 2 * time.Second}
	attempt := 0
	trim := time.NewTicker(time.Second)
	defer trim.Stop()
	for ctx.Err() == nil {
		if last == 0 {
			gctx, cancel := context.WithTimeout(ctx, r.cfg.RequestTimeout)
			resp, err := r.cfg.Local.Get(gctx, r.prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
			cancel()
			if err != nil {
				retry.Sleep(ctx, bo.Spread(attempt, jitterPct), nil)
				attempt++
				continue
			}
			last = resp.Header.GetRevision()
			r.head.observe(last, time.Now())
		}
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		wch := r.cfg.Local.Watch(wctx, r.prefix, clientv3.WithPrefix(), clientv3.WithRev(last+1))
	stream:
		for {
			select {
			case resp, ok := <-wch:
				if !ok {
					break stream
				}
				if resp.CompactRevision != 0 {
					last = 0
					break stream
				}
				if resp.Err() != nil {
					break stream
				}
				if n := len(resp.Events); n > 0 {
					last = resp.Events[n-1].Kv.ModRevision
					r.head.observe(last, time.Now())
					attempt = 0
				}
			case <-trim.C:
				r.head.trim(minMirrored())
			}
		}
		cancel()
		retry.Sleep(ctx, bo.Spread(attempt, jitterPct), nil)
		attempt++
	}
}
