package edge

// Checkpoints bound the change log on disk (issue 16, part 4).
//
// Without them the log keeps every change this replica ever applied, and a
// restart replays all of them. A checkpoint stores the core's whole state
// (core.State.Snapshot) as of an index I, and deletes the records before
// K, the first index the sync log still holds (gc.go trims it below what
// every peer holds; without Config.HistoryGC it never trims, so K stays
// where it started and the log is kept whole: the "without GC" baseline).
// The records in [K, I] are in the snapshot already; they stay because the
// sync log still sends them to peers that lack them. Disk then holds the
// state, the changes since the last checkpoint and the changes some peer
// still lacks: bounded under a sustained load once GC and compaction run.
//
// Recovery (Server.recover) restores the snapshot, rebuilds the sync log
// from the records from K on, starting from the per replica counts of the
// changes before K (stored with the checkpoint, in the same transaction),
// and replays the records after I.
//
// When: after Config.CheckpointChanges changes or Config.CheckpointBytes
// bytes of encoded changes became durable since the last checkpoint,
// whichever comes first, and whenever the caller asks (checkpointNow: a
// snapshot transfer changes the state without a change to log, so it is
// durable only once checkpointed). A checkpoint encodes the state under
// the state lock's read side (writers wait for the encoding; readers do
// not) and writes it outside the lock.

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aethermesh/aether/edge/internal/core"
	"github.com/aethermesh/aether/edge/internal/storage"
)

const (
	// DefaultCheckpointChanges is etcd's --snapshot-count default, the
	// number of changes between the snapshots that bound etcd's own log:
	// a restart replays at most that many, and the state is written once
	// per that many changes, which at a state of S bytes costs S/10000
	// bytes per change.
	DefaultCheckpointChanges = 10000
	// DefaultCheckpointBytes bounds the log between checkpoints when the
	// changes are large (10,000 changes of up to etcd's 1.5 MiB request
	// limit would be 15 GiB): 64 MiB is a few seconds of replay.
	DefaultCheckpointBytes = 64 << 20
)

// checkpointer runs the periodic checkpoints.
type checkpointer struct {
	s            *Server
	everyChanges int64 // <= 0: no change-count trigger
	everyBytes   int64 // <= 0: no byte trigger

	// mu serialises checkpoints (the loop and checkpointNow): each one's
	// index and keep-from must not go back.
	mu sync.Mutex
	// changes and bytes became durable since the last checkpoint began.
	changes, bytes atomic.Int64
	kick           chan struct{}

	total    prometheus.Counter
	failures prometheus.Counter
	duration prometheus.Histogram
	size     prometheus.Gauge
	index    prometheus.Gauge
}

func newCheckpointer(s *Server) *checkpointer {
	c := &checkpointer{
		s:            s,
		everyChanges: int64(s.cfg.CheckpointChanges),
		everyBytes:   s.cfg.CheckpointBytes,
		kick:         make(chan struct{}, 1),
		total: prometheus.NewCounter(prometheus.CounterOpts{Name: "aether_edge_checkpoints_total",
			Help: "Checkpoints written: the state's snapshot, with the change log before the sync log's first held change deleted."}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{Name: "aether_edge_checkpoint_failures_total",
			Help: "Checkpoints that failed (the log is kept whole until one succeeds)."}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "aether_edge_checkpoint_duration_seconds",
			Help: "Time to write one checkpoint, from encoding the state to the durable commit.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}),
		size: prometheus.NewGauge(prometheus.GaugeOpts{Name: "aether_edge_checkpoint_snapshot_bytes",
			Help: "Size of the last checkpoint's state snapshot."}),
		index: prometheus.NewGauge(prometheus.GaugeOpts{Name: "aether_edge_checkpoint_index",
			Help: "Apply index the last checkpoint covers."}),
	}
	if c.everyChanges == 0 {
		c.everyChanges = DefaultCheckpointChanges
	}
	if c.everyBytes == 0 {
		c.everyBytes = DefaultCheckpointBytes
	}
	s.reg.MustRegister(c.total, c.failures, c.duration, c.size, c.index)
	return c
}

// noteDurable counts a batch the committer made durable and wakes the
// loop when a trigger is reached. It never blocks.
func (c *checkpointer) noteDurable(recs []storage.Record) {
	var b int64
	for i := range recs {
		b += int64(len(recs[i].Change))
	}
	n, nb := c.changes.Add(int64(len(recs))), c.bytes.Add(b)
	if c.due(n, nb) {
		select {
		case c.kick <- struct{}{}:
		default:
		}
	}
}

func (c *checkpointer) due(n, b int64) bool {
	return (c.everyChanges > 0 && n >= c.everyChanges) || (c.everyBytes > 0 && b >= c.everyBytes)
}

// run checkpoints whenever a trigger is reached, until ctx ends.
func (c *checkpointer) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.kick:
		}
		if !c.due(c.changes.Load(), c.bytes.Load()) {
			continue
		}
		if err := c.s.checkpointNow(ctx); err != nil && ctx.Err() == nil {
			// The log stays whole until a checkpoint succeeds: nothing
			// is lost, disk grows. The next batch tries again.
			c.s.log.Warn("checkpoint failed", "err", err)
		}
	}
}

