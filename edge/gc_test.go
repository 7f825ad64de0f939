package edge

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	edgev1 "github.com/aethermesh/aether/api/edge/v1"
	"github.com/aethermesh/aether/edge/internal/core"
)

// gcCluster is a test cluster whose replicas trim their sync logs.
func gcCluster(t *testing.T, names []string, retention time.Duration) *testCluster {
	c := newTestCluster(t, names, nil)
	c.mod = func(_ string, cfg *Config) {
		cfg.DisableHistoryGC = false // the default, said for the reader
		cfg.PeerRetention = retention
	}
	return c
}

func logLen(s *Server) int {
	n, _ := s.sync.log.stats()
	return n
}

// gcConverged: with the logs trimmed, "the same changes" is the same
// durable vector (sync.go: a vector is a replica's whole history), and
// then the same HashKV.
func gcConverged(ctx context.Context, t *testing.T, ss []*Server) bool {
	t.Helper()
	var first vector
	var hash uint32
	for i, s := range ss {
		v := s.sync.log.durableVector()
		resp, err := newClientQuiet(t, s).HashKV(ctx, s.ClientURLs()[0], 0)
		if err != nil {
			t.Fatalf("HashKV: %v", err)
		}
		if i == 0 {
			first, hash = v, resp.Hash
			continue
		}
		if !mapsEqual(first, v) || resp.Hash != hash {
			return false
		}
	}
	return true
}

func waitGCConverged(t *testing.T, ss []*Server) {
	t.Helper()
	ctx := testCtx(t)
	eventually(t, 30*time.Second, "replicas to converge", func() bool { return gcConverged(ctx, t, ss) })
}

func total(v vector) uint64 {
	var n uint64
	for _, c := range v {
		n += c
	}
	return n
}

// TestSyncLogTrim: the log drops the longest durable prefix the stable
// vector covers (position then answers from the core: syncer.position)
// and refuses a cursor for a peer lacking a dropped change.
func TestSyncLogTrim(t *testing.T) {
	l := newSyncLog(time.Now)
	order := []core.ReplicaID{1, 2, 1, 3, 2, 1} // a1 b1 a2 c1 b2 a3
	var ids []core.Hash
	for i, r := range order {
		var id core.Hash
		id[0] = byte(i + 1)
		ids = append(ids, id)
		if err := l.add(uint64(i+1), id, []byte{byte(i + 1)}, r, false); err != nil {
			t.Fatal(err)
		}
	}
	if n := l.trim(vector{1: 3, 2: 2, 3: 1}); n != 0 {
		t.Fatalf("trimmed %d changes before any was durable", n)
	}
	l.markDurable(5)
	// a2 is stable, c1 is not: the prefix stops at c1 although b2 is.
	if n := l.trim(vector{1: 2, 2: 2}); n != 3 {
		t.Fatalf("trimmed %d, want 3 (a1 b1 a2)", n)
	}
	if n, _ := l.stats(); n != 3 {
		t.Fatalf("%d entries left, want 3", n)
	}
	if _, _, ok := l.position(ids[2]); ok {
		t.Fatal("the log still answers for trimmed a2")
	}
	if r, seq, ok := l.position(ids[3]); !ok || r != 3 || seq != 1 {
		t.Fatalf("position of c1 = %d %d %v", r, seq, ok)
	}
	if _, err := l.newCursor(vector{1: 1, 2: 1}); err == nil {
		t.Fatal("a peer lacking trimmed a2 got a cursor")
	}
	cur, err := l.newCursor(vector{1: 2, 2: 1})
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := l.take(cur, nil, 100, 1<<20)
	if err != nil || len(got) != 2 || got[0][0] != 4 || got[1][0] != 5 {
		t.Fatalf("take after trim = %v, %v; want c1 b2", got, err)
	}
	// A cursor GC overtook is refused unless its peer holds what went.
	stale := &cursor{next: 1, sent: vector{}}
	if _, _, err := l.take(stale, vector{1: 1}, 100, 1<<20); err == nil {
		t.Fatal("a cursor behind the GC point was served")
	}
	ok := &cursor{next: 1, sent: vector{}}
	if _, _, err := l.take(ok, vector{1: 2, 2: 1}, 100, 1<<20); err != nil {
		t.Fatalf("a cursor whose peer holds the trimmed changes: %v", err)
	}
	// The chains stay aligned: lag from a peer holding a2 is c1's age.
	if _, found := l.oldestLacking(vector{1: 2, 2: 1}); !found {
		t.Fatal("oldestLacking found nothing")
	}
	l.markDurable(6)
	if n := l.trim(vector{1: 3, 2: 2, 3: 1}); n != 3 {
		t.Fatalf("trimmed %d, want 3", n)
	}
	if n, b := l.stats(); n != 0 || b != 0 {
		t.Fatalf("stats after trimming all = %d, %d", n, b)
	}
	if err := l.add(7, core.Hash{7}, []byte{7}, 2, true); err != nil {
		t.Fatalf("add after trimming all: %v", err)
	}
}

