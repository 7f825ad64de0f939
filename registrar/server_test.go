package registrar_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/internal/testutil/regtest"
	"github.com/aethermesh/aether/internal/testutil/wait"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/registry"
	"github.com/aethermesh/aether/server"
)

// waitFor waits for a condition; see package wait.
var waitFor = wait.For

var (
	quietLogger  = regtest.QuietLogger
	dial         = regtest.Dial
	ep           = regtest.EP
	register     = regtest.Register
	etcdKey      = regtest.EtcdKey
	metricValue  = regtest.MetricValue
	scrapeMetric = regtest.ScrapeMetric
	get          = regtest.Get
)

func startRegistrar(t testing.TB, endpoints []string, mut ...func(*server.Config)) *server.Server {
	t.Helper()
	o := server.Config{EtcdEndpoints: endpoints, Options: registrar.Options{ClusterName: "c1", Region: "r1"}}
	o.NodeTTL = testNodeTTL
	for _, m := range mut {
		m(&o)
	}
	return regtest.Start(t, o)
}

// testNodeTTL is the tests' --node-ttl where they set none. ep's endpoints
// belong to node n1, which most tests never announce, and the ghost sweep
// removes such an endpoint once it is NodeTTL old: under the default 30s,
// a test that a loaded machine (many tests in parallel, the race
// detector) slows past that would see its endpoints vanish. The tests of
// nodes and of the sweep set NodeTTL themselves.
const testNodeTTL = time.Hour

func unregister(t testing.TB, c registrarv1.RegistrarClient, svc, ip string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.UnregisterEndpoint(ctx, &registrarv1.UnregisterEndpointRequest{Service: svc, Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: ip}); err != nil {
		t.Fatalf("unregister %s %s: %v", svc, ip, err)
	}
}

// recorder keeps every message a watch stream received, and how it ended.
type recorder struct {
	mu     sync.Mutex
	events []*registrarv1.EndpointEvent
	err    error
	done   bool
	cancel context.CancelFunc
}

func watch(t testing.TB, c registrarv1.RegistrarClient, req *registrarv1.WatchEndpointsRequest) *recorder {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := c.WatchEndpoints(ctx, req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	r := &recorder{cancel: cancel}
	go func() {
		for {
			ev, err := stream.Recv()
			r.mu.Lock()
			if err != nil {
				r.err, r.done = err, true
				r.mu.Unlock()
				return
			}
			r.events = append(r.events, ev)
			r.mu.Unlock()
		}
	}()
	t.Cleanup(cancel)
	return r
}

func (r *recorder) snapshot() []*registrarv1.EndpointEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*registrarv1.EndpointEvent(nil), r.events...)
}

func (r *recorder) ended() (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.done, r.err
}

// changes are the ADDED/UPDATED/REMOVED events, rendered "TYPE service ip".
func (r *recorder) changes() []string {
	var out []string
	for _, ev := range r.snapshot() {
		switch ev.Type {
		case registrarv1.EndpointEvent_FULL_SNAPSHOT, registrarv1.EndpointEvent_PROGRESS:
			continue
		}
		out = append(out, fmt.Sprintf("%s %s %s", strings.TrimPrefix(ev.Type.String(), "ENDPOINT_"), ev.Endpoint.Service, ev.Endpoint.Ip))
	}
	return out
}

func (r *recorder) has(change string) bool {
	for _, c := range r.changes() {
		if c == change {
			return true
		}
	}
	return false
}

func (r *recorder) waitSnapshot(t testing.TB) []*registryv1.ServiceEndpoint {
	t.Helper()
	var eps []*registryv1.ServiceEndpoint
	waitFor(t, "full snapshot", 10*time.Second, func() bool {
		eps = nil
		for _, ev := range r.snapshot() {
			if ev.Type == registrarv1.EndpointEvent_FULL_SNAPSHOT {
				eps = append(eps, ev.Endpoints...)
				if !ev.SnapshotContinues {
					return true
				}
			}
		}
		return false
	})
	return eps
}

