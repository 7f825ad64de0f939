package xds_test

// End-to-end: a real registrar (server, with --xds-addr) on a real etcd,
// real gRPC backends on loopback addresses, and grpc-go's own xDS client
// (the xds:/// resolver with a per-client bootstrap) doing real RPCs.
//
// The harness is internal/testutil/xdstest: its backends answer with
// their own address, so each RPC names the backend that served it.

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/internal/testutil/meshtest"
	"github.com/aethermesh/aether/internal/testutil/regtest"
	"github.com/aethermesh/aether/internal/testutil/wait"
	"github.com/aethermesh/aether/internal/testutil/xdstest"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/server"
	"github.com/aethermesh/aether/xds/bootstrap"
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

// backends are xdstest backends each on a loopback IP of its own (every
// 127.0.0.0/8 address is loopback on Linux), since the registry keys an
// endpoint by service, protocol and IP: two backends on 127.0.0.1 would be
// one endpoint.
func backends(t *testing.T, ips ...string) []*xdstest.Backend {
	t.Helper()
	return xdstest.StartBackendsAt(t, ips...)
}

// endpoint is b as service svc's gRPC endpoint in zone.
func endpoint(b *xdstest.Backend, svc, zone string) *registryv1.ServiceEndpoint {
	return &registryv1.ServiceEndpoint{
		Service: svc, Protocol: registryv1.Protocol_PROTOCOL_GRPC, Ip: b.Host(),
		Ports: []*registryv1.Port{{Name: "grpc", Port: b.Port()}}, Node: "n1", Zone: zone,
	}
}

// xdsClient is grpc-go's xDS client for target, with a bootstrap of its
// own (the one `aether xds bootstrap` prints): node id and locality as a
// proxyless client would send them.
func xdsClient(t *testing.T, xdsAddr, target, nodeID, region, zone string) *grpc.ClientConn {
	t.Helper()
	return xdstest.Client(t, target, xdstest.Bootstrap(xdsAddr, nodeID, xdstest.Locality{Region: region, Zone: zone}))
}

// waitOnly waits until rounds of picks go to exactly want, within bound,
// and returns how long that took.
func waitOnly(t *testing.T, cc *grpc.ClientConn, what string, bound time.Duration, want ...*xdstest.Backend) time.Duration {
	t.Helper()
	start := time.Now()
	got := xdstest.WaitSpread(t, cc, xdstest.Only(want...), bound)
	d := time.Since(start)
	t.Logf("%s: %v, last round %s", what, d.Round(time.Millisecond), xdstest.Format(got))
	return d
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
	bs := backends(t, "127.0.0.11", "127.0.0.12", "127.0.0.13", "127.0.0.14")
	a, b, c, d := bs[0], bs[1], bs[2], bs[3]
	for _, x := range []*xdstest.Backend{a, b, c} {
		register(t, m.r1, endpoint(x, "web", "z1"))
	}
	cc := xdsClient(t, m.xds, "web", "client-1", "r1", "z1")
	first := waitOnly(t, cc, "traffic on every serving endpoint", 10*time.Second, a, b, c)
	t.Logf("first RPCs on all three endpoints after %v (connect, LDS, RDS, CDS, EDS)", first)

	// Equal weights: each of the three gets a third, ±20%. Each endpoint
	// is a locality of its own (translate.go), and grpc-go's
	// weighted_target picks a locality at random by weight for every RPC,
	// so a backend's count is binomial (n, 1/3), not round robin's exact
	// cycle: over 1200 RPCs its standard deviation is sqrt(1200*2/9) =
	// 16.3, and 400±80 is 4.9 sigma.
	const n, third, tol = 1200, 400, 80
	counts := xdstest.Spread(t, cc, n)
	t.Logf("equal weights: %s over %d RPCs, want %d±%d each", xdstest.Format(counts), n, third, tol)
	for _, x := range []*xdstest.Backend{a, b, c} {
		if k := counts[x.Addr]; k < third-tol || k > third+tol {
			t.Errorf("%s got %d of %d RPCs, want %d±%d: %s", x.Addr, k, n, third, tol, xdstest.Format(counts))
		}
	}

	at := register(t, m.r1, endpoint(d, "web", "z1"))
	waitOnly(t, cc, "the registered endpoint to get traffic", localBound, a, b, c, d)
	t.Logf("register → traffic on the new endpoint: %v (bound %v)", time.Since(at), localBound)

	at = deregister(t, m.r1, endpoint(d, "web", "z1"))
	waitOnly(t, cc, "the deregistered endpoint to get no traffic", localBound, a, b, c)
	t.Logf("deregister → no traffic on it: %v (bound %v)", time.Since(at), localBound)

	drain(t, m.r1, endpoint(c, "web", "z1"))
	at = time.Now()
	waitOnly(t, cc, "the draining endpoint to get no traffic", localBound, a, b)
	t.Logf("drain → no new RPCs on it: %v (bound %v)", time.Since(at), localBound)
	// Spread fails the test on any failed RPC; the backend's own count
	// is checked beside the responses.
	before := c.Served()
	if counts := xdstest.Spread(t, cc, 200); counts[c.Addr] != 0 || c.Served() != before {
		t.Errorf("after the drain took effect: %s (%s served %d), want nothing on %s", xdstest.Format(counts), c.Addr, c.Served()-before, c.Addr)
	}
}

