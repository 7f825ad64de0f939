package edge

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/aethermesh/aether/edge/internal/storage"
	"github.com/aethermesh/aether/internal/testutil/wait"
)

// replicaView is what a client can observe of one replica: it must be the
// same before a restart and after (from a checkpoint).
type replicaView struct {
	rev, compacted int64
	hash, hashMid  uint32
	mid            int64
	kvs            []string // key=value@mod/create/version, sorted by key
	events         []string // every event since the compaction
	leases         []int64
}

func observe(ctx context.Context, t *testing.T, s *Server) replicaView {
	t.Helper()
	cli := newClientQuiet(t, s)
	var v replicaView
	h, err := cli.HashKV(ctx, s.ClientURLs()[0], 0)
	if err != nil {
		t.Fatalf("HashKV: %v", err)
	}
	v.hash, v.rev, v.compacted = h.Hash, h.Header.Revision, h.CompactRevision
	// A past revision still retained: its hash is a function of that
	// revision's state, so the history survived, not only the head.
	v.mid = (max(v.compacted, 1) + v.rev) / 2
	hm, err := cli.HashKV(ctx, s.ClientURLs()[0], v.mid)
	if err != nil {
		t.Fatalf("HashKV at %d: %v", v.mid, err)
	}
	v.hashMid = hm.Hash
	all, err := cli.Get(ctx, "", clientv3.WithFromKey(), clientv3.WithRev(v.rev))
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range all.Kvs {
		v.kvs = append(v.kvs, fmt.Sprintf("%s=%s@%d/%d/%d/lease %d", kv.Key, kv.Value, kv.ModRevision, kv.CreateRevision, kv.Version, kv.Lease))
	}
	if v.rev > v.compacted+1 {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		for resp := range cli.Watch(wctx, "", clientv3.WithFromKey(), clientv3.WithRev(v.compacted+1)) {
			if err := resp.Err(); err != nil {
				t.Fatalf("watch from %d: %v", v.compacted+1, err)
			}
			for _, ev := range resp.Events {
				v.events = append(v.events, fmt.Sprintf("%v %s=%s@%d", ev.Type, ev.Kv.Key, ev.Kv.Value, ev.Kv.ModRevision))
			}
			if n := len(resp.Events); n > 0 && resp.Events[n-1].Kv.ModRevision >= v.rev {
				break
			}
		}
	}
	ls, err := cli.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls.Leases {
		v.leases = append(v.leases, int64(l.ID))
	}
	slices.Sort(v.leases)
	return v
}

func sameView(t *testing.T, what string, a, b replicaView) {
	t.Helper()
	if a.rev != b.rev || a.compacted != b.compacted || a.hash != b.hash || a.mid != b.mid || a.hashMid != b.hashMid {
		t.Fatalf("%s: revision %d compacted %d HashKV %d (at %d: %d) before; %d, %d, %d (at %d: %d) after",
			what, a.rev, a.compacted, a.hash, a.mid, a.hashMid, b.rev, b.compacted, b.hash, b.mid, b.hashMid)
	}
	if !slices.Equal(a.kvs, b.kvs) {
		t.Fatalf("%s: keys differ:\nbefore %v\nafter  %v", what, a.kvs, b.kvs)
	}
	if !slices.Equal(a.events, b.events) {
		t.Fatalf("%s: %d events before, %d after, or they differ", what, len(a.events), len(b.events))
	}
	if !slices.Equal(a.leases, b.leases) {
		t.Fatalf("%s: leases %v before, %v after", what, a.leases, b.leases)
	}
}

