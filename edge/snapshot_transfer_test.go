package edge

import (
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	"github.com/aethermesh/aether/edge/internal/core"
	"github.com/aethermesh/aether/internal/testutil/watchcheck"
)

// newGCMesh is newMesh (mesh_test.go) with history GC on, the retention
// given and the replicas on clock now (nil: the machine's).
func newGCMesh(t *testing.T, names []string, retention time.Duration, now func() time.Time) *mesh {
	t.Helper()
	return newGCMeshWith(t, names, retention, now, nil)
}

// newGCMeshWith is newGCMesh with mod applied to each replica's config
// last (nil: none).
func newGCMeshWith(t *testing.T, names []string, retention time.Duration, now func() time.Time, mod func(name string, cfg *Config)) *mesh {
	t.Helper()
	return newMeshWith(t, names, 21, func(name string, cfg *Config) {
		if mod != nil {
			defer mod(name, cfg)
		}
		// history GC is on by default
		cfg.PeerRetention = retention
		if now != nil {
			cfg.Now = now
		}
		if testing.Verbose() {
			cfg.Logger = slog.New(slog.NewTextHandler(tlogWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})).With("replica", name)
		}
	})
}

// tlogWriter sends a replica's log lines to the test's log (-v only).
type tlogWriter struct{ t *testing.T }

func (w tlogWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(b), "\n"))
	return len(b), nil
}

// newestReport is the newest vector s knows member id reported.
func newestReport(s *Server, id uint64) vector {
	for _, m := range s.sync.stab.snapshot() {
		if m.id == id {
			return m.newest.clone()
		}
	}
	return nil
}

func tombstones(s *Server) int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.st.Tombstones()
}

// TestGCStabilityWaitsForInFlightChange: c puts x while its pushes are cut
// off, a then deletes x (a later stamp: the put must lose), c receives
// the delete and acks it. Every member's newest report then covers the
// delete: the naive minimum of acked vectors would call it stable and
// collect its compacted tombstone, and c's put, arriving later, would
// bring x back at a. c's report counts its put, which a lacks, so it is
// not usable at a: the delete stays unstable and its tombstone kept until
// the put arrived and lost; then it is collected.
func TestGCStabilityWaitsForInFlightChange(t *testing.T) {
	names := []string{"a", "b", "c"}
	m := newGCMesh(t, names, 0, nil)
	a, b, c := m.c.srv["a"], m.c.srv["b"], m.c.srv["c"]
	ctx := testCtx(t)
	ca, cc := newClient(t, a), newClient(t, c)
	if _, err := ca.Put(ctx, "x", "v0"); err != nil {
		t.Fatal(err)
	}
	waitGCConverged(t, m.c.running())
	ra, rc := core.ReplicaID(a.MemberID()), core.ReplicaID(c.MemberID())

	m.links[[2]string{"c", "a"}].Blackhole()
	m.links[[2]string{"c", "b"}].Blackhole()
	if _, err := cc.Put(ctx, "x", "late"); err != nil {
		t.Fatal(err)
	}
	putSeq := c.sync.log.durableVector()[rc]
	del, err := ca.Delete(ctx, "x")
	if err != nil || del.Deleted != 1 {
		t.Fatalf("delete x at a: %v, %+v", err, del)
	}
	delSeq := a.sync.log.durableVector()[ra]
	eventually(t, 20*time.Second, "c's and b's reports at a to cover the delete", func() bool {
		vc, vb := newestReport(a, c.MemberID()), newestReport(a, b.MemberID())
		return vc[ra] >= delSeq && vc[rc] >= putSeq && vb[ra] >= delSeq
	})
	// The naive rule: a's durable vector and every member's newest report.
	naive := a.sync.log.durableVector()
	for _, id := range []uint64{b.MemberID(), c.MemberID()} {
		r := newestReport(a, id)
		for k, n := range naive {
			naive[k] = min(n, r[k])
		}
	}
	if naive[ra] < delSeq {
		t.Fatalf("naive stable point %v does not cover the delete (a's change %d): the test shows nothing", naive, delSeq)
	}
	// Compacted past the delete (etcd keeps a tombstone at the compaction
	// revision itself), x is a tombstone-only record: kept for its winner
	// until stable. Several acks go by (probes every 100 ms): it must stay.
	after, err := ca.Put(ctx, "after", "1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ca.Compact(ctx, after.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	if n := tombstones(a); n != 1 {
		t.Fatalf("after compaction a keeps %d tombstone-only records, want 1 (x)", n)
	}
	rounds := metricValue(t, a.reg, "aether_edge_sync_rounds_total", "c")
	eventually(t, 20*time.Second, "more rounds between a and c", func() bool {
		return metricValue(t, a.reg, "aether_edge_sync_rounds_total", "c") >= rounds+5
	})
	if st := a.sync.stable(); st[ra] >= delSeq {
		t.Fatalf("stable point %v covers the delete while c's put (its change %d) is in flight", st, putSeq)
	}
	if n := tombstones(a); n < 1 {
		t.Fatalf("a collected x's tombstone while c's concurrent put was in flight (tombstones %d)", n)
	}

	m.heal()
	waitGCConverged(t, m.c.running())
	for _, s := range m.c.running() {
		resp, err := newClientQuiet(t, s).Get(ctx, "x")
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) != 0 {
			t.Fatalf("x came back: %q", resp.Kvs[0].Value)
		}
	}
	eventually(t, 20*time.Second, "a to collect x's tombstone once c's put arrived", func() bool {
		return a.sync.stable()[ra] >= delSeq && tombstones(a) == 0 &&
			metricValue(t, a.reg, "aether_edge_gc_collected_keys_total", "") >= 1
	})
}