// TestXDSLocalityFailover: a client in r1/z1 sends everything to its
// zone while it has endpoints there, then to its region's other zone,
// then to the other region, as the nearer endpoints go.
func TestXDSLocalityFailover(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	bs := backends(t, "127.0.0.21", "127.0.0.22", "127.0.0.23")
	zone, region, other := bs[0], bs[1], bs[2]
	register(t, m.r1, endpoint(zone, "api", "z1"))
	register(t, m.r1, endpoint(region, "api", "z2"))
	register(t, m.r2, endpoint(other, "api", "z1")) // r2's zone z1 is not r1's

	// A client in r2 proves r2's endpoint reached r1 (it is that client's
	// zone) before the r1 client's picks are judged.
	far := xdsClient(t, m.xds, "api", "client-r2", "r2", "z1")
	waitOnly(t, far, "the r2 client to use its own zone", 10*time.Second, other)

	// A client that sends no locality is served as the registrar's own
	// (r1/z1).
	anon := xdsClient(t, m.xds, "api", "client-anon", "", "")
	waitOnly(t, anon, "a client without locality in the registrar's zone", 10*time.Second, zone)

	cc := xdsClient(t, m.xds, "api", "client-r1", "r1", "z1")
	waitOnly(t, cc, "traffic in the client's zone", 10*time.Second, zone)
	if counts := xdstest.Spread(t, cc, 100); !xdstest.Only(zone)(counts) {
		t.Fatalf("with an endpoint in the zone: %s, want all on %s", xdstest.Format(counts), zone.Addr)
	}

	at := deregister(t, m.r1, endpoint(zone, "api", "z1"))
	waitOnly(t, cc, "failover to the region", localBound, region)
	t.Logf("zone gone → traffic in the region: %v (bound %v)", time.Since(at), localBound)
	if counts := xdstest.Spread(t, cc, 100); !xdstest.Only(region)(counts) {
		t.Fatalf("with an endpoint in the region: %s, want all on %s", xdstest.Format(counts), region.Addr)
	}

	at = deregister(t, m.r1, endpoint(region, "api", "z2"))
	waitOnly(t, cc, "failover to the other region", localBound, other)
	t.Logf("region gone → traffic in the other region: %v (bound %v)", time.Since(at), localBound)

	// And back: an endpoint in the zone again takes all the traffic.
	at = register(t, m.r1, endpoint(zone, "api", "z1"))
	waitOnly(t, cc, "traffic back in the zone", localBound, zone)
	t.Logf("zone back → traffic in the zone: %v (bound %v)", time.Since(at), localBound)
}

// TestXDSRemoteRegistration: an endpoint registered on another region's
// registrar reaches the xDS client through etcd within remoteBound.
func TestXDSRemoteRegistration(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	bs := backends(t, "127.0.0.31", "127.0.0.32")
	local, remote := bs[0], bs[1]
	register(t, m.r1, endpoint(local, "db", "z1"))
	cc := xdsClient(t, m.xds, "db", "client-r2", "r2", "z1")
	waitOnly(t, cc, "traffic on r1's endpoint (failover tier for an r2 client)", 10*time.Second, local)
	at := register(t, m.r2, endpoint(remote, "db", "z1"))
	waitOnly(t, cc, "traffic on r2's endpoint, the client's own zone", remoteBound, remote)
	t.Logf("register on r2 → traffic through r1's xDS: %v (bound %v)", time.Since(at), remoteBound)
}

