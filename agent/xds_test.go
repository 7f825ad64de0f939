package agent_test

// The agent's xDS, end to end: a real registrar on a real etcd, a real
// agent with --xds-addr, real gRPC backends, and grpc-go's own xDS client
// (the xds:/// resolver with a per-client bootstrap) doing real RPCs
// through what the agent serves from its client cache.

import (
	"context"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"

	"github.com/aethermesh/aether/agent"
	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/internal/testutil/regtest"
	"github.com/aethermesh/aether/internal/testutil/wait"
	"github.com/aethermesh/aether/internal/testutil/xdstest"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/server"
)

// Bounds. A change made on the agent's registrar reaches the proxy's
// picks through the registrar's stream to the agent's client, OnChange,
// the feed's rebuild and one xDS push: measured well under a second, the
// bound leaves room for the race detector and a loaded machine. A first
// xDS client fetches LDS, RDS, CDS and EDS and connects (firstBound).
// After a registrar restart the agent's client reconnects with its
// backoff, full jitter up to client.DefaultBackoffMax (10s), hence
// rejoinBound.
const (
	changeBound = 3 * time.Second
	firstBound  = 10 * time.Second
	rejoinBound = 20 * time.Second
	xdsLinger   = 300 * time.Millisecond
)

// ipBackend is a grpc.testing TestService on its own loopback IP (an
// endpoint's identity is its IP, so backends of one service need one
// each), answering with its address as xdstest's backends do, so
// xdstest.WaitSpread and xdstest.Only judge it.
type ipBackend struct {
	testgrpc.UnimplementedTestServiceServer
	*xdstest.Backend
	ip   string
	port uint32
}

func (b *ipBackend) UnaryCall(context.Context, *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	return &testgrpc.SimpleResponse{ServerId: b.Addr, Hostname: b.Addr}, nil
}

func startIPBackend(t *testing.T, ip string) *ipBackend {
	t.Helper()
	lis, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatalf("listen on %s (every 127.0.0.0/8 address is loopback on Linux): %v", ip, err)
	}
	b := &ipBackend{Backend: &xdstest.Backend{Addr: lis.Addr().String()}, ip: ip, port: uint32(lis.Addr().(*net.TCPAddr).Port)}
	g := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(g, b)
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(lis) }()
	t.Cleanup(func() { g.Stop(); <-done })
	return b
}

// endpoint is b as a static (node-less) gRPC endpoint of svc in zone z1.
func (b *ipBackend) endpoint(svc string) *registryv1.ServiceEndpoint {
	return &registryv1.ServiceEndpoint{
		Service: svc, Protocol: registryv1.Protocol_PROTOCOL_GRPC, Ip: b.ip,
		Ports: []*registryv1.Port{{Name: "grpc", Port: b.port}}, Zone: "z1",
	}
}

func only(bs ...*ipBackend) func(map[string]int) bool {
	xs := make([]*xdstest.Backend, 0, len(bs))
	for _, b := range bs {
		xs = append(xs, b.Backend)
	}
	return xdstest.Only(xs...)
}

// startRegistrar starts a registrar on addr over etcd; the returned stop
// closes it (once: the test may stop it before its cleanup does).
func startRegistrar(t *testing.T, etcd *etcdtest.Cluster, addr string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := server.Start(ctx, server.Config{EtcdEndpoints: etcd.Endpoints(), GRPCAddr: addr, HTTPAddr: "127.0.0.1:0",
		Options: registrar.Options{NodeTTL: 5 * time.Second, Logger: regtest.QuietLogger()}})
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = s.Close(ctx)
		})
	}
	t.Cleanup(stop)
	return stop
}