// TestGCSnapshotRebootstrap: c is cut off past --peer-retention while a
// and b write, delete, compact and collect; c writes too. On heal c is
// re-bootstrapped by snapshot (a transfer, not a replay: a and b no longer
// hold the changes), the replicas converge, c's acknowledged writes
// survive, the keys deleted while it was away stay deleted, c's watcher
// sees ordinary events in revision order, and c restarts into the same
// state (the merge was checkpointed). While c checkpoints a merge, the
// vector it reports to peers does not include it yet: a kill then would
// take the merge back, and a peer told of it would never send the
// snapshot again.
func TestGCSnapshotRebootstrap(t *testing.T) {
	names := []string{"a", "b", "c"}
	const retention = 10 * time.Second
	clk := &offsetClock{}
	// c's first merge brings what a and b wrote while it was away: at
	// its checkpoint the vector c reports (acks, hellos) must still lack
	// it. (-1: no merge yet.)
	var (
		merges    sync.Mutex
		firstNews = -1
	)
	m := newGCMeshWith(t, names, retention, clk.now, func(name string, cfg *Config) {
		if name != "c" {
			return
		}
		cfg.beforeMergeCheckpoint = func(s *Server, v vector) {
			told := s.sync.log.durableVector()
			merges.Lock()
			defer merges.Unlock()
			if firstNews < 0 {
				firstNews = int(v.lacks(told))
			}
		}
	})
	a, b, c := m.c.srv["a"], m.c.srv["b"], m.c.srv["c"]
	ctx := testCtx(t)
	ca, cc := newClient(t, a), newClient(t, c)
	for i := range 10 {
		if _, err := ca.Put(ctx, fmt.Sprintf("k%d", i), "v0"); err != nil {
			t.Fatal(err)
		}
	}
	waitGCConverged(t, m.c.running())
	c.mu.RLock()
	from := c.st.Rev() + 1
	c.mu.RUnlock()
	watch := recordWatch(t, c, "c-all", "", from)

	// Cut, not blackholed: a blackholed stream stalls and resumes on heal
	// with what was sent meanwhile (a replay), while c must come back
	// lacking what a and b dropped.
	m.cut("a", "c")
	m.cut("b", "c")
	var cWrites []string
	for i := range 5 {
		k, v := fmt.Sprintf("c/%d", i), fmt.Sprintf("away-%d", i)
		if _, err := cc.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
		cWrites = append(cWrites, k+"="+v)
	}
	var last int64
	for i := range 5 {
		resp, err := ca.Put(ctx, fmt.Sprintf("k%d", i), "v1")
		if err != nil {
			t.Fatal(err)
		}
		last = resp.Header.Revision
	}
	for i := 5; i < 8; i++ {
		resp, err := ca.Delete(ctx, fmt.Sprintf("k%d", i))
		if err != nil {
			t.Fatal(err)
		}
		last = resp.Header.Revision
	}
	// etcd keeps a tombstone at the compaction revision itself: compact
	// past the last delete.
	resp, err := ca.Put(ctx, "after", "1")
	if err != nil {
		t.Fatal(err)
	}
	last = resp.Header.Revision
	waitGCConverged(t, []*Server{a, b})
	for _, s := range []*Server{a, b} {
		if _, err := newClientQuiet(t, s).Compact(ctx, last, clientv3.WithCompactPhysical()); err != nil {
			t.Fatal(err)
		}
	}
	// Past the retention in steps shorter than it, each waiting for a and
	// b to hear each other again: only c goes unheard for that long.
	for range 4 {
		clk.advance(retention / 3)
		at := clk.now()
		eventually(t, 20*time.Second, "a and b to ack each other", func() bool {
			return !a.sync.byID[b.memberID].state().lastSync.Before(at) && !b.sync.byID[a.memberID].state().lastSync.Before(at)
		})
	}
	for _, s := range []*Server{a, b} {
		eventually(t, 20*time.Second, s.cfg.Name+" to stop waiting for c and collect", func() bool {
			holds := metricValue(t, s.reg, "aether_edge_gc_peer_holds", "c")
			keys := metricValue(t, s.reg, "aether_edge_gc_collected_keys_total", "")
			t.Logf("%s: holds{c}=%v log=%d collected keys=%v tombstones=%d", s.cfg.Name, holds, logLen(s), keys, tombstones(s))
			return holds == 0 && logLen(s) == 0 && keys >= 3
		})
	}

	m.heal()
	eventually(t, 30*time.Second, "c to be re-bootstrapped by snapshot", func() bool {
		return metricValue(t, c.reg, "aether_edge_snapshot_transfers_received_total", "a")+
			metricValue(t, c.reg, "aether_edge_snapshot_transfers_received_total", "b") >= 1
	})
	waitGCConverged(t, m.c.running())
	merges.Lock()
	switch firstNews {
	case -1:
		t.Error("c merged no snapshot")
	case 0:
		t.Error("c's first merged snapshot was in the vector it reports before its checkpoint was durable: a kill then would take back what peers were told")
	}
	merges.Unlock()
	for _, s := range m.c.running() {
		kv := map[string]string{}
		resp, err := newClientQuiet(t, s).Get(ctx, "", clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range resp.Kvs {
			kv[string(x.Key)] = string(x.Value)
		}
		for _, w := range cWrites {
			k, v := w[:len("c/0")], w[len("c/0")+1:]
			if kv[k] != v {
				t.Fatalf("%s: c's acknowledged write %s is %q", s.cfg.Name, w, kv[k])
			}
		}
		for i := range 10 {
			k := fmt.Sprintf("k%d", i)
			want := map[bool]string{true: "v1", false: ""}[i < 5]
			if i >= 8 {
				want = "v0"
			}
			if kv[k] != want {
				t.Fatalf("%s: %s = %q, want %q (deleted keys must stay deleted)", s.cfg.Name, k, kv[k], want)
			}
		}
	}
	checkEventWatch(t, c, "c", watch)

	m.c.stop("c")
	m.c.start("c")
	waitGCConverged(t, m.c.running())
}

// checkEventWatch runs watchcheck on a watch of s against s's history as
// its core recorded it (events by revision: a merged snapshot's revision
// has no change hash, so mesh_test.go's replicaHistory cannot be used).
func checkEventWatch(t *testing.T, s *Server, name string, r *watchRec) {
	t.Helper()
	s.mu.RLock()
	evs, err := s.st.Events(max(2, s.st.CompactRev()+1), []byte{0}, []byte{0})
	rev := s.st.Rev()
	s.mu.RUnlock()
	if err != nil {
		t.Fatal(err)
	}
	byRev := map[int64][]*mvccpb.Event{}
	for _, ev := range evs {
		byRev[ev.Kv.ModRevision] = append(byRev[ev.Kv.ModRevision], ev)
	}
	revs := make([]int64, 0, len(byRev))
	for r := range byRev {
		revs = append(revs, r)
	}
	sort.Slice(revs, func(i, j int) bool { return revs[i] < revs[j] })
	var hist []revChange
	for _, rv := range revs {
		hist = append(hist, revChange{rev: rv, events: byRev[rv]})
	}
	eventually(t, 15*time.Second, r.name+" to reach revision "+fmt.Sprint(rev), func() bool { return r.lastRev() >= rev })
	r.mu.Lock()
	werr := r.err
	r.mu.Unlock()
	if werr != nil {
		t.Fatalf("%s: watch error %v", r.name, werr)
	}
	wh := newWatchHistory("edge-"+name, hist)
	rec := wh.recorder(r)
	if vs := watchcheck.Check(wh.h, rec); len(vs) > 0 {
		t.Fatalf("%s: watch guarantees broken:\n%s", name, watchcheck.Summary(vs))
	}
	events := 0
	for _, msg := range rec.Messages() {
		if msg.GetType() != registrarv1.EndpointEvent_PROGRESS {
			events++
		}
	}
	if events == 0 {
		t.Fatalf("%s: the watch saw no events: the check is vacuous", name)
	}
}