// TestXDSWeights: two endpoints of one zone registered with weights 3
// and 1 through the registrar split a real client's traffic 3:1. The
// mapping that makes grpc-go honour it is translate.go's (each endpoint a
// sub-zone locality weighted by its weight; ROUND_ROBIN ignores endpoint
// weights). weighted_target picks at random by weight for every RPC, so
// the heavy backend's count over n RPCs is binomial (n, 3/4): over 400
// RPCs mean 300, standard deviation sqrt(400*3/4*1/4) = 8.66, and 300±39
// is 4.5 sigma (a false failure about once in 150,000 runs). An even
// split, the weights ignored (mean 200, sigma 10), passes only 6 sigma
// above its mean.
func TestXDSWeights(t *testing.T) {
	t.Parallel()
	m := startMesh(t)
	bs := backends(t, "127.0.0.81", "127.0.0.82")
	heavy, light := bs[0], bs[1]
	h, l := endpoint(heavy, "pay", "z1"), endpoint(light, "pay", "z1")
	h.Weight, l.Weight = 3, 1
	register(t, m.r1, h)
	register(t, m.r1, l)
	cc := xdsClient(t, m.xds, "pay", "client-weights", "r1", "z1")
	waitOnly(t, cc, "traffic on both weighted endpoints", 10*time.Second, heavy, light)

	const n, p = 400, 0.75
	sigma := math.Sqrt(n * p * (1 - p))
	want, tol := int(n*p), int(math.Ceil(4.5*sigma))
	// One measurement, taken once both endpoints have served: the config
	// does not change during it, so there is no first round to discard.
	got := xdstest.Spread(t, cc, n)
	k := got[heavy.Addr]
	t.Logf("weights 3:1: %s over %d RPCs; heavy %d, want %d±%d (4.5 sigma, sigma %.2f)", xdstest.Format(got), n, k, want, tol, sigma)
	if k < want-tol || k > want+tol || k+got[light.Addr] != n {
		t.Errorf("weights 3:1: %s, want %s %d±%d of %d and the rest on %s", xdstest.Format(got), heavy.Addr, want, tol, n, light.Addr)
	}

	// A weight change re-weighs without re-registering the address: 1:1.
	h.Weight = 1
	at := register(t, m.r1, h)
	wait.ForState(t, "an even split after the weight change", localBound, func() (bool, string) {
		got := xdstest.Spread(t, cc, n)
		k := got[heavy.Addr]
		// Even: mean 200, sigma 10, 200±45; 3:1 is 10 sigma away.
		return k >= 155 && k <= 245, xdstest.Format(got)
	})
	t.Logf("weight 3 → 1: even split after %v (bound %v)", time.Since(at), localBound)
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
	a := backends(t, "127.0.0.61")[0]
	if _, _, err := s.Registrar().Register(endpoint(a, "web", "z1")); err != nil {
		t.Fatal(err)
	}
	node := m.Certs["node-node-a"]
	addr := strings.Replace(s.XDSAddr(), "127.0.0.1", "localhost", 1) // the certificate's name
	bs, err := bootstrap.JSON(bootstrap.Config{Server: addr, Node: "client-tls", Region: "r1", Zone: "z1",
		CAFile: m.CA, CertFile: node[0], KeyFile: node[1]})
	if err != nil {
		t.Fatal(err)
	}
	cc := xdstest.Client(t, "web", bs)
	waitOnly(t, cc, "traffic through an xDS client on mTLS", 10*time.Second, a)
}

