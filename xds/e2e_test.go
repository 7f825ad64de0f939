package xds_test

// End-to-end: a real registrar (server, with --xds-addr) on a real etcd,
// real gRPC backends on loopback addresses, and grpc-go's own xDS client
// (the xds:/// resolver with a per-client bootstrap) doing real RPCs.
//
// The harness here is minimal and inline (backends, a client, a spread
// of picks); internal/testutil/xdstest is to replace it.

import (
	"context"
	"fmt"
	"net"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	grpcxds "google.golang.org/grpc/xds" // registers the xDS balancers too

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/internal/testutil/meshtest"
	"github.com/aethermesh/aether/internal/testutil/regtest"
	"github.com/aethermesh/aether/internal/testutil/wait"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/server"
)

// Bounds the tests hold the xDS path to. A change made on the registrar
// that serves xDS reaches the client's picks through the in-process feed
// and one push; one made on another region's registrar first goes
// through its write-behind (100 ms batches) and the etcd watch. Both are
// measured and logged; the bound leaves room for the race detector and
// a loaded machine.
const (
	localBound  = 2 * time.Second
	remoteBound = 3 * time.Second
)

// backend is a real gRPC server (the health service: any unary method
// would do) on its own loopback IP, since an endpoint's identity is its
// IP: the client tells backends apart by the peer address of each RPC.
type backend struct {
	ip   string
	port uint32
}

func startBackend(t *testing.T, ip string) backend {
	t.Helper()
	lis, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatalf("listen on %s (every 127.0.0.0/8 address is loopback on Linux): %v", ip, err)
	}
	g := grpc.NewServer()
	hs := health.NewServer()
	healthpb.RegisterHealthServer(g, hs)
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(lis) }()
	t.Cleanup(func() { g.Stop(); <-done })
	return backend{ip: ip, port: uint32(lis.Addr().(*net.TCPAddr).Port)}
}

func (b backend) addr() string { return net.JoinHostPort(b.ip, fmt.Sprint(b.port)) }

// endpoint is b as service svc's gRPC endpoint in zone.
func (b backend) endpoint(svc, zone string) *registryv1.ServiceEndpoint {
	return &registryv1.ServiceEndpoint{
		Service: svc, Protocol: registryv1.Protocol_PROTOCOL_GRPC, Ip: b.ip,
		Ports: []*registryv1.Port{{Name: "grpc", Port: b.port}}, Node: "n1", Zone: zone,
	}
}

// xdsClient is grpc-go's xDS client for target, with a bootstrap of its
// own (no process-global GRPC_XDS_BOOTSTRAP): node id and locality as a
// proxyless client would send them.
func xdsClient(t *testing.T, xdsAddr, target, nodeID, region, zone string) *grpc.ClientConn {
	t.Helper()
	return xdsClientWith(t, xdsAddr, `{"type": "insecure"}`, target, nodeID, region, zone)
}

// xdsClientWith is xdsClient with the bootstrap's channel_creds entry.
func xdsClientWith(t *testing.T, xdsAddr, creds, target, nodeID, region, zone string) *grpc.ClientConn {
	t.Helper()
	bootstrap := fmt.Sprintf(`{
  "xds_servers": [{"server_uri": %q, "channel_creds": [%s], "server_features": ["xds_v3"]}],
  "node": {"id": %q, "locality": {"region": %q, "zone": %q}}
}`, xdsAddr, creds, nodeID, region, zone)
	builder, err := grpcxds.NewXDSResolverWithConfigForTesting([]byte(bootstrap))
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient("xds:///"+target, grpc.WithResolvers(builder), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// spread does n RPCs and counts them by the backend that served them
// ("error" for a failed one).
func spread(cc *grpc.ClientConn, n int) map[string]int {
	out := map[string]int{}
	hc := healthpb.NewHealthClient(cc)
	for range n {
		var p peer.Peer
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p), grpc.WaitForReady(true))
		cancel()
		if err != nil {
			out["error"]++
			continue
		}
		out[p.Addr.String()]++
	}
	return out
}

func show(m map[string]int) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

// only says whether the RPCs went to exactly the backends in want, each
// at least once.
func only(m map[string]int, want ...backend) bool {
	if len(m) != len(want) {
		return false
	}
	for _, b := range want {
		if m[b.addr()] == 0 {
			return false
		}
	}
	return true
}

// waitSpread waits until the picks go to exactly want and returns how
// long that took.
func waitSpread(t *testing.T, cc *grpc.ClientConn, what string, bound time.Duration, want ...backend) time.Duration {
	t.Helper()
	start := time.Now()
	wait.ForState(t, what, bound, func() (bool, string) {
		m := spread(cc, 4*len(want))
		return only(m, want...), show(m)
	})
	return time.Since(start)
}