// startXDSAgent runs an agent with xDS on a free loopback port, one
// endpoint of its own (service "own"), against registrar addr.
func startXDSAgent(t *testing.T, addr string) (*agent.Agent, func() error) {
	t.Helper()
	a, err := agent.New(agent.Config{
		Node: "node-a", Zone: "z1", Registrars: []string{addr},
		Endpoints: []*registryv1.ServiceEndpoint{{Service: "own", Protocol: registryv1.Protocol_PROTOCOL_GRPC, Ip: "127.0.0.99",
			Ports: []*registryv1.Port{{Name: "grpc", Port: 1}}}},
		DrainPeriod: 100 * time.Millisecond,
		XDSAddr:     "127.0.0.1:0",
		XDSLinger:   xdsLinger,
		Logger:      regtest.QuietLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	stop, _ := runAgent(t, a)
	return a, stop
}

func unregister(t *testing.T, c registrarv1.RegistrarClient, e *registryv1.ServiceEndpoint) {
	t.Helper()
	if _, err := c.UnregisterEndpoint(callCtx(t), &registrarv1.UnregisterEndpointRequest{Service: e.Service, Protocol: e.Protocol, Ip: e.Ip}); err != nil {
		t.Fatalf("unregister %s %s: %v", e.Service, e.Ip, err)
	}
}

func watches(a *agent.Agent, svc string) bool { return slices.Contains(a.Watched(), svc) }

// (a) and (b): a proxyless gRPC client through the agent reaches the
// service's SERVING endpoints and follows registrations; the service is
// in the agent's subscription only while an xDS client asks for it.
func TestAgentXDSServesFromItsCacheOnDemand(t *testing.T) {
	etcd := etcdtest.Start(t)
	addr := regtest.FreeAddr(t)
	startRegistrar(t, etcd, addr)
	reg := regtest.Dial(t, addr)
	b1, b2, b3 := startIPBackend(t, "127.0.0.11"), startIPBackend(t, "127.0.0.12"), startIPBackend(t, "127.0.0.13")
	regtest.Register(t, reg, b1.endpoint("web"))
	regtest.Register(t, reg, b2.endpoint("web"))

	a, _ := startXDSAgent(t, addr)
	wait.For(t, "the agent watching its own service", firstBound, func() bool { return watches(a, "own") })
	// No xDS client has asked: web is registered but not watched.
	time.Sleep(2 * xdsLinger)
	if got := a.Watched(); !slices.Equal(got, []string{"own"}) {
		t.Fatalf("watched before any xDS client asked: %v, want [own]", got)
	}

	cc := xdstest.Client(t, "web", xdstest.Bootstrap(a.XDSAddr(), "proxy-1", xdstest.Locality{Region: "default", Zone: "z1"}))
	start := time.Now()
	xdstest.WaitSpread(t, cc, only(b1, b2), firstBound)
	t.Logf("first RPCs through the agent's xDS to both SERVING endpoints after %v", time.Since(start).Round(time.Millisecond))
	if !watches(a, "web") {
		t.Fatalf("web not watched while an xDS client asks for it: %v", a.Watched())
	}

	start = time.Now()
	regtest.Register(t, reg, b3.endpoint("web"))
	xdstest.WaitSpread(t, cc, only(b1, b2, b3), changeBound)
	t.Logf("registration reached the picks in %v (bound %v)", time.Since(start).Round(time.Millisecond), changeBound)

	start = time.Now()
	unregister(t, reg, b1.endpoint("web"))
	xdstest.WaitSpread(t, cc, only(b2, b3), changeBound)
	t.Logf("deregistration reached the picks in %v (bound %v)", time.Since(start).Round(time.Millisecond), changeBound)

	// The client goes: web leaves the subscription after the linger; the
	// agent's own service stays.
	start = time.Now()
	cc.Close()
	wait.For(t, "web leaving the agent's subscription", xdsLinger+changeBound, func() bool { return !watches(a, "web") })
	t.Logf("web left the subscription %v after the last xDS client closed (linger %v)", time.Since(start).Round(time.Millisecond), xdsLinger)
	if !watches(a, "own") {
		t.Fatalf("the agent's own service left its subscription: %v", a.Watched())
	}
}

// (c) With every registrar down the agent keeps serving the last config,
// to the client it had and to a new one, and keeps the service cached
// when every proxy has gone, for the one that comes back; a registrar
// back on the same etcd brings its changes to it.
func TestAgentXDSServesThroughARegistrarOutage(t *testing.T) {
	etcd := etcdtest.Start(t)
	addr := regtest.FreeAddr(t)
	stop := startRegistrar(t, etcd, addr)
	reg := regtest.Dial(t, addr)
	b1, b2, b3 := startIPBackend(t, "127.0.0.21"), startIPBackend(t, "127.0.0.22"), startIPBackend(t, "127.0.0.23")
	regtest.Register(t, reg, b1.endpoint("web"))
	regtest.Register(t, reg, b2.endpoint("web"))

	a, stopAgent := startXDSAgent(t, addr)
	boot := func(node string) []byte {
		return xdstest.Bootstrap(a.XDSAddr(), node, xdstest.Locality{Region: "default", Zone: "z1"})
	}
	old := xdstest.Client(t, "web", boot("proxy-old"))
	xdstest.WaitSpread(t, old, only(b1, b2), firstBound)

	stop() // the only registrar: every registrar is down
	if _, err := reg.ListAllEndpoints(callCtx(t), &registrarv1.ListAllEndpointsRequest{}); err == nil {
		t.Fatal("the registrar still answers after Close")
	}
	xdstest.WaitSpread(t, old, only(b1, b2), changeBound)
	start := time.Now()
	fresh := xdstest.Client(t, "web", boot("proxy-new"))
	xdstest.WaitSpread(t, fresh, only(b1, b2), firstBound)
	t.Logf("a new xDS client got the cached config with no registrar up in %v", time.Since(start).Round(time.Millisecond))

	// Every proxy goes (restarts) during the outage: web stays cached past
	// its linger, since it could not be fetched back, and the proxy that
	// comes back is served from the cache.
	old.Close()
	fresh.Close()
	time.Sleep(3 * xdsLinger)
	if !watches(a, "web") {
		t.Fatalf("web left the subscription while no registrar was reachable: %v", a.Watched())
	}
	again := xdstest.Client(t, "web", boot("proxy-again"))
	xdstest.WaitSpread(t, again, only(b1, b2), firstBound)

	startRegistrar(t, etcd, addr)
	start = time.Now()
	// A new connection: the old one backs off after its failures.
	regtest.Register(t, regtest.Dial(t, addr), b3.endpoint("web"))
	xdstest.WaitSpread(t, again, only(b1, b2, b3), rejoinBound)
	t.Logf("a change on the restarted registrar reached the xDS client in %v (bound %v: the client's reconnect backoff)",
		time.Since(start).Round(time.Millisecond), rejoinBound)
	// Stopped before the registrar's cleanup, so its drain reaches one.
	if err := stopAgent(); err != nil {
		t.Fatalf("agent: %v", err)
	}
}

// Demand over delta xDS, on a stream that stays open: a subscription to
// web's load assignment brings web into the agent's cache and to the
// client; the unsubscription takes it out again after the linger.
func TestAgentXDSDeltaSubscribeAndUnsubscribe(t *testing.T) {
	etcd := etcdtest.Start(t)
	addr := regtest.FreeAddr(t)
	startRegistrar(t, etcd, addr)
	reg := regtest.Dial(t, addr)
	b1 := startIPBackend(t, "127.0.0.31")
	regtest.Register(t, reg, b1.endpoint("web"))

	a, _ := startXDSAgent(t, addr)
	wait.For(t, "the agent watching its own service", firstBound, func() bool { return watches(a, "own") })
	d := xdstest.DeltaProbe(t, a.XDSAddr(), xdstest.Node("delta-1", xdstest.Locality{Region: "default", Zone: "z1"}))
	d.Subscribe(resourcev3.EndpointType, "web")
	start := time.Now()
	for {
		r := d.NextOf(resourcev3.EndpointType, firstBound)
		if names := xdstest.Names(r); slices.Contains(names, "web") {
			break
		}
	}
	t.Logf("web's load assignment reached the delta client %v after it subscribed", time.Since(start).Round(time.Millisecond))
	if !watches(a, "web") {
		t.Fatalf("web not watched while subscribed over delta: %v", a.Watched())
	}
	d.Unsubscribe(resourcev3.EndpointType, "web")
	wait.For(t, "web leaving the agent's subscription, the stream still open", xdsLinger+changeBound, func() bool { return !watches(a, "web") })
}
