package replicator

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/internal/testutil/wait"
	"github.com/aethermesh/aether/registry"
)

// Test 1: A's subtree shows up in B and B's in A, updates and deletes
// included, node records under origin leases included; nothing is ever
// mirrored back.
func TestVisibilityBothWaysNoLoops(t *testing.T) {
	a, b := newRegion(t, "a"), newRegion(t, "b")
	putEndpoints(t, a, 0, 20, 1) // before the replicators: initial sync
	putEndpoints(t, b, 100, 110, 1)
	// A node record under its own node lease in the origin, as the
	// registrar writes it.
	nodeLease, err := a.cli.Grant(testCtx(t), 60)
	if err != nil {
		t.Fatal(err)
	}
	nodeKey, _ := registry.NodeID{Region: "a", Cluster: "c1", Name: "n1"}.Key()
	if _, err := a.cli.Put(testCtx(t), nodeKey, "node-record", clientv3.WithLease(nodeLease.ID)); err != nil {
		t.Fatal(err)
	}

	cfgA := config(t, a, "a-1", 3*time.Second, b.peer())
	metricsA := prometheus.NewRegistry()
	cfgA.Registerer = metricsA
	ha := start(t, cfgA)
	hb := start(t, config(t, b, "b-1", 3*time.Second, a.peer()))
	la := waitMirrored(t, ha, a, b, 15*time.Second)
	lb := waitMirrored(t, hb, b, a, 15*time.Second)
	if got := mustRead(t, b.cli, nodeKey); clientv3.LeaseID(got[nodeKey].Lease) != la {
		t.Fatalf("node record in B: %+v, want it under A's peer lease %x (not the origin's node lease)", got[nodeKey], int64(la))
	}

	// Steady state: creates, updates, deletes, and a node lease lapsing
	// in the origin.
	putEndpoints(t, a, 20, 30, 1)
	putEndpoints(t, a, 0, 5, 2)
	k10, _ := endpointKV(t, "a", 10, 1)
	deleteKey(t, a, k10)
	if _, err := a.cli.Revoke(testCtx(t), nodeLease.ID); err != nil {
		t.Fatal(err)
	}
	putEndpoints(t, b, 110, 115, 1)
	k100, _ := endpointKV(t, "b", 100, 1)
	deleteKey(t, b, k100)

	if got := waitMirrored(t, ha, a, b, 10*time.Second); got != la {
		t.Fatalf("A's lease on B changed from %x to %x without a fault", int64(la), int64(got))
	}
	if got := waitMirrored(t, hb, b, a, 10*time.Second); got != lb {
		t.Fatalf("B's lease on A changed from %x to %x without a fault", int64(lb), int64(got))
	}
	if _, ok := mustRead(t, b.cli, nodeKey)[nodeKey]; ok {
		t.Fatal("node record still in B after its lease lapsed in A")
	}

	// No loops: each origin's own keys were written by the test alone
	// (no lease, versions exactly as the test made them), and nothing but
	// the two subtrees is under the registry root.
	for _, g := range []*region{a, b} {
		own := mustRead(t, g.cli, registry.RegionPrefix(g.name))
		for k, v := range own {
			wantVersion := int64(1)
			if g == a && strings.Contains(k, "/endpoints/10.0.0.") && endpointIndex(k) < 5 {
				wantVersion = 2
			}
			if v.Lease != 0 || v.Version != wantVersion {
				t.Errorf("%s's own key %s: lease %x version %d; a replicator wrote into its origin", g.name, k, v.Lease, v.Version)
			}
		}
		for k := range mustRead(t, g.cli, registry.Root) {
			if !strings.HasPrefix(k, registry.RegionPrefix("a")) && !strings.HasPrefix(k, registry.RegionPrefix("b")) {
				t.Errorf("unexpected key %s in %s", k, g.name)
			}
		}
	}
	waitRevisionStable(t, 1500*time.Millisecond, a, b)

	wait.ForState(t, "status caught up", 5*time.Second, func() (bool, string) {
		s := ha.status("b")
		n := len(mustRead(t, a.cli, registry.RegionPrefix("a")))
		return s.Reachable && s.Lag == 0 && s.KeysMirrored == int64(n) && s.LastMirroredRevision > 0 &&
				s.LeaseTTLRemaining > 0 && s.Leader == "a-1",
			fmt.Sprintf("%+v (origin has %d keys)", s, n)
	})
	n := float64(len(mustRead(t, a.cli, registry.RegionPrefix("a"))))
	got := gather(t, metricsA)
	for name, want := range map[string]float64{
		`replicator_leader`:                                    1,
		`replicator_keys_mirrored{peer="b"}`:                   n,
		`replicator_lag_seconds{peer="b"}`:                     0,
		`replicator_full_syncs_total{peer="b",reason="start"}`: 1,
		`replicator_mirror_errors_total{peer="b"}`:             0,
		`replicator_keepalive_failures_total{peer="b"}`:        0,
	} {
		if v, ok := got[name]; !ok || v != want {
			t.Errorf("metric %s = %v (present %v), want %v", name, v, ok, want)
		}
	}
	if got[`replicator_mirrored_ops_total{op="put",peer="b"}`] < n ||
		got[`replicator_mirrored_ops_total{op="delete",peer="b"}`] < 2 ||
		got[`replicator_lease_ttl_remaining_seconds{peer="b"}`] <= 0 {
		t.Errorf("metrics: %v", got)
	}
}

