package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

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
	quietLogger = regtest.QuietLogger
	freeAddr    = regtest.FreeAddr
)

// testLogger sends the client's logs to t.Log: shown for failing tests only.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// testRegistrar is a real registrar process on etcd; stop is idempotent and
// also runs at cleanup.
type testRegistrar struct {
	*server.Server
	once sync.Once
}

func (r *testRegistrar) stop(t testing.TB) {
	r.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := r.Close(ctx); err != nil {
			t.Logf("closing registrar %s: %v", r.GRPCAddr(), err)
		}
	})
}

// crash ends the registrar as kill -9 would for its writes: what the
// write-behind flusher has not persisted yet is lost (the shutdown flush
// gets a context that has already ended).
func (r *testRegistrar) crash(t testing.TB) {
	r.once.Do(func() {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		err := r.Close(ctx)
		t.Logf("crashed registrar %s: %v", r.GRPCAddr(), err)
	})
}

// startRegistrar starts a registrar of region r1, cluster c1 on etcd at
// addr ("" for a free port); mut adjusts its options. A fixed address may
// still be held by the previous incarnation's sockets for a moment, so
// binding is retried.
func startRegistrar(t testing.TB, etcd *etcdtest.Cluster, addr string, mut ...func(*server.Config)) *testRegistrar {
	t.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	o := server.Config{
		EtcdEndpoints: etcd.Endpoints(),
		GRPCAddr:      addr,
		HTTPAddr:      "127.0.0.1:0",
		Options: registrar.Options{
			ClusterName: "c1",
			Region:      "r1",
			Logger:      quietLogger(),
		},
	}
	for _, m := range mut {
		m(&o)
	}
	var s *server.Server
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		var err error
		s, err = server.Start(ctx, o)
		cancel()
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EADDRINUSE) || attempt == 50 {
			t.Fatalf("starting registrar at %s: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	r := &testRegistrar{Server: s}
	t.Cleanup(func() { r.stop(t) })
	return r
}

func dial(t testing.TB, addr string) registrarv1.RegistrarClient { return regtest.Dial(t, addr) }

func ep(svc, ip string, port uint32) *registryv1.ServiceEndpoint {
	return &registryv1.ServiceEndpoint{
		Service: svc, Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: ip,
		Ports: []*registryv1.Port{{Name: "http", Port: port}}, Node: "n1", Zone: "z1",
	}
}

func id(svc, ip string) registry.EndpointID {
	return registry.EndpointID{Region: "r1", Cluster: "c1", Service: svc, Protocol: registryv1.Protocol_PROTOCOL_HTTP1, IP: ip}
}

func register(t testing.TB, c registrarv1.RegistrarClient, e *registryv1.ServiceEndpoint) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.RegisterEndpoint(ctx, &registrarv1.RegisterEndpointRequest{Endpoint: e}); err != nil {
		t.Fatalf("register %s %s: %v", e.Service, e.Ip, err)
	}
}

func unregister(t testing.TB, c registrarv1.RegistrarClient, svc, ip string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.UnregisterEndpoint(ctx, &registrarv1.UnregisterEndpointRequest{Service: svc, Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: ip}); err != nil {
		t.Fatalf("unregister %s %s: %v", svc, ip, err)
	}
}

func list(t testing.TB, c registrarv1.RegistrarClient, services ...string) []*registryv1.ServiceEndpoint {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.ListAllEndpoints(ctx, &registrarv1.ListAllEndpointsRequest{Services: services})
	if err != nil {
		t.Fatalf("list %v: %v", services, err)
	}
	return resp.Endpoints
}

// newClient starts a client of origin r1/c1 with fast backoff; it is closed
// at cleanup.
func newClient(t testing.TB, cfg Config) *Client {
	t.Helper()
	cfg.Region, cfg.Cluster = cmpOr(cfg.Region, "r1"), cmpOr(cfg.Cluster, "c1")
	cfg.Node = cmpOr(cfg.Node, "agent-1")
	if cfg.BackoffBase == 0 {
		cfg.BackoffBase, cfg.BackoffMax = 10*time.Millisecond, 200*time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func waitSynced(t testing.TB, c *Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
}

// cached reports whether the client serves a service from its cache (as
// opposed to the fallback RPC).
func cached(c *Client, svc string) bool {
	v := c.view.Load()
	if _, ok := v.services[svc]; ok {
		return true
	}
	return v.all && v.synced
}

func endpointsOf(t testing.TB, c *Client, svc string) []*registryv1.ServiceEndpoint {
	t.Helper()
	eps, err := c.Endpoints(context.Background(), svc)
	if err != nil {
		t.Fatalf("Endpoints(%s): %v", svc, err)
	}
	return eps
}

func allOf(t testing.TB, c *Client) []*registryv1.ServiceEndpoint {
	t.Helper()
	eps, err := c.AllEndpoints(context.Background())
	if err != nil {
		t.Fatalf("AllEndpoints: %v", err)
	}
	return eps
}

// ips renders endpoints as "service ip" strings, in order.
func ips(eps []*registryv1.ServiceEndpoint) []string {
	out := make([]string, len(eps))
	for i, e := range eps {
		out[i] = e.Service + " " + e.Ip
	}
	return out
}

// sameEndpoints reports whether two lists hold the same endpoints with the
// same attributes (timestamps aside), in any order.
func sameEndpoints(a, b []*registryv1.ServiceEndpoint) bool {
	if len(a) != len(b) {
		return false
	}
	m := make(map[registry.EndpointID]*registryv1.ServiceEndpoint, len(a))
	for _, e := range a {
		m[registry.IDOf(e)] = e
	}
	for _, e := range b {
		o, ok := m[registry.IDOf(e)]
		if !ok || !registry.SameAttributes(o, e) {
			return false
		}
	}
	return true
}

// recorder keeps what OnChange was called with, as "TYPE service ip".
type recorder struct {
	mu      sync.Mutex
	changes []string
}

func (r *recorder) record(ch Change) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.changes = append(r.changes, fmt.Sprintf("%s %s %s", ch.Type, ch.Endpoint.Service, ch.Endpoint.Ip))
}

func (r *recorder) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.changes)
}

// since returns the changes after the first n, sorted (the tests compare
// sets: order across endpoints is the registrar's business).
func (r *recorder) since(n int) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := slices.Clone(r.changes[n:])
	slices.Sort(out)
	return out
}

func sorted(s ...string) []string {
	slices.Sort(s)
	return s
}

// metricValue reads one unlabelled counter or gauge from a registry.
func metricValue(t testing.TB, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		m := mf.GetMetric()[0]
		if m.GetCounter() != nil {
			return m.GetCounter().GetValue()
		}
		return m.GetGauge().GetValue()
	}
	t.Fatalf("metric %s not registered", name)
	return 0
}

// settled reports whether no write of the client is still in the overlay.
func settled(c *Client) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.st.writes) == 0
}

// quiet reports whether OnChange has been called with every change the
// client committed so far, so a recorder can be compared exactly.
func quiet(c *Client) bool { return c.notify == nil || c.notify.idle() }