func (r *recorder) lastVersion() string {
	evs := r.snapshot()
	if len(evs) == 0 {
		return ""
	}
	return evs[len(evs)-1].Version
}

func countKeys(t testing.TB, cli *clientv3.Client) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, registry.Root, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count
}

func TestWritePathReachesWatcherAndSchemaKey(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	s := startRegistrar(t, etcd.Endpoints())
	c := dial(t, s.GRPCAddr())
	w := watch(t, c, &registrarv1.WatchEndpointsRequest{NodeName: "n1"})
	if got := w.waitSnapshot(t); len(got) != 0 {
		t.Fatalf("snapshot of an empty registry has %d endpoints", len(got))
	}

	e := ep("payments", "10.1.0.7", 8443)
	e.Metadata = map[string]string{"version": "v2"}
	resp := register(t, c, e)
	if resp.Endpoint.Region != "r1" || resp.Endpoint.Cluster != "c1" || resp.Endpoint.CreatedAt == nil {
		t.Fatalf("stored endpoint lacks origin or timestamps: %v", resp.Endpoint)
	}
	waitFor(t, "watcher sees ADDED", 5*time.Second, func() bool { return w.has("ADDED payments 10.1.0.7") })

	var key string
	var stored *registryv1.ServiceEndpoint
	waitFor(t, "write-behind reaches etcd", 10*time.Second, func() bool {
		key, stored = etcdKey(t, cli, e)
		return stored != nil
	})
	if want := "/aether/v1/regions/r1/clusters/c1/services/payments/protocols/http1/endpoints/10.1.0.7"; key != want {
		t.Fatalf("key %q, want %q", key, want)
	}
	if stored.Metadata["version"] != "v2" || stored.Ports[0].Port != 8443 || stored.Region != "r1" {
		t.Fatalf("stored value = %v", stored)
	}

	unregister(t, c, "payments", "10.1.0.7")
	waitFor(t, "watcher sees REMOVED", 5*time.Second, func() bool { return w.has("REMOVED payments 10.1.0.7") })
	waitFor(t, "delete reaches etcd", 10*time.Second, func() bool { _, v := etcdKey(t, cli, e); return v == nil })

	// Events so far are strictly ordered by sequence.
	var last uint64
	for _, ev := range w.snapshot() {
		if ev.Type == registrarv1.EndpointEvent_ENDPOINT_ADDED || ev.Type == registrarv1.EndpointEvent_ENDPOINT_REMOVED {
			if ev.Sequence <= last {
				t.Fatalf("sequence %d after %d", ev.Sequence, last)
			}
			last = ev.Sequence
		}
	}
}

func TestCrossReplica(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	a := startRegistrar(t, etcd.Endpoints())
	b := startRegistrar(t, etcd.Endpoints())
	ca, cb := dial(t, a.GRPCAddr()), dial(t, b.GRPCAddr())
	w := watch(t, cb, &registrarv1.WatchEndpointsRequest{Services: []string{"web"}})
	w.waitSnapshot(t)

	register(t, ca, ep("web", "10.0.0.1", 80))
	waitFor(t, "B's watcher sees A's registration", 10*time.Second, func() bool { return w.has("ADDED web 10.0.0.1") })
	// B's own reads agree.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l, err := cb.ListAllEndpoints(ctx, &registrarv1.ListAllEndpointsRequest{Services: []string{"web"}})
	if err != nil || len(l.Endpoints) != 1 {
		t.Fatalf("B lists %v, %v", l, err)
	}
	// B can unregister what A registered (same cluster), and A's watchers see it.
	wa := watch(t, ca, &registrarv1.WatchEndpointsRequest{})
	wa.waitSnapshot(t)
	unregister(t, cb, "web", "10.0.0.1")
	waitFor(t, "A's watcher sees B's removal", 10*time.Second, func() bool { return wa.has("REMOVED web 10.0.0.1") })
	unregisterSeen := func() bool { return w.has("REMOVED web 10.0.0.1") }
	waitFor(t, "B's watcher sees the removal", 5*time.Second, unregisterSeen)
	if n := len(w.changes()); n != 2 {
		t.Fatalf("B's watcher got %d changes (%v), want exactly ADDED and REMOVED", n, w.changes())
	}
}

