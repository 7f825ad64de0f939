package edge

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/aethermesh/aether/edge/internal/core"
)

// receipts is how many changes s received from its peers (duplicates
// included) and how many of them were new (merged).
func receipts(t *testing.T, s *Server, peers []string) (recv, merged float64) {
	t.Helper()
	for _, p := range peers {
		recv += metricValue(t, s.Registry(), "aether_edge_sync_changes_received_total", p)
		merged += metricValue(t, s.Registry(), "aether_edge_sync_changes_merged_total", p)
	}
	return recv, merged
}

// loadConcurrently runs writers concurrent loads of n writes each at s.
func loadConcurrently(ctx context.Context, t *testing.T, s *Server, name string, seed uint64, writers, n int) []map[string][]string {
	t.Helper()
	var (
		mu    sync.Mutex
		acked []map[string][]string
		wg    sync.WaitGroup
	)
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := load(ctx, t, s, fmt.Sprintf("%s%d", name, i), seed*100+uint64(i), n)
			mu.Lock()
			acked = append(acked, a)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return acked
}

// TestSyncRelaysOnce: in a complete graph of 5, a change written at one
// replica reaches each other replica about once (from its author), not
// once from the author and again from each of the 3 others that merged it
// first (synclog.go, take: relayed changes wait for the peer's answer to a
// probe). Before that rule each replica received each change 4 times.
// With every replica writing too, they still converge to the reference
// merge (relayed changes interleaved with own ones are flushed with them,
// in order); the receipts per change there are logged, not bounded.
func TestSyncRelaysOnce(t *testing.T) {
	names := []string{"a", "b", "c", "d", "e"}
	c := newTestCluster(t, names, nil)
	for _, n := range names {
		c.start(n)
	}
	ctx := testCtx(t)
	acked := loadConcurrently(ctx, t, c.srv["a"], "a", 1, 4, 60)
	waitConverged(t, c.running())
	var recv, merged float64
	for _, n := range names[1:] {
		r, m := receipts(t, c.srv[n], without(names, n))
		t.Logf("%s: %v changes received, %v new", n, r, m)
		recv += r
		merged += m
	}
	if merged == 0 {
		t.Fatal("nothing merged: the load did nothing")
	}
	// Each of the 4 received every change at least once; a duplicate is a
	// direct copy late past a probe's round trip, rare on loopback.
	if ratio := recv / merged; ratio > 1.5 {
		t.Fatalf("each change was received %.2f times per replica, want about once (at most 1.5)", ratio)
	}

	// Every replica writing: converges, to the reference merge (a context
	// of its own: the first part may have used most of testCtx's).
	ctx = testCtx(t)
	var wg sync.WaitGroup
	var mu sync.Mutex
	before := map[string][2]float64{}
	for _, n := range names {
		r, m := receipts(t, c.srv[n], without(names, n))
		before[n] = [2]float64{r, m}
	}
	for i, n := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := loadConcurrently(ctx, t, c.srv[n], n, uint64(10+i), 2, 40)
			mu.Lock()
			acked = append(acked, a...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	hash := waitConverged(t, c.running())
	checkModel(t, c.srv["c"], hash, acked)
	recv, merged = 0, 0
	for _, n := range names {
		r, m := receipts(t, c.srv[n], without(names, n))
		recv += r - before[n][0]
		merged += m - before[n][1]
	}
	t.Logf("all writing: %.2f receipts per merged change (a complete graph of 5 without the relay rule: 4)", recv/merged)
}

// TestSyncRelaysAroundCutLink: in a complete graph of 3 whose a-b link is
// down (blackholed: streams hang, as in a silent partition), a's writes
// still reach b, through c: c holds them for b until b's answer to a probe
// shows it lacks them, then sends. Then the link flaps (connections reset
// and refused, healed, again) under writes at both ends: all converge to
// the reference merge, and c did relay.
func TestSyncRelaysAroundCutLink(t *testing.T) {
	names := []string{"a", "b", "c"}
	m := newMesh(t, names)
	a, b, cs := m.c.srv["a"], m.c.srv["b"], m.c.srv["c"]
	m.links[[2]string{"a", "b"}].Blackhole()
	m.links[[2]string{"b", "a"}].Blackhole()
	ctx := testCtx(t)
	acked := []map[string][]string{load(ctx, t, a, "a", 1, 40)}
	ar := core.ReplicaID(a.MemberID())
	eventually(t, 10*time.Second, "b to get a's writes through c", func() bool {
		return appliedVector(b)[ar] == appliedVector(a)[ar]
	})
	if v := metricValue(t, cs.Registry(), "aether_edge_sync_changes_sent_total", "b"); v < 40 {
		t.Fatalf("c sent b %v changes, want a's 40 at least: how did they get there?", v)
	}
	m.heal()

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i, n := range []string{"a", "b"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := 0; ; round++ {
				select {
				case <-stop:
					return
				default:
				}
				got := load(ctx, t, m.c.srv[n], n, uint64(100*(i+1)+round), 10)
				mu.Lock()
				acked = append(acked, got)
				mu.Unlock()
			}
		}()
	}
	for range 6 {
		m.cut("a", "b")
		time.Sleep(100 * time.Millisecond) // the link stays down a while: not a condition to wait for
		m.heal()
		time.Sleep(50 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	hash := waitConverged(t, m.c.running())
	checkModel(t, b, hash, acked)
}
