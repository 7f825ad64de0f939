package edge

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3compactor"
	"go.uber.org/zap"
)

// Automatic compaction is etcd's own compactor (v3compactor), run against
// this replica exactly as etcd runs it against its server: the same modes
// and the same schedule (periodic: the revision of `retention` ago,
// sampled every retention/10 and compacted every retention, or hourly past
// an hour; revision: every 5 minutes, the current revision minus
// `retention`). An etcd deployment's --auto-compaction-* flags therefore
// mean the same here. It matters more here than in etcd: the edge store
// keeps the history since the last compaction in memory, so without
// compaction memory grows with writes.

// compactorRevs is the RevGetter etcd's compactor samples: the current
// revision, under the state lock.
type compactorRevs struct{ s *Server }

func (r compactorRevs) Rev() int64 {
	r.s.mu.RLock()
	defer r.s.mu.RUnlock()
	return r.s.st.Rev()
}

// autoCompactor is the Compactable handed to etcd's compactor. etcd's Stop
// cancels the compactor's loop without waiting for it, so the calls it
// makes go through here: once stopped, none starts and the ones running
// are waited for, and Close never closes storage under a compaction.
type autoCompactor struct {
	s        *Server
	mu       sync.Mutex
	stopped  bool
	inflight sync.WaitGroup
	stopLoop func()
}

var errAutoCompactionStopped = errors.New("edge: automatic compaction stopped")

func (a *autoCompactor) Compact(ctx context.Context, r *pb.CompactionRequest) (*pb.CompactionResponse, error) {
	a.mu.Lock()
	if a.stopped {
		a.mu.Unlock()
		return nil, errAutoCompactionStopped
	}
	a.inflight.Add(1)
	a.mu.Unlock()
	defer a.inflight.Done()
	resp, err := (&kvServer{s: a.s}).Compact(ctx, r)
	if err != nil {
		a.s.log.Warn("automatic compaction failed", "revision", r.Revision, "err", err)
		return nil, err
	}
	a.s.log.Info("automatic compaction", "revision", r.Revision)
	return resp, nil
}

// stop ends the compactor's loop and waits for a compaction in flight.
func (a *autoCompactor) stop() {
	a.mu.Lock()
	a.stopped = true
	a.mu.Unlock()
	a.stopLoop()
	a.inflight.Wait()
}

// startAutoCompaction starts etcd's compactor when a retention is set (nil
// when none runs).
func (s *Server) startAutoCompaction(mode string, retention time.Duration) (*autoCompactor, error) {
	if retention <= 0 {
		return nil, nil
	}
	if mode == "" {
		mode = v3compactor.ModePeriodic
	}
	a := &autoCompactor{s: s}
	c, err := v3compactor.New(zap.NewNop(), mode, retention, compactorRevs{s}, a)
	if err != nil {
		return nil, fmt.Errorf("edge: auto compaction: %w", err)
	}
	a.stopLoop = c.Stop
	c.Run()
	s.log.Info("auto compaction enabled", "mode", mode, "retention", retention.String())
	return a, nil
}