func TestRestartOnSameDataDirServesSameEndpoints(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	embedded := func(o *server.Config) {
		o.EtcdEndpoints = nil
		o.DataDir = dir
		o.EmbeddedEtcdAddr = "127.0.0.1:0"
		o.EmbeddedEtcdPeerAddr = "127.0.0.1:0"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	o := server.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Options: registrar.Options{ClusterName: "c1", Region: "r1", Logger: quietLogger()}}
	embedded(&o)
	s, err := server.Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, s.GRPCAddr())
	for i := 1; i <= 5; i++ {
		register(t, c, ep("web", fmt.Sprintf("10.0.0.%d", i), 80))
	}
	// Close flushes what is queued.
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}

	s2 := startRegistrar(t, nil, embedded)
	l, err := dial(t, s2.GRPCAddr()).ListAllEndpoints(ctx, &registrarv1.ListAllEndpointsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Endpoints) != 5 {
		t.Fatalf("after restart: %d endpoints, want 5", len(l.Endpoints))
	}
}

func TestEtcdUnavailableServesSnapshotAndLosesNoWrite(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	s := startRegistrar(t, etcd.Endpoints())
	c := dial(t, s.GRPCAddr())
	for i := 1; i <= 3; i++ {
		register(t, c, ep("web", fmt.Sprintf("10.0.0.%d", i), 80))
	}
	waitFor(t, "initial writes persisted", 10*time.Second, func() bool { return countKeys(t, cli) == 3 })

	etcd.Stop()
	// Writes are acknowledged and visible at once; reads and watches serve.
	w := watch(t, c, &registrarv1.WatchEndpointsRequest{})
	if got := w.waitSnapshot(t); len(got) != 3 {
		t.Fatalf("snapshot during outage has %d endpoints, want 3", len(got))
	}
	for i := 4; i <= 40; i++ {
		register(t, c, ep("web", fmt.Sprintf("10.0.0.%d", i), 80))
	}
	unregister(t, c, "web", "10.0.0.1")
	waitFor(t, "watcher sees outage writes", 5*time.Second, func() bool {
		return w.has("ADDED web 10.0.0.40") && w.has("REMOVED web 10.0.0.1")
	})
	// Flushes fail and are retried while etcd is down; nothing is lost.
	waitFor(t, "a failed flush", 20*time.Second, func() bool {
		return metricValue(t, s.HTTPAddr(), "registrar_write_flush_errors_total") >= 1
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l, err := c.ListAllEndpoints(ctx, &registrarv1.ListAllEndpointsRequest{})
	if err != nil || len(l.Endpoints) != 39 {
		t.Fatalf("list during outage: %d endpoints, %v; want 39", len(l.GetEndpoints()), err)
	}
	if p := s.Registrar().PendingWrites(); p != 38 {
		t.Fatalf("pending writes = %d, want 38", p)
	}

	etcd.Restart(t)
	cli = etcd.Client(t)
	waitFor(t, "queued writes reach etcd", 30*time.Second, func() bool { return s.Registrar().PendingWrites() == 0 })
	if n := countKeys(t, cli); n != 39 {
		t.Fatalf("etcd holds %d endpoints, want 39", n)
	}
	if _, v := etcdKey(t, cli, ep("web", "10.0.0.1", 80)); v != nil {
		t.Fatal("the unregister made during the outage did not reach etcd")
	}
	if _, v := etcdKey(t, cli, ep("web", "10.0.0.40", 80)); v == nil {
		t.Fatal("a register made during the outage did not reach etcd")
	}
}
