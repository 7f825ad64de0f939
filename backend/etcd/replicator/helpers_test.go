package replicator

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/faultproxy"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/internal/testutil/wait"
	"github.com/aethermesh/aether/registry"
)

// testWriter sends log lines to t.Log, so they show for failing or verbose
// tests only, attributed to the right test.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func testLogger(t testing.TB) *slog.Logger {
	lvl := slog.LevelInfo
	if os.Getenv("REPLICATOR_TEST_DEBUG") != "" {
		lvl = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: lvl}))
}

// testCtx bounds one etcd call of a test.
func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// region is one region's etcd and a client of it for the test's own writes.
type region struct {
	name string
	etcd *etcdtest.Cluster
	cli  *clientv3.Client
}

func newRegion(t testing.TB, name string) *region {
	t.Helper()
	e := etcdtest.Start(t)
	return &region{name: name, etcd: e, cli: e.Client(t)}
}

// peer is the region as a direct peer of another.
func (g *region) peer() Peer { return Peer{Region: g.name, Endpoints: g.etcd.Endpoints()} }

// via is the region as a peer reached through a fault proxy.
func (g *region) via(t testing.TB) (Peer, *faultproxy.Proxy) {
	t.Helper()
	px, err := faultproxy.Start(g.etcd.ClientAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = px.Close() })
	return Peer{Region: g.name, Endpoints: []string{px.Addr()}}, px
}

// running is a replicator running in the background.
type running struct {
	t      testing.TB
	r      *Replicator
	cancel context.CancelFunc
	done   chan error

	stopOnce sync.Once
	err      error
}

// config is the test default: fast TTLs, logs to t.
func config(t testing.TB, g *region, identity string, leaseTTL time.Duration, peers ...Peer) Config {
	return Config{
		Region:     g.name,
		Local:      g.cli,
		Peers:      peers,
		LeaseTTL:   leaseTTL,
		SessionTTL: 2 * time.Second,
		Identity:   identity,
		Logger:     testLogger(t).With("replica", identity),
	}
}

func start(t testing.TB, cfg Config) *running {
	t.Helper()
	r, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return startReplicator(t, r)
}

func startReplicator(t testing.TB, r *Replicator) *running {
	ctx, cancel := context.WithCancel(context.Background())
	h := &running{t: t, r: r, cancel: cancel, done: make(chan error, 1)}
	go func() { h.done <- r.Run(ctx) }()
	t.Cleanup(func() { h.stop() })
	return h
}

// stop cancels Run and waits for it to return.
func (h *running) stop() error {
	h.stopOnce.Do(func() {
		h.cancel()
		select {
		case h.err = <-h.done:
		case <-time.After(20 * time.Second):
			h.t.Errorf("Run did not return within 20s of cancel")
		}
	})
	return h.err
}

func (h *running) status(peer string) PeerStatus {
	for _, s := range h.r.Status() {
		if s.Region == peer {
			return s
		}
	}
	h.t.Fatalf("no status for peer %s", peer)
	return PeerStatus{}
}

// kv is a stored key as the assertions need it.
type kv struct {
	Value   string
	Lease   int64
	ModRev  int64
	Version int64
}

// read returns every key under prefix, or an error (which pollers tolerate
// while a fault is in force).
func read(cli *clientv3.Client, prefix string) (map[string]kv, int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, 0, err
	}
	m := make(map[string]kv, len(resp.Kvs))
	for _, x := range resp.Kvs {
		m[string(x.Key)] = kv{Value: string(x.Value), Lease: x.Lease, ModRev: x.ModRevision, Version: x.Version}
	}
	return m, resp.Header.Revision, nil
}

func mustRead(t testing.TB, cli *clientv3.Client, prefix string) map[string]kv {
	t.Helper()
	m, _, err := read(cli, prefix)
	if err != nil {
		t.Fatalf("read %s: %v", prefix, err)
	}
	return m
}

