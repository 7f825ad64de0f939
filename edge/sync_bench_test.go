package edge

import (
	"fmt"
	"os"
	"sync"
	"testing"
	"time"
)

// TestSyncThroughput measures, when EDGE_SYNC_BENCH=1: local write
// throughput at one replica of three (16 concurrent clients, 32-byte
// values), how long after the last acknowledged write the other two hold
// everything, and sync bytes per change.
func TestSyncThroughput(t *testing.T) {
	if os.Getenv("EDGE_SYNC_BENCH") != "1" {
		t.Skip("set EDGE_SYNC_BENCH=1 to measure")
	}
	names := []string{"a", "b", "c"}
	if os.Getenv("EDGE_SYNC_BENCH_SOLO") == "1" {
		names = names[:1] // the baseline: one replica, no peers
	}
	c := newTestCluster(t, names, nil)
	for _, n := range c.names {
		c.start(n)
	}
	a := c.srv["a"]
	ctx := testCtx(t)
	const clients, per = 16, 1250
	value := string(make([]byte, 32))
	start := time.Now()
	var wg sync.WaitGroup
	for g := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cli := newClient(t, a)
			for i := range per {
				if _, err := cli.Put(ctx, fmt.Sprintf("user%06d-%02d", i, g), value); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	wrote := time.Since(start)
	total := clients * per
	if len(names) == 1 {
		t.Logf("%d puts at a alone in %v: %.0f puts/s", total, wrote.Round(time.Millisecond), float64(total)/wrote.Seconds())
		return
	}
	eventually(t, 60*time.Second, "b and c to hold every change", func() bool {
		return int(heldChanges(c.srv["b"])) == total && int(heldChanges(c.srv["c"])) == total
	})
	lag := time.Since(start) - wrote
	bytes := metricValue(t, a.Registry(), "aether_edge_sync_bytes_sent_total", "b")
	changes := metricValue(t, a.Registry(), "aether_edge_sync_changes_sent_total", "b")
	t.Logf("%d puts at a in %v: %.0f puts/s; b and c held all %v after the last ack; a->b %.0f changes, %.1f bytes/change",
		total, wrote.Round(time.Millisecond), float64(total)/wrote.Seconds(), lag.Round(time.Millisecond), changes, bytes/changes)
}

// TestSyncCatchUp measures, when EDGE_SYNC_BENCH=1, how long a replica
// started after 20000 changes takes to hold them all (anti-entropy from
// the vector, one stream from each of two peers).
func TestSyncCatchUp(t *testing.T) {
	if os.Getenv("EDGE_SYNC_BENCH") != "1" {
		t.Skip("set EDGE_SYNC_BENCH=1 to measure")
	}
	c := newTestCluster(t, []string{"a", "b", "c"}, nil)
	a := c.start("a")
	c.start("b")
	ctx := testCtx(t)
	const clients, per = 16, 1250
	value := string(make([]byte, 32))
	var wg sync.WaitGroup
	for g := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cli := newClient(t, a)
			for i := range per {
				if _, err := cli.Put(ctx, fmt.Sprintf("user%06d-%02d", i, g), value); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	total := clients * per
	waitConverged(t, c.running())
	start := time.Now()
	late := c.start("c")
	eventually(t, 60*time.Second, "c to hold every change", func() bool { return int(heldChanges(late)) == total })
	took := time.Since(start)
	var sent float64
	for _, s := range []*Server{a, c.srv["b"]} {
		sent += metricValue(t, s.Registry(), "aether_edge_sync_changes_sent_total", "c")
	}
	t.Logf("c caught up on %d changes in %v (start included): %.0f changes/s; a and b sent it %.0f changes", total, took.Round(time.Millisecond), float64(total)/took.Seconds(), sent)
}