type mesh struct {
	r1, r2 registrarv1.RegistrarClient
	xds    string
	srv    *server.Server
}

// startMesh starts region r1's registrar (zone z1) serving xDS and
// region r2's, both on one etcd: r1 sees r2's endpoints through its etcd
// watch, as it would a peer region's mirror.
func startMesh(t *testing.T) mesh {
	t.Helper()
	etcd := etcdtest.Start(t)
	s1 := regtest.Start(t, server.Config{EtcdEndpoints: etcd.Endpoints(), XDSAddr: "127.0.0.1:0",
		Options: registrar.Options{ClusterName: "c1", Region: "r1", Zone: "z1"}})
	s2 := regtest.Start(t, server.Config{EtcdEndpoints: etcd.Endpoints(),
		Options: registrar.Options{ClusterName: "c1", Region: "r2", Zone: "z1"}})
	return mesh{r1: regtest.Dial(t, s1.GRPCAddr()), r2: regtest.Dial(t, s2.GRPCAddr()), xds: s1.XDSAddr(), srv: s1}
}

func register(t *testing.T, c registrarv1.RegistrarClient, e *registryv1.ServiceEndpoint) time.Time {
	t.Helper()
	regtest.Register(t, c, e)
	return time.Now()
}

func deregister(t *testing.T, c registrarv1.RegistrarClient, e *registryv1.ServiceEndpoint) time.Time {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.UnregisterEndpoint(ctx, &registrarv1.UnregisterEndpointRequest{Service: e.Service, Protocol: e.Protocol, Ip: e.Ip, OwnerNode: e.Node}); err != nil {
		t.Fatalf("unregister %s %s: %v", e.Service, e.Ip, err)
	}
	return time.Now()
}

func drain(t *testing.T, c registrarv1.RegistrarClient, e *registryv1.ServiceEndpoint) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.DrainEndpoint(ctx, &registrarv1.DrainEndpointRequest{Service: e.Service, Protocol: e.Protocol, Ip: e.Ip}); err != nil {
		t.Fatalf("drain %s %s: %v", e.Service, e.Ip, err)
	}
}

// TestXDSClientFollowsTheRegistry: traffic reaches every SERVING
// endpoint; a registration adds one and a deregistration removes one,
// each within localBound; a DRAINING endpoint gets no new RPC.
func TestXDSClientFollowsTheRegistry(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	a, b, c, d := startBackend(t, "127.0.0.11"), startBackend(t, "127.0.0.12"), startBackend(t, "127.0.0.13"), startBackend(t, "127.0.0.14")
	for _, x := range []backend{a, b, c} {
		register(t, m.r1, x.endpoint("web", "z1"))
	}
	cc := xdsClient(t, m.xds, "web", "client-1", "r1", "z1")
	first := waitSpread(t, cc, "traffic on every serving endpoint", 10*time.Second, a, b, c)
	t.Logf("first RPCs on all three endpoints after %v (connect, LDS, RDS, CDS, EDS)", first)

	// Round robin within the locality: each of the three gets a third.
	counts := spread(cc, 300)
	for _, x := range []backend{a, b, c} {
		if n := counts[x.addr()]; n < 80 || n > 120 {
			t.Errorf("%s got %d of 300 RPCs, want about 100: %s", x.addr(), n, show(counts))
		}
	}

	at := register(t, m.r1, d.endpoint("web", "z1"))
	waitSpread(t, cc, "the registered endpoint to get traffic", localBound, a, b, c, d)
	t.Logf("register → traffic on the new endpoint: %v (bound %v)", time.Since(at), localBound)

	at = deregister(t, m.r1, d.endpoint("web", "z1"))
	waitSpread(t, cc, "the deregistered endpoint to get no traffic", localBound, a, b, c)
	t.Logf("deregister → no traffic on it: %v (bound %v)", time.Since(at), localBound)

	drain(t, m.r1, c.endpoint("web", "z1"))
	at = time.Now()
	waitSpread(t, cc, "the draining endpoint to get no traffic", localBound, a, b)
	t.Logf("drain → no new RPCs on it: %v (bound %v)", time.Since(at), localBound)
	if counts := spread(cc, 200); counts[c.addr()] != 0 || counts["error"] != 0 {
		t.Errorf("after the drain took effect: %s, want nothing on %s", show(counts), c.addr())
	}
}

