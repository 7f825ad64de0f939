package edge

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aethermesh/aether/edge/internal/core"
)

// A receiver acknowledges a pushed change only once it is durable: with
// b's storage failing, a must never learn that b holds a change b applied
// in memory but could not persist, not even for a moment (a catches every
// ack as it arrives: noteAck wakes the replication waiters).
func TestSyncReceiverAcksOnlyDurable(t *testing.T) {
	c := newTestCluster(t, []string{"a", "b"}, nil)
	a, b := c.start("a"), c.start("b")
	ctx := testCtx(t)
	cli := newClient(t, a)
	if _, err := cli.Put(ctx, "before", "v"); err != nil {
		t.Fatal(err)
	}
	// Durable, not only applied: closing the store under a batch still
	// being persisted would fail b before the change this test is about.
	eventually(t, 10*time.Second, "b to hold a's first change durably", func() bool {
		return total(b.sync.log.durableVector()) == heldChanges(a)
	})
	if err := b.store.Close(); err != nil {
		t.Fatal(err)
	}

	pb := a.sync.byID[b.MemberID()]
	var (
		mu     sync.Mutex
		target struct {
			r   core.ReplicaID
			seq uint64
			ok  bool
		}
		early bool
	)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			ch := a.sync.waiter()
			mu.Lock()
			if target.ok && pb.state().holds(target.r, target.seq) {
				early = true
			}
			mu.Unlock()
			select {
			case <-ch:
			case <-done:
				return
			}
		}
	}()

	put, err := cli.Put(ctx, "after", "v")
	if err != nil {
		t.Fatal(err)
	}
	// Its chain position (by hash: history GC may drop it from the log).
	a.mu.RLock()
	id, _ := a.st.HashOfRevision(put.Header.Revision)
	a.mu.RUnlock()
	var e struct {
		id      core.Hash
		replica core.ReplicaID
		seq     uint64
	}
	var ok bool
	e.id = id
	e.replica, e.seq, ok = a.sync.log.position(id)
	if !ok {
		t.Fatal("a's put has no place in its sync log")
	}
	mu.Lock()
	target.r, target.seq, target.ok = e.replica, e.seq, true
	mu.Unlock()
	_ = put

	rounds := metricValue(t, a.Registry(), "aether_edge_sync_rounds_total", "b")
	eventually(t, 10*time.Second, "b to apply the change and fail to persist it", func() bool {
		_, _, held := b.sync.log.position(e.id)
		return held && b.failure() != nil
	})
	// Two more rounds (stream openings) since: a's sender saw b's stream
	// end and reopened it, so every ack b sent for the change has arrived.
	eventually(t, 10*time.Second, "a to reopen its stream to b", func() bool {
		return metricValue(t, a.Registry(), "aether_edge_sync_rounds_total", "b") >= rounds+2
	})
	close(done)
	wg.Wait()
	if early {
		t.Fatal("a learned that b holds a change b never made durable")
	}
	if pb.state().holds(e.replica, e.seq) {
		t.Fatal("a holds b as having a change b never made durable")
	}
}

// TestSyncMetricsScrape scrapes a replica's /metrics over HTTP, as
// Prometheus would, after a converged exchange with two peers: every
// issue 16 replication family is on the page, per peer where it is per
// peer, and the page passes `promtool check metrics`.
func TestSyncMetricsScrape(t *testing.T) {
	tool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not found (%v): install it, e.g. apt-get install -y prometheus", err)
	}
	c := newTestCluster(t, []string{"a", "b", "c"}, nil)
	for _, n := range c.names {
		c.start(n)
	}
	ctx := testCtx(t)
	for i, n := range c.names {
		if _, err := newClient(t, c.srv[n]).Put(ctx, fmt.Sprintf("k%d", i), "v"); err != nil {
			t.Fatal(err)
		}
	}
	a := c.srv["a"]
	eventually(t, 10*time.Second, "all three to hold all three changes", func() bool {
		for _, s := range c.running() {
			if int(heldChanges(s)) != 3 {
				return false
			}
		}
		// a may know c holds everything before its own stream to c is
		// open (c said so on its stream to a): wait for both.
		for _, p := range []string{"b", "c"} {
			if metricValue(t, a.Registry(), "aether_edge_sync_lag_changes", p) != 0 ||
				metricValue(t, a.Registry(), "aether_edge_sync_peer_connected", p) != 1 {
				return false
			}
		}
		return true
	})
	resp, err := http.Get(a.ClientURLs()[0] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d %v", resp.StatusCode, err)
	}
	page := string(raw)
	for _, peer := range []string{"b", "c"} {
		for _, want := range []string{
			`aether_edge_sync_rounds_total{peer="%s"} `,
			`aether_edge_sync_changes_sent_total{peer="%s"} `,
			`aether_edge_sync_bytes_sent_total{peer="%s"} `,
			`aether_edge_sync_changes_received_total{peer="%s"} `,
			`aether_edge_sync_bytes_received_total{peer="%s"} `,
			`aether_edge_sync_changes_merged_total{peer="%s"} `,
			`aether_edge_sync_lag_changes{peer="%s"} 0`,
			`aether_edge_sync_lag_seconds{peer="%s"} 0`,
			`aether_edge_sync_peer_connected{peer="%s"} 1`,
			`aether_edge_sync_last_ack_timestamp_seconds{peer="%s"} `,
		} {
			if w := fmt.Sprintf(want, peer); !strings.Contains(page, w) {
				t.Errorf("/metrics lacks %q", w)
			}
		}
	}
	// b's change and c's were new at a, each from whichever peer brought
	// it first.
	if m := metricValue(t, a.Registry(), "aether_edge_sync_changes_merged_total", "b") +
		metricValue(t, a.Registry(), "aether_edge_sync_changes_merged_total", "c"); m != 2 {
		t.Errorf("a merged %v new changes from its peers, want 2", m)
	}
	// Three concurrent writes, each on a's heads at the time: at least one
	// head, never more than the three changes.
	// The log holds the three less what history GC (on by default)
	// trimmed once every peer held them.
	for _, want := range []string{"aether_edge_dag_changes ", "aether_edge_dag_bytes ", "aether_edge_gc_trimmed_changes_total "} {
		if !strings.Contains(page, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if n, tr := metricValue(t, a.Registry(), "aether_edge_dag_changes", ""), metricValue(t, a.Registry(), "aether_edge_gc_trimmed_changes_total", ""); n > 3 || n+tr < 3 {
		t.Errorf("aether_edge_dag_changes = %v and %v trimmed with 3 changes", n, tr)
	}
	if h := metricValue(t, a.Registry(), "aether_edge_dag_heads", ""); h < 1 || h > 3 {
		t.Errorf("aether_edge_dag_heads = %v with 3 changes", h)
	}
	cmd := exec.Command(tool, "check", "metrics")
	cmd.Stdin = strings.NewReader(page)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	_ = cmd.Run() // exits non-zero on any lint; the lines say which
	// The etcd-named families keep etcd's names (and etcd's own page
	// draws the same lints: a _total gauge, counters without _total), so
	// dashboards written for etcd read them; the edge store's own must be
	// clean.
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if strings.HasPrefix(line, "aether_") || (line != "" && !strings.HasPrefix(line, "etcd")) {
			t.Errorf("promtool check metrics: %s", line)
		}
	}
	if !strings.Contains(page, "etcd_server_has_leader 1") {
		t.Errorf("/metrics lacks etcd's families:\n%s", page)
	}
	if t.Failed() {
		t.Logf("page:\n%s", page)
	}
}