// TestXDSSotwADSReferencesResolve is the ordering a state-of-the-world
// ADS client gets, on a raw stream that asks in grpc-go's order (each
// name read from the resource before it: Listener → RouteConfiguration →
// Cluster → ClusterLoadAssignment).
//
// What holds, and why (feed.go): the feed writes a new target's
// resources bottom up (endpoints, Cluster, route, Listener), so each name
// a response carries is answered at once (a Cluster's endpoints are there
// the moment the client asks for them); resources are versioned one by
// one, so an endpoint change pushes the CLA alone and another service's
// arrival pushes nothing to this stream; and a target goes top down, the
// Listener before the Cluster, in that order on the wire (ordered ADS).
// scope_test.go checks the same orders for a client watching all four
// names at once, in both protocol variants.
func TestXDSSotwADSReferencesResolve(t *testing.T) {
	t.Parallel()
	srv := startOne(t, nil)
	c := regtest.Dial(t, srv.GRPCAddr())
	bs := backends(t, "127.0.0.91", "127.0.0.92", "127.0.0.93")
	register(t, c, endpoint(bs[0], "web", "z1"))

	cc := dialXDS(t, srv.XDSAddr())
	defer cc.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	resps := received(t, stream.Recv)
	node := &corev3.Node{Id: "ads-order", Locality: &corev3.Locality{Region: "r1", Zone: "z1"}}
	names := map[string][]string{}
	last := map[string]*discoverygrpc.DiscoveryResponse{}
	// ask subscribes typ to ns, ACKing the last response of typ.
	ask := func(typ string, ns ...string) {
		t.Helper()
		names[typ] = ns
		req := &discoverygrpc.DiscoveryRequest{Node: node, TypeUrl: typ, ResourceNames: ns}
		if r := last[typ]; r != nil {
			req.VersionInfo, req.ResponseNonce = r.GetVersionInfo(), r.GetNonce()
		}
		if err := stream.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	// recv takes the next response, ACKs it, and returns it.
	recv := func(what string) *discoverygrpc.DiscoveryResponse {
		t.Helper()
		r := next(t, resps, what)
		last[r.GetTypeUrl()] = r
		ask(r.GetTypeUrl(), names[r.GetTypeUrl()]...)
		return r
	}
	one := func(r *discoverygrpc.DiscoveryResponse, typ string, m proto.Message) {
		t.Helper()
		if r.GetTypeUrl() != typ || len(r.GetResources()) != 1 {
			t.Fatalf("want one %s, got %s with %d resources", typ, r.GetTypeUrl(), len(r.GetResources()))
		}
		if err := r.GetResources()[0].UnmarshalTo(m); err != nil {
			t.Fatal(err)
		}
	}

	// The chain, each name from the resource before.
	ask(resourcev3.ListenerType, "web")
	// The feed applies the registration asynchronously: until it has, web
	// does not exist (an LDS answer without it), and the next snapshot
	// brings it.
	r := recv("LDS web")
	for len(r.GetResources()) == 0 {
		r = recv("LDS web, once the feed has it")
	}
	var lis listenerv3.Listener
	one(r, resourcev3.ListenerType, &lis)
	var hcm hcmv3.HttpConnectionManager
	if err := lis.GetApiListener().GetApiListener().UnmarshalTo(&hcm); err != nil {
		t.Fatal(err)
	}
	ask(resourcev3.RouteType, hcm.GetRds().GetRouteConfigName())
	var rc routev3.RouteConfiguration
	one(recv("RDS of the listener"), resourcev3.RouteType, &rc)
	ask(resourcev3.ClusterType, rc.GetVirtualHosts()[0].GetRoutes()[0].GetRoute().GetCluster())
	var cl clusterv3.Cluster
	one(recv("CDS of the route"), resourcev3.ClusterType, &cl)
	ask(resourcev3.EndpointType, cl.GetEdsClusterConfig().GetServiceName())
	var cla endpointv3.ClusterLoadAssignment
	one(recv("EDS of the cluster"), resourcev3.EndpointType, &cla)
	if n := len(cla.GetEndpoints()); n != 1 {
		t.Fatalf("web's CLA: %d localities, want 1", n)
	}

	// An endpoint change: the CLA alone is pushed.
	register(t, c, endpoint(bs[1], "web", "z1"))
	one(recv("EDS after a registration"), resourcev3.EndpointType, &cla)
	if n := len(cla.GetEndpoints()); n != 2 {
		t.Fatalf("web's CLA after a registration: %d localities, want 2", n)
	}
	select {
	case r := <-resps:
		t.Fatalf("an endpoint change of a stable target pushed %s too", r.GetTypeUrl())
	case <-time.After(500 * time.Millisecond):
	}

	// Another service: nothing is sent to this stream, which watches web
	// alone (per-resource versions); web's next change is the next
	// response.
	register(t, c, endpoint(bs[2], "api", "z1"))
	deregister(t, c, endpoint(bs[0], "web", "z1"))
	one(recv("EDS after a deregistration, nothing of api before it"), resourcev3.EndpointType, &cla)
	if n := len(cla.GetEndpoints()); n != 1 {
		t.Fatalf("web's CLA after a deregistration: %d localities, want 1", n)
	}

	// web's last endpoint goes: the Listener first, then the Cluster,
	// each answered without web (state of the world has no removal for a
	// route or endpoints: the client drops them with what named them).
	deregister(t, c, endpoint(bs[1], "web", "z1"))
	var order []string
	for range 2 {
		r := recv("the removals of web")
		if len(r.GetResources()) != 0 {
			t.Fatalf("%s still carries %d resources after web's target went", r.GetTypeUrl(), len(r.GetResources()))
		}
		order = append(order, r.GetTypeUrl())
	}
	if want := []string{resourcev3.ListenerType, resourcev3.ClusterType}; strings.Join(order, " ") != strings.Join(want, " ") {
		t.Fatalf("a target gone: removed in the order %v, want %v", order, want)
	}
}