// checkpointNow writes a checkpoint of the current state and returns once
// it is durable. It must not be called with the state lock held.
func (s *Server) checkpointNow(ctx context.Context) error {
	c := s.ckpt
	c.mu.Lock()
	defer c.mu.Unlock()
	start := time.Now()

	s.mu.RLock()
	// What becomes durable from here on counts toward the next one (the
	// batches in flight are in this one: a slight overcount, harmless).
	c.changes.Store(0)
	c.bytes.Store(0)
	snap := s.st.Snapshot()
	index := s.st.Index()
	keep, below := s.sync.log.checkpointBase()
	// The changes up to index are in this batch or before it; storage
	// refuses a checkpoint past its last record.
	b := s.commit.last()
	s.mu.RUnlock()

	if keep == 0 {
		keep = index + 1 // nothing was ever applied
	}
	if keep > index+1 {
		// The log holds only durable changes, which the state has.
		c.failures.Inc()
		return fmt.Errorf("edge: checkpoint at %d: the sync log starts at %d, past the state", index, keep)
	}
	if err := b.wait(ctx); err != nil {
		c.failures.Inc()
		return fmt.Errorf("edge: checkpoint at %d: wait for the changes it covers: %w", index, err)
	}
	if err := s.writeCheckpoint(start, index, keep, snap, below); err != nil {
		return fmt.Errorf("edge: %w", err)
	}
	s.log.Debug("checkpoint", "index", index, "keep-from", keep, "snapshot-bytes", len(snap), "took", time.Since(start))
	return nil
}

// writeCheckpoint persists a snapshot taken at index, keeping the records
// from keep, and accounts for it: the one write of both checkpoint paths
// (checkpointNow, and checkpointLocked after a snapshot merge).
func (s *Server) writeCheckpoint(start time.Time, index, keep uint64, snap []byte, below vector) error {
	c := s.ckpt
	if err := s.store.Checkpoint(storage.Checkpoint{Index: index, KeepFrom: keep, Snapshot: snap, Meta: encodeCheckpointMeta(below)}); err != nil {
		c.failures.Inc()
		return err
	}
	c.total.Inc()
	c.duration.Observe(time.Since(start).Seconds())
	c.size.Set(float64(len(snap)))
	c.index.Set(float64(index))
	return nil
}

// checkpointBase is the sync log's first held index and, per replica, how
// many of its changes come before it: what a checkpoint keeping the
// records from that index needs to rebuild the log (restoreBase). 0 when
// the log never held a change.
func (l *syncLog) checkpointBase() (uint64, vector) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.base, l.trimmed.clone()
}

// restoreBase starts an empty log at index base, with below[r] of replica
// r's changes before it (held, durable, and trimmed: no peer is sent them
// from here again). The records from base on follow with add.
func (l *syncLog) restoreBase(base uint64, below vector) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.entries) != 0 || l.base != 0 {
		return fmt.Errorf("edge: sync log: restore at %d into a log holding changes from %d", base, l.base)
	}
	l.base = base
	l.durable = base - 1
	l.trimmed = below.clone()
	l.applied = below.clone()
	l.dvec = below.clone()
	return nil
}

// checkpointMetaVersion prefixes the checkpoint's meta, so a later format
// is told apart instead of misread.
const checkpointMetaVersion = 1

// encodeCheckpointMeta is version | count uint32 | count x (replica uint64,
// changes uint64), replicas ascending (canonical: equal vectors encode
// alike).
func encodeCheckpointMeta(below vector) []byte {
	rs := make([]core.ReplicaID, 0, len(below))
	for r, n := range below {
		if n > 0 {
			rs = append(rs, r)
		}
	}
	slices.Sort(rs)
	b := make([]byte, 0, 5+16*len(rs))
	b = append(b, checkpointMetaVersion)
	b = binary.BigEndian.AppendUint32(b, uint32(len(rs)))
	for _, r := range rs {
		b = binary.BigEndian.AppendUint64(b, uint64(r))
		b = binary.BigEndian.AppendUint64(b, below[r])
	}
	return b
}

func decodeCheckpointMeta(b []byte) (vector, error) {
	if len(b) < 5 || b[0] != checkpointMetaVersion {
		return nil, fmt.Errorf("checkpoint meta: %d bytes, version %v: not this build's format", len(b), b[:min(len(b), 1)])
	}
	n := binary.BigEndian.Uint32(b[1:])
	if uint64(len(b)-5) != 16*uint64(n) {
		return nil, fmt.Errorf("checkpoint meta: %d entries in %d bytes", n, len(b)-5)
	}
	v := make(vector, n)
	var prev uint64
	for p := b[5:]; len(p) > 0; p = p[16:] {
		r := binary.BigEndian.Uint64(p)
		if len(v) > 0 && r <= prev {
			return nil, fmt.Errorf("checkpoint meta: replica %x after %x: not in ascending order", r, prev)
		}
		v[core.ReplicaID(r)], prev = binary.BigEndian.Uint64(p[8:]), r
	}
	return v, nil
}

// restoreCheckpoint makes the checkpoint's state this server's and starts
// the sync log where the checkpoint kept the records from.
func (s *Server) restoreCheckpoint(cp storage.Checkpoint) error {
	st, err := core.Restore(core.ReplicaID(s.memberID), cp.Snapshot)
	if err != nil {
		return fmt.Errorf("restore the checkpoint at index %d: %w", cp.Index, err)
	}
	if st.Index() != cp.Index {
		return fmt.Errorf("the checkpoint at index %d holds a state at index %d", cp.Index, st.Index())
	}
	below, err := decodeCheckpointMeta(cp.Meta)
	if err != nil {
		return fmt.Errorf("the checkpoint at index %d: %w", cp.Index, err)
	}
	if err := s.sync.log.restoreBase(cp.KeepFrom, below); err != nil {
		return err
	}
	s.st = st
	return nil
}