// TestXDSLocalityFailover: a client in r1/z1 sends everything to its
// zone while it has endpoints there, then to its region's other zone,
// then to the other region, as the nearer endpoints go.
func TestXDSLocalityFailover(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	zone, region, other := startBackend(t, "127.0.0.21"), startBackend(t, "127.0.0.22"), startBackend(t, "127.0.0.23")
	register(t, m.r1, zone.endpoint("api", "z1"))
	register(t, m.r1, region.endpoint("api", "z2"))
	register(t, m.r2, other.endpoint("api", "z1")) // r2's zone z1 is not r1's

	// A client in r2 proves r2's endpoint reached r1 (it is that client's
	// zone) before the r1 client's picks are judged.
	far := xdsClient(t, m.xds, "api", "client-r2", "r2", "z1")
	waitSpread(t, far, "the r2 client to use its own zone", 10*time.Second, other)

	// A client that sends no locality is served as the registrar's own
	// (r1/z1).
	anon := xdsClient(t, m.xds, "api", "client-anon", "", "")
	waitSpread(t, anon, "a client without locality in the registrar's zone", 10*time.Second, zone)

	cc := xdsClient(t, m.xds, "api", "client-r1", "r1", "z1")
	waitSpread(t, cc, "traffic in the client's zone", 10*time.Second, zone)
	if counts := spread(cc, 100); !only(counts, zone) {
		t.Fatalf("with an endpoint in the zone: %s, want all on %s", show(counts), zone.addr())
	}

	at := deregister(t, m.r1, zone.endpoint("api", "z1"))
	waitSpread(t, cc, "failover to the region", localBound, region)
	t.Logf("zone gone → traffic in the region: %v (bound %v)", time.Since(at), localBound)
	if counts := spread(cc, 100); !only(counts, region) {
		t.Fatalf("with an endpoint in the region: %s, want all on %s", show(counts), region.addr())
	}

	at = deregister(t, m.r1, region.endpoint("api", "z2"))
	waitSpread(t, cc, "failover to the other region", localBound, other)
	t.Logf("region gone → traffic in the other region: %v (bound %v)", time.Since(at), localBound)

	// And back: an endpoint in the zone again takes all the traffic.
	at = register(t, m.r1, zone.endpoint("api", "z1"))
	waitSpread(t, cc, "traffic back in the zone", localBound, zone)
	t.Logf("zone back → traffic in the zone: %v (bound %v)", time.Since(at), localBound)
}

// TestXDSRemoteRegistration: an endpoint registered on another region's
// registrar reaches the xDS client through etcd within remoteBound.
func TestXDSRemoteRegistration(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	local, remote := startBackend(t, "127.0.0.31"), startBackend(t, "127.0.0.32")
	register(t, m.r1, local.endpoint("db", "z1"))
	cc := xdsClient(t, m.xds, "db", "client-r2", "r2", "z1")
	waitSpread(t, cc, "traffic on r1's endpoint (failover tier for an r2 client)", 10*time.Second, local)
	at := register(t, m.r2, remote.endpoint("db", "z1"))
	waitSpread(t, cc, "traffic on r2's endpoint, the client's own zone", remoteBound, remote)
	t.Logf("register on r2 → traffic through r1's xDS: %v (bound %v)", time.Since(at), remoteBound)
}

// TestXDSClientOverMTLS: grpc-go's xDS client with the bootstrap's "tls"
// channel credentials (a node certificate of the registrar's CA) reaches
// a registrar that runs mTLS, as the README shows.
func TestXDSClientOverMTLS(t *testing.T) {
	t.Parallel()
	m := meshtest.New(t, "example.org")
	etcd := etcdtest.Start(t)
	s := regtest.Start(t, server.Config{
		EtcdEndpoints: etcd.Endpoints(), XDSAddr: "127.0.0.1:0",
		Options:     registrar.Options{ClusterName: "c1", Region: "r1", Zone: "z1"},
		TLSCertFile: m.ServerCert, TLSKeyFile: m.ServerKey, TLSClientCAFile: m.CA, TrustDomain: "example.org",
	})
	a := startBackend(t, "127.0.0.61")
	if _, _, err := s.Registrar().Register(a.endpoint("web", "z1")); err != nil {
		t.Fatal(err)
	}
	node := m.Certs["node-node-a"]
	creds := fmt.Sprintf(`{"type": "tls", "config": {"ca_certificate_file": %q, "certificate_file": %q, "private_key_file": %q}}`, m.CA, node[0], node[1])
	addr := strings.Replace(s.XDSAddr(), "127.0.0.1", "localhost", 1) // the certificate's name
	cc := xdsClientWith(t, addr, creds, "web", "client-tls", "r1", "z1")
	waitSpread(t, cc, "traffic through an xDS client on mTLS", 10*time.Second, a)
}
