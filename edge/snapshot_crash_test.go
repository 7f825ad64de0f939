package edge_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	edgev1 "github.com/aethermesh/aether/api/edge/v1"
)

// TestSnapshotMergeKill9: three `aether edge` processes; c is killed while
// a and b delete keys, compact, and go on past --peer-retention without
// it, so they collect the tombstones and drop the changes c lacks. c then
// comes back behind their GC point and is re-bootstrapped by snapshot
// transfer (it merges a's and b's states, and sends its own), and is
// killed with SIGKILL at a random moment of that, several times over,
// while a client writes to it. The merge is checkpointed under the state
// lock before anything after it is acknowledged, so whatever moment the
// kill lands on, c restarts either before the merge (and is sent the
// snapshot again) or after it, never half way: in the end the three agree
// on HashKV, every write c acknowledged is on all three, and no deleted
// key came back.
func TestSnapshotMergeKill9(t *testing.T) {
	bin := aetherBinary(t)
	rng := seededRand(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	names := []string{"a", "b", "c"}
	peer := map[string]string{}
	var cluster []string
	for _, n := range names {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		peer[n] = "http://" + l.Addr().String()
		_ = l.Close()
		cluster = append(cluster, n+"="+peer[n])
	}
	root := t.TempDir()
	start := func(n string) *edgeProc {
		return startEdgeArgs(t, bin, []string{
			"--name", n,
			"--data-dir", filepath.Join(root, n),
			"--listen-client-urls", "http://127.0.0.1:0",
			"--advertise-client-urls", "http://127.0.0.1:0",
			"--listen-peer-urls", peer[n],
			"--initial-advertise-peer-urls", peer[n],
			"--initial-cluster", strings.Join(cluster, ","),
			"--sync-interval", "100ms",
			"--peer-retention", "2s",
			// Debug logs why each sync stream ended: what a failure here
			// needs explained.
			"--log-level", "debug",
		})
	}
	procs := map[string]*edgeProc{}
	clients := map[string]*clientv3.Client{}
	for _, n := range names {
		procs[n] = start(n)
		clients[n] = newClient(t, procs[n].url)
	}

	// A state worth merging: 2000 keys of 200 bytes, in Txns of 100.
	const keys = 2000
	val := strings.Repeat("v", 200)
	for i := 0; i < keys; i += 100 {
		var ops []clientv3.Op
		for j := i; j < i+100; j++ {
			ops = append(ops, clientv3.OpPut(fmt.Sprintf("k/%04d", j), val))
		}
		if _, err := clients["a"].Txn(ctx).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	waitSameHash(ctx, t, clients, names)

	// Each round: c away, a deletes 100 more keys, a and b compact and
	// stop waiting for c (past the retention) and collect; c comes back
	// behind their GC point, is written to, and is killed at a random
	// moment of its re-bootstrap.
	var (
		mu    sync.Mutex
		acked = map[string]string{}
	)
	const rounds = 4
	landed := map[bool]int{}
	deleted := 0
	procs["c"].kill(t)
	for round := range rounds {
		var ops []clientv3.Op
		for j := deleted; j < deleted+100; j++ {
			ops = append(ops, clientv3.OpDelete(fmt.Sprintf("k/%04d", j)))
		}
		deleted += 100
		if _, err := clients["a"].Txn(ctx).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
		// etcd keeps a tombstone at the compaction revision itself:
		// compact past the deletes.
		if _, err := clients["a"].Put(ctx, "after", fmt.Sprint(round)); err != nil {
			t.Fatal(err)
		}
		waitSameHash(ctx, t, clients, []string{"a", "b"})
		for _, n := range []string{"a", "b"} {
			// Each replica numbers its own revisions.
			r, err := clients[n].Get(ctx, "after")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := clients[n].Compact(ctx, r.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
				t.Fatal(err)
			}
		}
		for _, n := range []string{"a", "b"} {
			url := procs[n].url
			var last string
			defer func() {
				if t.Failed() {
					t.Log(n, last)
					for k, v := range scrape(t, url) {
						if strings.Contains(k, "_gc_") || strings.Contains(k, "snapshot") {
							t.Log(n, k, v)
						}
					}
					var ended []string
					for _, l := range strings.Split(procs[n].logs(), "\n") {
						if strings.Contains(l, "snapshot") || strings.Contains(l, "behind") || strings.Contains(l, "error") {
							t.Log(n, l)
						}
						if strings.Contains(l, "sync stream ended") {
							ended = append(ended, l)
						}
					}
					for _, l := range ended[max(0, len(ended)-30):] {
						t.Log(n, l)
					}
				}
			}()
			waitFor(ctx, t, n+" to stop holding GC for c and collect the tombstones", func() bool {
				m := scrape(t, url)
				last = fmt.Sprintf("holds{c}=%v log=%v stable=%v collected at=%v tombstones=%v", m[`aether_edge_gc_peer_holds{peer="c"}`],
					m["aether_edge_dag_changes"], m["aether_edge_gc_point_changes"], m["aether_edge_gc_collected_point_changes"], m["aether_edge_gc_tombstones"])
				// c no longer holds GC back, the log is trimmed to nothing
				// (everything is stable), the core collected at that point,
				// and no tombstone is left.
				return m[`aether_edge_gc_peer_holds{peer="c"}`] == 0 && m["aether_edge_dag_changes"] == 0 &&
					m["aether_edge_gc_collected_point_changes"] == m["aether_edge_gc_point_changes"] && m["aether_edge_gc_tombstones"] == 0
			})
		}

		p := start("c")
		c := newClient(t, p.url)
		wctx, wcancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; wctx.Err() == nil; i++ {
					k := fmt.Sprintf("c/%d/%d/%d", round, w, i)
					if _, err := c.Put(wctx, k, k); err == nil {
						mu.Lock()
						acked[k] = k
						mu.Unlock()
					}
				}
			}()
		}
		// The moment to kill at, not a wait for anything: anywhere in the
		// first 250 ms after c is ready, which the transfers (hundreds of
		// kB each way, starting once the streams connect) fall in.
		time.Sleep(time.Duration(rng.Int64N(int64(250 * time.Millisecond))))
		p.kill(t)
		wcancel()
		wg.Wait()
		_ = c.Close()
		merged := strings.Contains(p.logs(), "merged a state snapshot from a peer")
		landed[merged]++
		t.Logf("round %d: killed %s c merged a snapshot; %d writes acknowledged so far", round, map[bool]string{true: "after", false: "before"}[merged], len(acked))
	}
	t.Logf("kills before c merged a snapshot: %d, after: %d", landed[false], landed[true])

	procs["c"] = start("c")
	clients["c"] = newClient(t, procs["c"].url)
	waitSameHash(ctx, t, clients, names)
	if len(acked) == 0 {
		t.Fatal("c acknowledged no write: the load did nothing")
	}
	for _, n := range names {
		got := map[string]string{}
		r, err := clients[n].Get(ctx, "", clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range r.Kvs {
			got[string(kv.Key)] = string(kv.Value)
		}
		for k, v := range acked {
			if got[k] != v {
				t.Fatalf("%s: c's acknowledged write %s is %q: lost", n, k, got[k])
			}
		}
		for i := range keys {
			k := fmt.Sprintf("k/%04d", i)
			if _, ok := got[k]; ok != (i >= deleted) {
				t.Fatalf("%s: %s present=%v, want %v (deleted keys stay deleted, the rest stays)", n, k, ok, i >= deleted)
			}
		}
	}
	m := scrape(t, procs["c"].url)
	final := m[`aether_edge_snapshot_transfers_received_total{peer="a"}`] + m[`aether_edge_snapshot_transfers_received_total{peer="b"}`]
	if landed[true] == 0 && final == 0 {
		t.Fatal("c converged without merging a snapshot: the test did not exercise the transfer")
	}
}

// waitSameHash waits until the named replicas report one HashKV.
func waitSameHash(ctx context.Context, t *testing.T, clients map[string]*clientv3.Client, names []string) {
	t.Helper()
	same := func() bool {
		var first uint32
		for i, n := range names {
			c := clients[n]
			r, err := c.HashKV(ctx, c.Endpoints()[0], 0)
			if err != nil {
				return false
			}
			if i == 0 {
				first = r.Hash
			} else if r.Hash != first {
				return false
			}
		}
		return true
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for !same() {
		select {
		case <-wctx.Done():
			logDivergence(t, clients, names)
			t.Fatalf("timed out waiting for %s to report the same HashKV", strings.Join(names, ", "))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// logDivergence logs what a failed convergence wait needs explained: per
// replica its revision, what it reports of its peers, and the keys whose
// value differs from the first replica's.
func logDivergence(t *testing.T, clients map[string]*clientv3.Client, names []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	state := map[string]map[string]string{}
	for _, n := range names {
		c := clients[n]
		r, err := c.Get(ctx, "", clientv3.WithPrefix())
		if err != nil {
			t.Logf("%s: get: %v", n, err)
			continue
		}
		kv := map[string]string{}
		for _, x := range r.Kvs {
			kv[string(x.Key)] = fmt.Sprintf("%q", x.Value)
		}
		state[n] = kv
		t.Logf("%s: revision %d, %d keys", n, r.Header.Revision, len(kv))
		ext := edgev1.NewEdgeClient(c.ActiveConnection())
		if st, err := ext.ReplicationStatus(ctx, &edgev1.ReplicationStatusRequest{}); err == nil {
			for _, p := range st.GetPeers() {
				t.Logf("%s: peer %s connected=%v behind=%d last sync %v", n, p.GetName(), p.GetConnected(), p.GetChangesBehind(),
					time.Unix(0, p.GetLastSyncUnixNano()).Format(time.StampMilli))
			}
		}
		if h, err := ext.Heads(ctx, &edgev1.HeadsRequest{}); err == nil {
			t.Logf("%s: %d heads, index %d", n, len(h.GetHeads()), h.GetHeader().GetIndex())
		}
	}
	base := state[names[0]]
	for _, n := range names[1:] {
		diff := 0
		keys := map[string]bool{}
		for k := range base {
			keys[k] = true
		}
		for k := range state[n] {
			keys[k] = true
		}
		for k := range keys {
			if base[k] != state[n][k] && diff < 20 {
				diff++
				t.Logf("key %s: %s %s, %s %s", k, names[0], base[k], n, state[n][k])
			}
		}
	}
}

// waitFor polls cond until it holds, for at most 60 s.
func waitFor(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// scrape reads a replica's /metrics: sample name with labels -> value.
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out
}