func currentRev(t testing.TB, cli *clientv3.Client) int64 {
	t.Helper()
	resp, err := cli.Get(testCtx(t), "/")
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// endpointKV is endpoint i of region g (cluster c1), value generation gen:
// a real v1 key and encoded record, as the registrar writes them.
func endpointKV(t testing.TB, g string, i, gen int) (string, string) {
	t.Helper()
	ep := &registryv1.ServiceEndpoint{
		Region:   g,
		Cluster:  "c1",
		Service:  fmt.Sprintf("svc%d", i%3),
		Protocol: registryv1.Protocol_PROTOCOL_HTTP1,
		Ip:       fmt.Sprintf("10.%d.%d.%d", i>>16&0xff, i>>8&0xff, i&0xff),
		Ports:    []*registryv1.Port{{Name: "http", Port: 8080}},
		Node:     fmt.Sprintf("node-%d", gen),
		State:    registryv1.State_STATE_SERVING,
		Weight:   1,
	}
	key, err := registry.IDOf(ep).Key()
	if err != nil {
		t.Fatal(err)
	}
	val, err := registry.EncodeEndpoint(ep)
	if err != nil {
		t.Fatal(err)
	}
	return key, string(val)
}

// putEndpoints writes endpoints lo..hi-1 of g's subtree at generation gen,
// one Put each, and returns key → value.
func putEndpoints(t testing.TB, g *region, lo, hi, gen int) map[string]string {
	t.Helper()
	out := map[string]string{}
	for i := lo; i < hi; i++ {
		k, v := endpointKV(t, g.name, i, gen)
		if _, err := g.cli.Put(testCtx(t), k, v); err != nil {
			t.Fatalf("put %s: %v", k, err)
		}
		out[k] = v
	}
	return out
}

func deleteKey(t testing.TB, g *region, key string) {
	t.Helper()
	if _, err := g.cli.Delete(testCtx(t), key); err != nil {
		t.Fatalf("delete %s: %v", key, err)
	}
}

// mirrorOf reports whether dst's copy of origin's subtree equals the
// origin's (same keys, same values) and, if lease != 0, every copy is
// attached to it.
func mirrorOf(origin, dst *region, lease clientv3.LeaseID) (bool, string) {
	prefix := registry.RegionPrefix(origin.name)
	want, _, err := read(origin.cli, prefix)
	if err != nil {
		return false, "read origin: " + err.Error()
	}
	got, _, err := read(dst.cli, prefix)
	if err != nil {
		return false, "read mirror: " + err.Error()
	}
	return sameMirror(want, got, lease)
}

func sameMirror(want, got map[string]kv, lease clientv3.LeaseID) (bool, string) {
	var diffs []string
	for k, w := range want {
		g, ok := got[k]
		switch {
		case !ok:
			diffs = append(diffs, "missing "+k)
		case g.Value != w.Value:
			diffs = append(diffs, "value differs at "+k)
		case lease != 0 && clientv3.LeaseID(g.Lease) != lease:
			diffs = append(diffs, fmt.Sprintf("lease %x, want %x at %s", g.Lease, int64(lease), k))
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			diffs = append(diffs, "extra "+k)
		}
	}
	if len(diffs) == 0 {
		return true, ""
	}
	sort.Strings(diffs)
	if len(diffs) > 5 {
		diffs = append(diffs[:5], fmt.Sprintf("... %d more", len(diffs)-5))
	}
	return false, fmt.Sprintf("%d keys at origin, %d in mirror: %s", len(want), len(got), strings.Join(diffs, "; "))
}

// leaseOn is the lease a running leader holds on peer, once it is synced.
func (h *running) leaseOn(peer string) (clientv3.LeaseID, bool) {
	s := h.status(peer)
	return s.LeaseID, s.IsLeader && s.Synced && s.LeaseID != 0
}

// waitMirrored waits until dst mirrors origin exactly under the lease h
// holds on dst, and returns that lease.
func waitMirrored(t testing.TB, h *running, origin, dst *region, timeout time.Duration) clientv3.LeaseID {
	t.Helper()
	var lease clientv3.LeaseID
	wait.ForState(t, fmt.Sprintf("%s's subtree mirrored in %s", origin.name, dst.name), timeout, func() (bool, string) {
		l, ok := h.leaseOn(dst.name)
		if !ok {
			return false, fmt.Sprintf("replicator not synced with %s: %+v", dst.name, h.status(dst.name))
		}
		lease = l
		return mirrorOf(origin, dst, l)
	})
	return lease
}

// waitRevisionStable asserts that no etcd of regs changes revision for d:
// a replication loop would keep writing.
func waitRevisionStable(t testing.TB, d time.Duration, regs ...*region) {
	t.Helper()
	before := make([]int64, len(regs))
	for i, g := range regs {
		before[i] = currentRev(t, g.cli)
	}
	time.Sleep(d)
	for i, g := range regs {
		if now := currentRev(t, g.cli); now != before[i] {
			t.Fatalf("etcd of %s went from revision %d to %d in %v with no writes: something keeps writing", g.name, before[i], now, d)
		}
	}
}