// TestGCLogShrinksAfterAllPeersAck: three replicas, writes at each; once
// every peer acked, every log is empty, the GC point is every change, and
// replication goes on.
func TestGCLogShrinksAfterAllPeersAck(t *testing.T) {
	names := []string{"a", "b", "c"}
	c := gcCluster(t, names, 0)
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
	for _, n := range names {
		s := c.srv[n]
		want := total(s.sync.log.durableVector())
		eventually(t, 20*time.Second, n+"'s log to be trimmed", func() bool {
			return logLen(s) == 0 && metricValue(t, s.reg, "aether_edge_gc_point_changes", "") == float64(want)
		})
		if got := metricValue(t, s.reg, "aether_edge_gc_trimmed_changes_total", ""); got != float64(want) {
			t.Fatalf("%s trimmed %v changes, want %d", n, got, want)
		}
	}
	// A hash below the GC point is still known: WaitReplicated answers.
	put, err := newClient(t, c.srv["a"]).Put(ctx, "after", "gc")
	if err != nil {
		t.Fatal(err)
	}
	waitGCConverged(t, c.running())
	eventually(t, 20*time.Second, "a's log to be trimmed again", func() bool { return logLen(c.srv["a"]) == 0 })
	hs, err := extClient(t, c.srv["a"]).Heads(ctx, &edgev1.HeadsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := extClient(t, c.srv["a"]).WaitReplicated(wctx, &edgev1.WaitReplicatedRequest{Hashes: hs.Heads, Replicas: 3}); err != nil {
		t.Fatalf("WaitReplicated on a trimmed change (rev %d): %v", put.Header.Revision, err)
	}
}

// TestGCAbsentPeerHoldsBack: without a retention, a stopped peer holds
// the stable point where it left; on return it is caught up from the log
// and then the logs are trimmed.
func TestGCAbsentPeerHoldsBack(t *testing.T) {
	names := []string{"a", "b", "c"}
	c := gcCluster(t, names, 0)
	for _, n := range names {
		c.start(n)
	}
	ctx := testCtx(t)
	acked := []map[string][]string{load(ctx, t, c.srv["a"], "a", 1, 30)}
	waitGCConverged(t, c.running())
	c.stop("c")
	acked = append(acked, load(ctx, t, c.srv["a"], "a", 2, 100), load(ctx, t, c.srv["b"], "b", 3, 100))
	waitGCConverged(t, c.running())
	// Every change since c left is one c lacks: none may go.
	for _, n := range []string{"a", "b"} {
		if got := logLen(c.srv[n]); got < 200 {
			t.Fatalf("%s's log holds %d changes; c lacks at least 200", n, got)
		}
		if h := metricValue(t, c.srv[n].reg, "aether_edge_gc_peer_holds", "c"); h != 1 {
			t.Fatalf("%s: gc_peer_holds{c} = %v, want 1 (no retention)", n, h)
		}
	}
	c.start("c")
	waitGCConverged(t, c.running())
	for _, n := range names {
		eventually(t, 20*time.Second, n+"'s log to be trimmed", func() bool { return logLen(c.srv[n]) == 0 })
	}
	_ = acked
}

// TestGCLogFlatUnderSustainedWrites measures the sync log's length and the
// heap over a sustained write load at one of two replicas, with compaction
// each round, with GC and without.
func TestGCLogFlatUnderSustainedWrites(t *testing.T) {
	if testing.Short() {
		t.Skip("load test")
	}
	const rounds, perRound, writers = 6, 1000, 8
	for _, gc := range []bool{true, false} {
		t.Run(fmt.Sprintf("gc=%v", gc), func(t *testing.T) {
			c := newTestCluster(t, []string{"a", "b"}, nil)
			c.mod = func(_ string, cfg *Config) { cfg.DisableHistoryGC = !gc }
			a := c.start("a")
			c.start("b")
			ctx := testCtx(t)
			cli := newClient(t, a)
			var lens []int
			for r := range rounds {
				var wg sync.WaitGroup
				for w := range writers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := range perRound / writers {
							if _, err := cli.Put(ctx, fmt.Sprintf("k%03d", (w*perRound+i)%200), fmt.Sprintf("v%d-%d", r, i)); err != nil {
								t.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
				waitGCConverged(t, c.running())
				// Compaction is local: each replica compacts its own history.
				for _, s := range c.running() {
					sc := newClientQuiet(t, s)
					resp, err := sc.Get(ctx, "k000")
					if err != nil {
						t.Fatal(err)
					}
					if _, err := sc.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
						t.Fatal(err)
					}
				}
				if gc {
					eventually(t, 20*time.Second, "a's log to be trimmed", func() bool { return logLen(a) == 0 })
				}
				runtime.GC()
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				n, b := a.sync.log.stats()
				lens = append(lens, n)
				t.Logf("gc=%v after %d writes: sync log %d changes (%d bytes), heap in use %.1f MiB (both replicas, one process)",
					gc, (r+1)*perRound, n, b, float64(ms.HeapInuse)/(1<<20))
			}
			if gc && lens[len(lens)-1] != 0 {
				t.Fatalf("log lengths %v: not flat", lens)
			}
			if !gc && lens[len(lens)-1] < rounds*perRound {
				t.Fatalf("without GC the log holds %d of %d changes", lens[len(lens)-1], rounds*perRound)
			}
		})
	}
}

// TestGCWithoutPeers: with no peer to ack, the replica's own durable
// writes move the stable point, so a lone replica's log stays empty.
func TestGCWithoutPeers(t *testing.T) {
	c := gcCluster(t, []string{"a"}, 0)
	a := c.start("a")
	load(testCtx(t), t, a, "a", 1, 50)
	eventually(t, 10*time.Second, "a's log to be trimmed", func() bool { return logLen(a) == 0 })
}

// TestGCLineTopologyRelaysReports: with sync peers a line a - b - c, a and
// c never talk, yet each must learn the other's durable vector to collect
// anything (stability is over every member, not only sync peers): b relays
// the reports it knows on its acks (Ack.members). After writes and deletes
// at both ends, every replica trims its log to nothing and collects the
// tombstones, and each end holds a usable report of the other end, learnt
// only through b. Without the relay a and c would hold GC back forever.
func TestGCLineTopologyRelaysReports(t *testing.T) {
	names := []string{"a", "b", "c"}
	c := newTestCluster(t, names, map[string][]string{"a": {"b"}, "b": {"a", "c"}, "c": {"b"}})
	for _, n := range names {
		c.start(n)
	}
	ctx := testCtx(t)
	for _, n := range []string{"a", "c"} {
		cl := newClient(t, c.srv[n])
		for i := range 20 {
			if _, err := cl.Put(ctx, fmt.Sprintf("%s/%d", n, i), "v"); err != nil {
				t.Fatal(err)
			}
		}
		for i := range 5 {
			if _, err := cl.Delete(ctx, fmt.Sprintf("%s/%d", n, i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitGCConverged(t, c.running())
	for _, n := range names {
		s := c.srv[n]
		eventually(t, 20*time.Second, n+" to trim its log and collect the tombstones", func() bool {
			return logLen(s) == 0 && tombstones(s) == 0
		})
	}
	for _, e := range [][2]string{{"a", "c"}, {"c", "a"}} {
		s, other := c.srv[e[0]], c.srv[e[1]]
		if s.sync.byID[other.memberID] != nil {
			t.Fatalf("%s has %s as a sync peer: the topology is not a line", e[0], e[1])
		}
		var got vector
		for _, m := range s.sync.stab.snapshot() {
			if m.id == other.memberID {
				got = m.usable
			}
		}
		want := other.sync.log.durableVector()
		if !mapsEqual(got, want) {
			t.Fatalf("%s's usable report of %s is %v, want %s's durable vector %v (relayed by b)", e[0], e[1], got, e[1], want)
		}
	}
}

// TestSyncLogAbsorbStopsOpenCursors: a merged snapshot (absorb) counts
// what it stood for as trimmed. A pusher whose cursor was already at the
// end of an empty log (GC had trimmed everything) must not go on as if
// its peer held those changes: its next take is refused, so the stream
// ends and the next one starts with a snapshot (wantsSnapshot). A cursor
// whose peer is known to hold them goes on.
func TestSyncLogAbsorbStopsOpenCursors(t *testing.T) {
	l := newSyncLog(time.Now)
	for i, r := range []core.ReplicaID{1, 2} {
		if err := l.add(uint64(i+1), core.Hash{byte(i + 1)}, []byte{byte(i + 1)}, r, true); err != nil {
			t.Fatal(err)
		}
	}
	if n := l.trim(vector{1: 1, 2: 1}); n != 2 {
		t.Fatalf("trimmed %d, want 2", n)
	}
	// Two open streams, both caught up: nothing to send.
	lacking, err := l.newCursor(vector{1: 1, 2: 1})
	if err != nil {
		t.Fatal(err)
	}
	holding, err := l.newCursor(vector{1: 1, 2: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []*cursor{lacking, holding} {
		if got, _, err := l.take(c, nil, 100, 1<<20); err != nil || len(got) != 0 {
			t.Fatalf("take before the merge = %v, %v; want nothing", got, err)
		}
	}
	// A snapshot standing for replica 3's first two changes is merged.
	l.absorb(vector{1: 1, 2: 1, 3: 2})
	if _, _, err := l.take(lacking, vector{3: 1}, 100, 1<<20); !errors.Is(err, errMergedAhead) || !errors.Is(err, errBehindGC) {
		t.Fatalf("take for a peer lacking a change the merge brought = %v; want errMergedAhead", err)
	}
	if got, _, err := l.take(holding, vector{3: 2}, 100, 1<<20); err != nil || len(got) != 0 {
		t.Fatalf("take for a peer holding what the merge brought = %v, %v; want nothing, no error", got, err)
	}
	// Changes after the merge go as usual.
	if err := l.add(3, core.Hash{3}, []byte{3}, 2, true); err != nil {
		t.Fatal(err)
	}
	if got, _, err := l.take(holding, vector{3: 2}, 100, 1<<20); err != nil || len(got) != 1 || got[0][0] != 3 {
		t.Fatalf("take after the merge = %v, %v; want the new change", got, err)
	}
}