// gather flattens a registry to "name{label="value",...}" → value.
func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			name := mf.GetName()
			if len(labels) > 0 {
				name += "{" + strings.Join(labels, ",") + "}"
			}
			switch {
			case m.Counter != nil:
				out[name] = m.GetCounter().GetValue()
			case m.Gauge != nil:
				out[name] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

func endpointIndex(key string) int {
	var x, y, z int
	i := strings.LastIndex(key, "/")
	fmt.Sscanf(key[i+1:], "10.%d.%d.%d", &x, &y, &z)
	return x<<16 | y<<8 | z
}

// Test 2: the initial sync compares leases as well as values.
func TestInitialSyncComparesLease(t *testing.T) {
	a, b := newRegion(t, "a"), newRegion(t, "b")
	putEndpoints(t, a, 0, 6, 1)
	k := make([]string, 6)
	v := make([]string, 6)
	for i := range k {
		k[i], v[i] = endpointKV(t, "a", i, 1)
	}
	other, err := b.cli.Grant(testCtx(t), 120) // e.g. a previous leader's lease
	if err != nil {
		t.Fatal(err)
	}
	_, v2 := endpointKV(t, "a", 2, 2)
	stale, staleVal := endpointKV(t, "a", 50, 1)
	stale2, _ := endpointKV(t, "a", 51, 1)
	bOwn, bOwnVal := endpointKV(t, "b", 7, 1)
	cMirror, cMirrorVal := endpointKV(t, "c", 8, 1)
	for _, w := range []struct {
		key, val string
		lease    clientv3.LeaseID
	}{
		{k[0], v[0], 0},        // equal value, no lease
		{k[1], v[1], other.ID}, // equal value, another lease
		{k[2], v2, 0},          // other value
		{k[3], v[3], other.ID}, // equal value, another lease
		// k[4], k[5] missing
		{stale, staleVal, 0},         // gone from the origin
		{stale2, staleVal, other.ID}, // gone from the origin, leased
		{bOwn, bOwnVal, 0},           // B's own: not A's business
		{cMirror, cMirrorVal, 0},     // C's mirror in B: not A's business
	} {
		if _, err := b.cli.Put(testCtx(t), w.key, w.val, clientv3.WithLease(w.lease)); err != nil {
			t.Fatal(err)
		}
	}
	before := mustRead(t, b.cli, registry.Root)

	h := start(t, config(t, a, "a-1", 3*time.Second, b.peer()))
	lease := waitMirrored(t, h, a, b, 15*time.Second)
	if lease == other.ID {
		t.Fatalf("replicator reused a lease it did not grant")
	}
	after := mustRead(t, b.cli, registry.Root)
	for _, i := range []int{0, 1, 3} {
		if after[k[i]].ModRev == before[k[i]].ModRev {
			t.Errorf("%s has an equal value but was under lease %x: it must be re-put under %x", k[i], before[k[i]].Lease, int64(lease))
		}
	}
	for _, key := range []string{stale, stale2} {
		if _, ok := after[key]; ok {
			t.Errorf("%s is gone from the origin but still in the mirror", key)
		}
	}
	for _, key := range []string{bOwn, cMirror} {
		if after[key] != before[key] {
			t.Errorf("%s is not in A's subtree but was touched: %+v -> %+v", key, before[key], after[key])
		}
	}
	if s := h.status("b"); s.KeysMirrored != 6 || s.FullSyncs != 1 {
		t.Errorf("status %+v: want 6 keys mirrored after one full sync", s)
	}
}

// Test 3: when the origin stops heartbeating, its keys expire in the peer
// after the lease TTL, not before; when it comes back, so do they.
func TestOriginFailureExpiresAfterTTL(t *testing.T) {
	const ttl = 3 * time.Second
	a, b := newRegion(t, "a"), newRegion(t, "b")
	keys := putEndpoints(t, a, 0, 10, 1)
	h := start(t, config(t, a, "a-1", ttl, b.peer()))
	lease := waitMirrored(t, h, a, b, 15*time.Second)

	// Let a few keepalives go by, so the stop lands anywhere in the cycle.
	time.Sleep(ttl / 2)
	// Time left as of the last keepalive the replicator sent: the peer
	// renewed on receipt, so its expiry is no earlier.
	remaining := h.status("b").LeaseTTLRemaining
	stoppedAt := time.Now()
	if err := h.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if s := h.status("b"); s.IsLeader {
		t.Fatalf("still leader after Run returned: %+v", s)
	}
	// Keepalives go every TTL/3, so at least 2/3 of the TTL is left.
	if remaining < ttl/2 {
		t.Fatalf("only %v of the %v lease left at the stop: keepalives are not every TTL/3", remaining, ttl)
	}
	// A clean stop must not revoke: the keys stay for the rest of the
	// TTL (tolerance 150ms for polling), then go within TTL+2s (etcd checks
	// expiry every 500ms, and the revoke goes through raft).
	const tolerance = 150 * time.Millisecond
	prefix := registry.RegionPrefix("a")
	for time.Since(stoppedAt) < remaining-tolerance {
		got, _, err := read(b.cli, prefix)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(keys) {
			t.Fatalf("%v after the stop (TTL %v) B holds %d of A's %d keys: the lease was revoked or expired early",
				time.Since(stoppedAt).Round(time.Millisecond), ttl, len(got), len(keys))
		}
		time.Sleep(25 * time.Millisecond)
	}
	wait.ForState(t, "A's keys to expire in B", ttl+2*time.Second-time.Since(stoppedAt), func() (bool, string) {
		got, _, err := read(b.cli, prefix)
		return err == nil && len(got) == 0, fmt.Sprintf("%d keys left, err %v", len(got), err)
	})
	gone := time.Since(stoppedAt)
	t.Logf("A's keys expired in B %v after the replicator stopped, %v of the lease left then (TTL %v)",
		gone.Round(time.Millisecond), remaining.Round(time.Millisecond), ttl)
	if ttlResp, err := b.cli.TimeToLive(testCtx(t), lease); err != nil || ttlResp.TTL != -1 {
		t.Fatalf("lease %x after expiry: %+v, %v; want it gone", int64(lease), ttlResp, err)
	}

	h2 := start(t, config(t, a, "a-1", ttl, b.peer()))
	if got := waitMirrored(t, h2, a, b, 15*time.Second); got == lease {
		t.Fatalf("restarted replicator reports the expired lease %x", int64(lease))
	}
}

// poller reads B continuously and records the first time any of the
// watched keys is missing.
type poller struct {
	stop  chan struct{}
	done  chan struct{}
	polls atomic.Int64
	mu    sync.Mutex
	fail  string
}

func startPoller(t *testing.T, cli *clientv3.Client, keys map[string]string) *poller {
	p := &poller{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for {
			select {
			case <-p.stop:
				return
			default:
			}
			got, _, err := read(cli, registry.Root)
			p.polls.Add(1)
			var missing []string
			for k := range keys {
				if _, ok := got[k]; !ok {
					missing = append(missing, k)
				}
			}
			if err != nil || len(missing) > 0 {
				p.mu.Lock()
				if p.fail == "" {
					p.fail = fmt.Sprintf("at %s: %d keys missing, read error %v", time.Now().Format("15:04:05.000"), len(missing), err)
				}
				p.mu.Unlock()
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	t.Cleanup(p.finish)
	return p
}

func (p *poller) finish() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
}

func (p *poller) check(t *testing.T, when string) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fail != "" {
		t.Fatalf("%s: B lost A's keys: %s", when, p.fail)
	}
}

// waitLeaseGone waits until lease no longer exists on cli's etcd.
func waitLeaseGone(t *testing.T, cli *clientv3.Client, lease clientv3.LeaseID, timeout time.Duration) {
	t.Helper()
	wait.ForState(t, fmt.Sprintf("lease %x to expire", int64(lease)), timeout, func() (bool, string) {
		r, err := cli.TimeToLive(testCtx(t), lease)
		if err != nil {
			return false, err.Error()
		}
		return r.TTL == -1, fmt.Sprintf("TTL %d", r.TTL)
	})
}

// Test 4: leader handoff, after a crash and after a clean stop, never
// drops the mirror, and leaves it attached to the new leader's lease.
func TestLeaderHandoffKeepsMirror(t *testing.T) {
	// The successor must re-attach the keys before the dead leader's lease
	// lapses: at least 2/3 TTL after its last keepalive, while a crashed
	// leader's election session (SessionTTL 2s) takes up to ~2.5s to go.
	const ttl = 6 * time.Second
	a, b := newRegion(t, "a"), newRegion(t, "b")
	keys := putEndpoints(t, a, 0, 20, 1)
	replica := func(id string) (*running, *clientv3.Client) {
		cli := etcdtest.NewClient(t, a.etcd.Endpoints()...) // its own: a crash closes it
		cfg := config(t, a, id, ttl, b.peer())
		cfg.Local = cli
		return start(t, cfg), cli
	}
	h1, cli1 := replica("r1")
	l1 := waitMirrored(t, h1, a, b, 15*time.Second)
	h2, _ := replica("r2")
	wait.ForState(t, "r2 to follow r1", 10*time.Second, func() (bool, string) {
		s := h2.status("b")
		return !s.IsLeader && s.Leader == "r1", fmt.Sprintf("%+v", s)
	})
	pl := startPoller(t, b.cli, keys)

	// Crash r1: its local client goes first, so it can neither resign nor
	// revoke its session (the session lease must expire), then its peer
	// keepalives stop as a dead process's would.
	crashedAt := time.Now()
	_ = cli1.Close()
	h1.stop()
	l2 := waitMirrored(t, h2, a, b, 15*time.Second)
	if l2 == l1 {
		t.Fatalf("r2 reports r1's lease %x", int64(l1))
	}
	t.Logf("crash handoff: r2 re-attached A's keys %v after r1 crashed", time.Since(crashedAt).Round(time.Millisecond))
	if s := h2.status("b"); s.Leader != "r2" || !s.IsLeader {
		t.Fatalf("r2 status %+v", s)
	}
	// The new leader mirrors new changes.
	more := putEndpoints(t, a, 20, 22, 1)
	waitMirrored(t, h2, a, b, 10*time.Second)
	// r1's lease lapses holding nothing.
	waitLeaseGone(t, b.cli, l1, ttl+3*time.Second)
	pl.check(t, "crash handoff")

	// Clean handoff: r2 resigns, r3 takes over at once.
	h3, _ := replica("r3")
	wait.ForState(t, "r3 to follow r2", 10*time.Second, func() (bool, string) {
		s := h3.status("b")
		return !s.IsLeader && s.Leader == "r2", fmt.Sprintf("%+v", s)
	})
	stoppedAt := time.Now()
	if err := h2.stop(); err != nil {
		t.Fatal(err)
	}
	l3 := waitMirrored(t, h3, a, b, 10*time.Second)
	took := time.Since(stoppedAt)
	t.Logf("clean handoff: r3 re-attached A's keys %v after r2 stopped", took.Round(time.Millisecond))
	if took > ttl/2 {
		t.Errorf("clean handoff took %v; resigning should hand over at once", took)
	}
	if l3 == l2 {
		t.Fatalf("r3 reports r2's lease")
	}
	waitLeaseGone(t, b.cli, l2, ttl+3*time.Second)
	pl.check(t, "clean handoff")
	for k := range more {
		if got := mustRead(t, b.cli, k)[k]; clientv3.LeaseID(got.Lease) != l3 {
			t.Fatalf("%s under lease %x, want r3's %x", k, got.Lease, int64(l3))
		}
	}
	t.Logf("poller read B %d times", pl.polls.Load())
}

// compact compacts g's etcd at its current revision, physically.
func compact(t *testing.T, g *region) int64 {
	t.Helper()
	rev := currentRev(t, g.cli)
	if _, err := g.cli.Compact(testCtx(t), rev, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	return rev
}

// Test 5: compaction while the replicator is down, and while its local
// watch is disconnected.
func TestCompaction(t *testing.T) {
	t.Run("WhileDown", func(t *testing.T) {
		a, b := newRegion(t, "a"), newRegion(t, "b")
		putEndpoints(t, a, 0, 10, 1)
		h := start(t, config(t, a, "a-1", 3*time.Second, b.peer()))
		waitMirrored(t, h, a, b, 15*time.Second)
		lastMirrored := h.status("b").LastMirroredRevision
		if err := h.stop(); err != nil {
			t.Fatal(err)
		}
		putEndpoints(t, a, 10, 15, 1)
		putEndpoints(t, a, 0, 3, 2)
		for _, i := range []int{5, 6} {
			k, _ := endpointKV(t, "a", i, 1)
			deleteKey(t, a, k)
		}
		if rev := compact(t, a); rev <= lastMirrored {
			t.Fatalf("compacted at %d, not past the last mirrored revision %d", rev, lastMirrored)
		}
		h2 := start(t, config(t, a, "a-1", 3*time.Second, b.peer()))
		waitMirrored(t, h2, a, b, 15*time.Second)
	})

	t.Run("WatchResume", func(t *testing.T) {
		a, b := newRegion(t, "a"), newRegion(t, "b")
		putEndpoints(t, a, 0, 10, 1)
		// The replicator reaches its own etcd through a proxy, so its
		// watch can be cut while the test keeps writing.
		_, px := a.via(t)
		cfg := config(t, a, "a-1", 9*time.Second, b.peer())
		cfg.SessionTTL = 3 * time.Second // survive the cut: this is not a handoff
		cfg.Local = etcdtest.NewClient(t, px.Addr())
		reg := prometheus.NewRegistry()
		cfg.Registerer = reg
		h := start(t, cfg)
		lease := waitMirrored(t, h, a, b, 15*time.Second)
		before := mustRead(t, b.cli, registry.RegionPrefix("a"))

		px.Cut()
		putEndpoints(t, a, 10, 13, 1)
		putEndpoints(t, a, 0, 1, 2)
		k9, _ := endpointKV(t, "a", 9, 1)
		deleteKey(t, a, k9)
		compact(t, a)
		px.Heal()

		compacted := func() float64 {
			return counterValue(t, h.r.m.fullSyncs.WithLabelValues("b", syncCompacted))
		}
		wait.ForState(t, "a full sync for compaction", 15*time.Second, func() (bool, string) {
			return compacted() == 1, fmt.Sprintf("%v; status %+v", compacted(), h.status("b"))
		})
		if got := waitMirrored(t, h, a, b, 10*time.Second); got != lease {
			t.Fatalf("lease changed from %x to %x: the resync should keep the live lease", int64(lease), int64(got))
		}
		s := h.status("b")
		if !s.IsLeader || s.FullSyncs != 2 || s.KeysMirrored != 12 {
			t.Fatalf("status %+v: want the same leadership, 2 full syncs, 12 keys", s)
		}
		// The resync is a diff: keys that were already right are not
		// written again.
		after := mustRead(t, b.cli, registry.RegionPrefix("a"))
		for i := 1; i < 9; i++ {
			k, _ := endpointKV(t, "a", i, 1)
			if after[k].ModRev != before[k].ModRev {
				t.Errorf("%s was rewritten by the resync though value and lease were right", k)
			}
		}
		if n := counterValue(t, h.r.m.fullSyncs.WithLabelValues("b", syncStart)); n != 1 {
			t.Errorf("%v start syncs, want 1: leadership was lost", n)
		}
	})
}

// Test 6: a partition longer than the TTL drops each side's mirror of the
// other; both keep working locally; healing converges. A third region
// reachable from A keeps receiving A's changes throughout.
func TestPartitionDropsAndHeals(t *testing.T) {
	const ttl = 3 * time.Second
	a, b, c := newRegion(t, "a"), newRegion(t, "b"), newRegion(t, "c")
	bPeer, pxAB := b.via(t) // A's replicator reaches B through this
	aPeer, pxBA := a.via(t) // B's replicator reaches A through this
	putEndpoints(t, a, 0, 10, 1)
	putEndpoints(t, b, 100, 110, 1)
	ha := start(t, config(t, a, "a-1", ttl, bPeer, c.peer()))
	hb := start(t, config(t, b, "b-1", ttl, aPeer))
	leaseAB := waitMirrored(t, ha, a, b, 15*time.Second)
	waitMirrored(t, ha, a, c, 15*time.Second)
	waitMirrored(t, hb, b, a, 15*time.Second)

	cutAt := time.Now()
	pxAB.Blackhole()
	pxBA.Blackhole()
	// Both regions keep taking local writes, and C keeps up with A.
	putEndpoints(t, a, 10, 15, 1)
	k0, _ := endpointKV(t, "a", 0, 1)
	deleteKey(t, a, k0)
	putEndpoints(t, b, 110, 115, 1)
	waitMirrored(t, ha, a, c, 5*time.Second)

	wait.ForState(t, "each side to drop the other's mirror", ttl+5*time.Second, func() (bool, string) {
		inB, _, err1 := read(b.cli, registry.RegionPrefix("a"))
		inA, _, err2 := read(a.cli, registry.RegionPrefix("b"))
		return err1 == nil && err2 == nil && len(inB) == 0 && len(inA) == 0,
			fmt.Sprintf("B holds %d of A's keys, A holds %d of B's (%v, %v)", len(inB), len(inA), err1, err2)
	})
	t.Logf("mirrors dropped %v into the partition (TTL %v)", time.Since(cutAt).Round(time.Millisecond), ttl)
	if s := ha.status("b"); s.Reachable || s.KeepaliveFailures == 0 {
		t.Errorf("during the partition: %+v, want B unreachable with keepalive failures", s)
	}
	if s := ha.status("c"); !s.Reachable || s.Lag > ttl {
		t.Errorf("C during the partition: %+v, want it reachable and current", s)
	}
	putEndpoints(t, a, 15, 18, 1)
	putEndpoints(t, b, 115, 118, 1)
	waitMirrored(t, ha, a, c, 5*time.Second)
	// Lag counts from the first change B has not got: the writes right
	// after the cut.
	if s := ha.status("b"); s.Lag < time.Since(cutAt)-time.Second {
		t.Errorf("B's lag %v, want about %v (since the first unmirrored change)", s.Lag, time.Since(cutAt))
	}

	pxAB.Heal()
	pxBA.Heal()
	healedAt := time.Now()
	if got := waitMirrored(t, ha, a, b, 20*time.Second); got == leaseAB {
		t.Fatalf("B still reports the expired lease %x", int64(leaseAB))
	}
	waitMirrored(t, hb, b, a, 20*time.Second)
	t.Logf("converged %v after healing", time.Since(healedAt).Round(time.Millisecond))
	wait.ForState(t, "B's status to recover", 5*time.Second, func() (bool, string) {
		s := ha.status("b")
		return s.Reachable && s.Lag == 0 && s.LastError != "" && s.FullSyncs >= 2, fmt.Sprintf("%+v", s)
	})
}

// Test 7: three regions in a full mesh converge on the union, with no loops.
func TestThreeRegionMesh(t *testing.T) {
	regs := []*region{newRegion(t, "a"), newRegion(t, "b"), newRegion(t, "c")}
	hs := make([]*running, len(regs))
	for i, g := range regs {
		putEndpoints(t, g, i*100, i*100+8, 1)
		var peers []Peer
		for j, o := range regs {
			if j != i {
				peers = append(peers, o.peer())
			}
		}
		hs[i] = start(t, config(t, g, g.name+"-1", 3*time.Second, peers...))
	}
	converged := func() {
		t.Helper()
		for i, g := range regs {
			for j, o := range regs {
				if i != j {
					waitMirrored(t, hs[i], g, o, 15*time.Second)
				}
			}
		}
		// Every etcd holds exactly the union of the origins' subtrees.
		union := map[string]kv{}
		for _, g := range regs {
			for k, v := range mustRead(t, g.cli, registry.RegionPrefix(g.name)) {
				union[k] = v
			}
		}
		for _, g := range regs {
			got := mustRead(t, g.cli, registry.Root)
			if ok, why := sameMirror(union, got, 0); !ok {
				t.Fatalf("%s does not hold exactly the union: %s", g.name, why)
			}
		}
	}
	converged()
	for i, g := range regs {
		putEndpoints(t, g, i*100+8, i*100+10, 1)
		k, _ := endpointKV(t, g.name, i*100, 1)
		deleteKey(t, g, k)
	}
	converged()
	waitRevisionStable(t, 1500*time.Millisecond, regs...)
	for _, g := range regs {
		for k, v := range mustRead(t, g.cli, registry.RegionPrefix(g.name)) {
			if v.Lease != 0 || v.Version != 1 {
				t.Errorf("%s's own key %s rewritten (lease %x, version %d): a loop", g.name, k, v.Lease, v.Version)
			}
		}
	}
}

// A slow peer makes the watch queue up; the next apply takes the queue
// in few Txns, none above MaxTxnOps and none naming a key twice.
func TestCatchUpBatchesAndChunks(t *testing.T) {
	a, b := newRegion(t, "a"), newRegion(t, "b")
	r, err := New(config(t, a, "a-1", 3*time.Second, b.peer()))
	if err != nil {
		t.Fatal(err)
	}
	var (
		hold    atomic.Bool
		gate    = make(chan struct{})
		mu      sync.Mutex
		commits []int
	)
	r.hooks.onCommit = func(_ string, ops int) {
		mu.Lock()
		commits = append(commits, ops)
		mu.Unlock()
		if hold.CompareAndSwap(true, false) {
			<-gate // the peer is slow: the watch queues up meanwhile
		}
	}
	h := startReplicator(t, r)
	waitMirrored(t, h, a, b, 15*time.Second)
	mu.Lock()
	commits = nil
	mu.Unlock()

	hold.Store(true)
	putEndpoints(t, a, 0, 1, 1) // its Txn commits, then holds the loop
	hot, _ := endpointKV(t, "a", 999, 1)
	for i := 1; i < 400; i++ {
		k, v := endpointKV(t, "a", i, 1)
		if _, err := a.cli.Put(testCtx(t), k, v); err != nil {
			t.Fatal(err)
		}
		if i%8 == 0 { // the same key many times in one catch-up
			if _, err := a.cli.Put(testCtx(t), hot, fmt.Sprintf("v%d", i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	close(gate)
	waitMirrored(t, h, a, b, 15*time.Second)
	// The peer can show the last Txn before the loop has its response.
	wait.ForState(t, "status to catch up", 5*time.Second, func() (bool, string) {
		s := h.status("b")
		return s.KeysMirrored == 401 && s.Lag == 0, fmt.Sprintf("%+v: want 401 keys, no lag", s)
	})
	mu.Lock()
	got := append([]int(nil), commits...)
	mu.Unlock()
	sort.Ints(got)
	t.Logf("peer Txns for 450 local revisions: %v", got)
	if len(got) > 10 {
		t.Errorf("%d peer Txns for 450 local revisions: the queued watch was not batched", len(got))
	}
	if got[len(got)-1] != DefaultMaxTxnOps {
		t.Errorf("largest Txn had %d ops, want a full %d (the batch was not chunked)", got[len(got)-1], DefaultMaxTxnOps)
	}
}

// A "peer" that is really the local etcd is refused instead of having the
// origin's own keys rewritten under a peer lease.
func TestRefusesLocalEtcdAsPeer(t *testing.T) {
	a := newRegion(t, "a")
	putEndpoints(t, a, 0, 3, 1)
	before := mustRead(t, a.cli, registry.Root)
	h := start(t, config(t, a, "a-1", 3*time.Second, Peer{Region: "b", Endpoints: a.etcd.Endpoints()}))
	wait.ForState(t, "the self-peer to be refused", 10*time.Second, func() (bool, string) {
		s := h.status("b")
		return strings.Contains(s.LastError, "own etcd"), fmt.Sprintf("%+v", s)
	})
	if after := mustRead(t, a.cli, registry.Root); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("origin subtree changed:\n before %v\n after  %v", before, after)
	}
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// Fencing, claim by claim, against real etcds.
func TestFencing(t *testing.T) {
	a, b := newRegion(t, "a"), newRegion(t, "b")
	r, err := New(config(t, a, "a-1", 3*time.Second, b.peer()))
	if err != nil {
		t.Fatal(err)
	}
	p := r.peers[0]
	ctx := testCtx(t)
	elecPrefix := r.cfg.ElectionPrefix + "/"
	put, err := a.cli.Put(ctx, elecPrefix+"ours", "a-1") // our election key, first under the prefix
	if err != nil {
		t.Fatal(err)
	}
	ours := epoch{Rev: put.Header.Revision, Key: elecPrefix + "ours"}
	setFence := func(f fence) {
		t.Helper()
		v, _ := json.Marshal(f)
		if _, err := b.cli.Put(ctx, FenceKey("a"), string(v)); err != nil {
			t.Fatal(err)
		}
	}
	k, v := endpointKV(t, "a", 1, 1)
	write := []clientv3.Op{clientv3.OpPut(k, v)}

	f1, err := p.claim(ctx, b.cli, ours)
	if err != nil {
		t.Fatalf("claim on an empty peer: %v", err)
	}
	if err := p.commit(ctx, b.cli, 0, f1, write); err != nil {
		t.Fatalf("write fenced on our claim: %v", err)
	}
	// A new session re-claims: whatever the old one still has in flight
	// (delayed by a partition, say) is refused.
	f2, err := p.claim(ctx, b.cli, ours)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.commit(ctx, b.cli, 0, f1, write); !errors.Is(err, errFenced) {
		t.Fatalf("stale session's write: %v, want errFenced", err)
	}
	if err := p.commit(ctx, b.cli, 0, f2, write); err != nil {
		t.Fatal(err)
	}

	// A newer epoch on the peer while the local election says we lead: the
	// local etcd was restored and rewound its revisions. Take over.
	setFence(fence{Rev: ours.Rev + 1000, Target: "b", Leader: "ghost"})
	if _, err := p.claim(ctx, b.cli, ours); err != nil {
		t.Fatalf("claim over a fence from a rewound history: %v", err)
	}
	// Our own epoch written for another region: two peers are one etcd.
	setFence(fence{Rev: ours.Rev, Target: "c", Leader: "a-1"})
	if _, err := p.claim(ctx, b.cli, ours); err == nil || !strings.Contains(err.Error(), "are the same etcd") {
		t.Fatalf("claim over our epoch for another peer: %v", err)
	}
	// A successor leads locally and has claimed the peer: deposed.
	if _, err := a.cli.Delete(ctx, ours.Key); err != nil {
		t.Fatal(err)
	}
	succ, err := a.cli.Put(ctx, elecPrefix+"theirs", "a-2")
	if err != nil {
		t.Fatal(err)
	}
	setFence(fence{Rev: succ.Header.Revision, Target: "b", Leader: "a-2"})
	if _, err := p.claim(ctx, b.cli, ours); !errors.Is(err, errDeposed) {
		t.Fatalf("claim after a successor: %v, want errDeposed", err)
	}
	// The local etcd under a peer's name is refused.
	if err := r.putHome(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := p.claim(ctx, a.cli, ours); !errors.Is(err, errSelfPeer) {
		t.Fatalf("claim on the local etcd: %v, want errSelfPeer", err)
	}
}