func storedRecords(t *testing.T, dir string) (first uint64, n int) {
	t.Helper()
	l, err := storage.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := l.Load(func(r storage.Record) error {
		if n == 0 {
			first = r.Index
		}
		n++
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return first, n
}

// TestCheckpointRestart: a replica that checkpointed (with writes,
// deletes, leases, transactions and a compaction before and after the
// checkpoint) restarts from it into the state it had: revision, every
// retained revision's HashKV, keys with their versions, the events since
// the compaction, leases; and goes on at the next revision. Without GC the
// log is kept whole (keep-from 1).
func TestCheckpointRestart(t *testing.T) {
	dir := t.TempDir()
	manual := func(cfg *Config) { cfg.CheckpointChanges, cfg.CheckpointBytes, cfg.DisableHistoryGC = -1, -1, true }
	s := startServer(t, dir, manual)
	ctx := testCtx(t)
	load(ctx, t, s, "a", 1, 200)
	if _, err := newClient(t, s).Compact(ctx, 100); err != nil {
		t.Fatal(err)
	}
	load(ctx, t, s, "a", 2, 100)
	if err := s.checkpointNow(ctx); err != nil {
		t.Fatal(err)
	}
	load(ctx, t, s, "a", 3, 50) // replayed after the snapshot
	before := observe(ctx, t, s)
	closeServer(t, s)
	cp, ok := lastCheckpoint(t, dir)
	if !ok || cp.KeepFrom != 1 {
		t.Fatalf("checkpoint %+v (%v): want one keeping the whole log (no GC)", cp, ok)
	}

	s = startServer(t, dir, manual)
	sameView(t, "restart after a checkpoint", before, observe(ctx, t, s))
	resp, err := newClient(t, s).Put(ctx, "next", "v")
	if err != nil {
		t.Fatal(err)
	}
	if resp.Header.Revision != before.rev+1 {
		t.Fatalf("first put after the restart got revision %d, want %d", resp.Header.Revision, before.rev+1)
	}
	// And once more, from a checkpoint taken by a restored replica.
	if err := s.checkpointNow(ctx); err != nil {
		t.Fatal(err)
	}
	again := observe(ctx, t, s)
	closeServer(t, s)
	s = startServer(t, dir, manual)
	sameView(t, "second restart", again, observe(ctx, t, s))
}

func lastCheckpoint(t *testing.T, dir string) (storage.Checkpoint, bool) {
	t.Helper()
	l, err := storage.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	cp, ok, err := l.LastCheckpoint()
	if err != nil {
		t.Fatal(err)
	}
	return cp, ok
}

// TestCheckpointTriggers: the periodic checkpoint runs once the change
// count is reached, and again after as many more.
func TestCheckpointTriggers(t *testing.T) {
	s := startServer(t, "", func(cfg *Config) { cfg.CheckpointChanges, cfg.CheckpointBytes = 50, -1 })
	ctx := testCtx(t)
	load(ctx, t, s, "a", 1, 40)
	if n := metricValue(t, s.reg, "aether_edge_checkpoints_total", ""); n != 0 {
		t.Fatalf("%v checkpoints after 40 changes, want none before 50", n)
	}
	load(ctx, t, s, "a", 2, 70)
	wait.For(t, "a checkpoint after 50 changes", 10*time.Second, func() bool {
		return metricValue(t, s.reg, "aether_edge_checkpoints_total", "") >= 1
	})
	load(ctx, t, s, "a", 3, 120)
	wait.For(t, "a second checkpoint", 10*time.Second, func() bool {
		return metricValue(t, s.reg, "aether_edge_checkpoints_total", "") >= 2
	})
	if f := metricValue(t, s.reg, "aether_edge_checkpoint_failures_total", ""); f != 0 {
		t.Fatalf("%v checkpoint failures", f)
	}
}

// TestCheckpointByteTrigger: large changes trigger a checkpoint by bytes
// long before the change count.
func TestCheckpointByteTrigger(t *testing.T) {
	s := startServer(t, "", func(cfg *Config) { cfg.CheckpointChanges, cfg.CheckpointBytes = 1000000, 1<<20 })
	ctx := testCtx(t)
	cli := newClient(t, s)
	big := string(make([]byte, 64<<10))
	for i := 0; i < 20; i++ { // 1.25 MiB
		if _, err := cli.Put(ctx, fmt.Sprintf("big/%d", i), big); err != nil {
			t.Fatal(err)
		}
	}
	wait.For(t, "a checkpoint after 1 MiB of changes", 10*time.Second, func() bool {
		return metricValue(t, s.reg, "aether_edge_checkpoints_total", "") >= 1
	})
}

// TestCheckpointGCClusterRestart: in a cluster with history GC, a
// replica's checkpoints delete the records every peer holds; stopped,
// it restarts from its checkpoint into the same state, its peers write on
// meanwhile, and all converge (same vector, same HashKV), with
// replication going on in both directions after.
func TestCheckpointGCClusterRestart(t *testing.T) {
	names := []string{"a", "b", "c"}
	c := gcCluster(t, names, 0)
	gcMod := c.mod
	c.mod = func(n string, cfg *Config) {
		gcMod(n, cfg)
		cfg.CheckpointChanges, cfg.CheckpointBytes = 100, -1
	}
	for _, n := range names {
		c.start(n)
	}
	ctx := testCtx(t)
	var wg sync.WaitGroup
	for i, n := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			load(ctx, t, c.srv[n], n, uint64(i+1), 150)
		}()
	}
	wg.Wait()
	waitGCConverged(t, c.running())
	b := c.srv["b"]
	wait.For(t, "b's log to be trimmed", 20*time.Second, func() bool { return logLen(b) == 0 })
	if err := b.checkpointNow(ctx); err != nil {
		t.Fatal(err)
	}
	before := observe(ctx, t, b)
	applied := total(b.sync.log.durableVector())
	c.stop("b")
	cp, _ := lastCheckpoint(t, c.dirs["b"])
	first, n := storedRecords(t, c.dirs["b"])
	if cp.KeepFrom <= 1 || n != 0 {
		t.Fatalf("b checkpointed at %d keeping from %d, %d records stored from %d: want the log cut at what every peer holds (all %d)", cp.Index, cp.KeepFrom, n, first, applied)
	}

	b = c.start("b")
	sameView(t, "b restarted from its checkpoint", before, observe(ctx, t, b))
	if got := total(b.sync.log.durableVector()); got != uint64(applied) {
		t.Fatalf("b's vector after the restart counts %d changes, before %d", got, applied)
	}
	// Peers wrote nothing meanwhile; now all three do, and converge.
	for i, n := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			load(ctx, t, c.srv[n], n, uint64(10+i), 60)
		}()
	}
	wg.Wait()
	waitGCConverged(t, c.running())

	// A restart while its peers write: b comes back lacking their latest
	// changes and catches up from their logs.
	c.stop("b")
	load(ctx, t, c.srv["a"], "a", 20, 80)
	load(ctx, t, c.srv["c"], "c", 21, 80)
	c.start("b")
	waitGCConverged(t, c.running())
}

// TestCheckpointMetaRoundTrip: the meta is canonical and refuses what it
// did not write.
func TestCheckpointMetaRoundTrip(t *testing.T) {
	v := vector{3: 7, 1: 2, 9: 0}
	b := encodeCheckpointMeta(v)
	got, err := decodeCheckpointMeta(b)
	if err != nil || len(got) != 2 || got[1] != 2 || got[3] != 7 {
		t.Fatalf("round trip of %v = %v, %v", v, got, err)
	}
	if again := encodeCheckpointMeta(vector{1: 2, 3: 7}); string(again) != string(b) {
		t.Error("equal vectors encode differently")
	}
	for name, bad := range map[string][]byte{
		"empty":      nil,
		"version":    append([]byte{2}, b[1:]...),
		"truncated":  b[:len(b)-1],
		"unordered":  append(append([]byte{1, 0, 0, 0, 2}, b[5+16:]...), b[5:5+16]...),
		"extra byte": append(append([]byte{}, b...), 0),
	} {
		if _, err := decodeCheckpointMeta(bad); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
}
