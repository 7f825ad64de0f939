package xds

// What the per-resource caches promise on the wire, over real gRPC ADS
// streams (state of the world and delta) against a server fed by a
// scripted subscription: the order of a target's four resources when it
// comes and when it goes, and that a change of one service sends nothing
// to a stream that does not watch it.

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	stream "github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	"github.com/aethermesh/aether/internal/testutil/wait"
	"github.com/aethermesh/aether/internal/testutil/xdstest"
)

// scopeBound bounds one response on loopback (with -race).
const scopeBound = 10 * time.Second

// allTypes are the four types of a target, in the order a proxyless
// client resolves them.
var allTypes = []string{resourcev3.ListenerType, resourcev3.RouteType, resourcev3.ClusterType, resourcev3.EndpointType}

func short(typeURL string) string {
	return strings.TrimPrefix(typeURL, "type.googleapis.com/envoy.config.")
}

// sotwADS is a raw state-of-the-world ADS client: it asks for names of
// each type and ACKs every response it takes.
type sotwADS struct {
	t      *testing.T
	stream discoverygrpc.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	resps  chan *discoverygrpc.DiscoveryResponse
	node   *corev3.Node
	names  map[string][]string
}

func openSotwADS(t *testing.T, addr, node string) *sotwADS {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := &sotwADS{t: t, stream: stream, resps: make(chan *discoverygrpc.DiscoveryResponse, 64),
		node: xdstest.Node(node, xdstest.Locality{Region: "r1", Zone: "z1"}), names: map[string][]string{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(c.resps)
		for {
			r, err := stream.Recv()
			if err != nil {
				return
			}
			c.resps <- r
		}
	}()
	t.Cleanup(func() { cancel(); <-done; cc.Close() })
	return c
}

// ask subscribes typ to names (a first request, no version).
func (c *sotwADS) ask(typ string, names ...string) {
	c.t.Helper()
	c.names[typ] = names
	if err := c.stream.Send(&discoverygrpc.DiscoveryRequest{Node: c.node, TypeUrl: typ, ResourceNames: names}); err != nil {
		c.t.Fatal(err)
	}
}

// next takes the next response and ACKs it.
func (c *sotwADS) next(what string) *discoverygrpc.DiscoveryResponse {
	c.t.Helper()
	select {
	case r, ok := <-c.resps:
		if !ok {
			c.t.Fatalf("%s: the stream ended", what)
		}
		if err := c.stream.Send(&discoverygrpc.DiscoveryRequest{TypeUrl: r.GetTypeUrl(), ResourceNames: c.names[r.GetTypeUrl()],
			VersionInfo: r.GetVersionInfo(), ResponseNonce: r.GetNonce()}); err != nil {
			c.t.Fatal(err)
		}
		return r
	case <-time.After(scopeBound):
		c.t.Fatalf("%s: no response in %v", what, scopeBound)
	}
	return nil
}

// sotwNames is the resource names a state-of-the-world response carries,
// sorted.
func sotwNames(t *testing.T, r *discoverygrpc.DiscoveryResponse) []string {
	t.Helper()
	var out []string
	for _, a := range r.GetResources() {
		m, err := a.UnmarshalNew()
		if err != nil {
			t.Fatal(err)
		}
		switch m := m.(type) {
		case *endpointv3.ClusterLoadAssignment:
			out = append(out, m.GetClusterName())
		case interface{ GetName() string }: // Listener, RouteConfiguration, Cluster
			out = append(out, m.GetName())
		default:
			t.Fatalf("unexpected resource %T", m)
		}
	}
	slices.Sort(out)
	return out
}

// watching waits until every type's cache has an open watch on name
// (each of want of them): the stream's last ACKs have been processed, so
// a change now is answered by the caches in their update order, not by
// an ACK arriving late.
func watching(t *testing.T, f *Feed, name string, want int) {
	t.Helper()
	wait.ForState(t, "the streams' watches open on "+name, scopeBound, func() (bool, string) {
		var got []string
		ok := true
		for _, l := range []*linear{f.lds, f.rds, f.cds, f.eds[own]} {
			n := l.c.NumWatches(name)
			ok = ok && n == want
			got = append(got, l.prefix+":"+strconv.Itoa(n))
		}
		return ok, strings.Join(got, " ")
	})
}

// TestOrderOnTheWire: a client watching a target's four resources before
// the target exists is sent, when it comes, its endpoints first, then
// the Cluster, the route and the Listener (a Cluster is never sent
// before the endpoints that make it usable); when it goes, the Listener
// first, then the route, the Cluster and the endpoints (nothing is
// removed while something sent still names it). State of the world
// sends no removal for a route or endpoints (the protocol has none for
// them: the client drops them with what named them), so there the
// removal is the Listener, then the Cluster; delta names all four.
func TestOrderOnTheWire(t *testing.T) {
	t.Run("sotw", func(t *testing.T) {
		t.Parallel()
		s, addr, sub := serveScripted(t, ep("web", "10.0.0.1", "r1", "z1"))
		c := openSotwADS(t, addr, "order-sotw")
		for _, typ := range allTypes {
			c.ask(typ, "web", "api")
			if got := sotwNames(t, c.next("first "+short(typ))); !slices.Equal(got, []string{"web"}) {
				t.Fatalf("first %s: %q, want web", short(typ), got)
			}
		}
		watching(t, s.feed, "api", 1)
		sub.push(ev(registrarv1.EndpointEvent_ENDPOINT_ADDED, 2, ep("api", "10.0.0.2", "r1", "z1")))
		var order []string
		for range allTypes {
			r := c.next("api's resources")
			order = append(order, short(r.GetTypeUrl())+"="+strings.Join(sotwNames(t, r), ","))
		}
		// LDS and CDS are full state: web comes again with api; RDS and
		// EDS carry what changed alone.
		want := []string{"endpoint.v3.ClusterLoadAssignment=api", "cluster.v3.Cluster=api,web", "route.v3.RouteConfiguration=api", "listener.v3.Listener=api,web"}
		if !slices.Equal(order, want) {
			t.Fatalf("a new target was sent as %q, want %q", order, want)
		}

		watching(t, s.feed, "api", 1)
		sub.push(ev(registrarv1.EndpointEvent_ENDPOINT_REMOVED, 3, ep("api", "10.0.0.2", "r1", "z1")))
		order = nil
		for range 2 {
			r := c.next("api's removal")
			order = append(order, short(r.GetTypeUrl())+"="+strings.Join(sotwNames(t, r), ","))
		}
		if want := []string{"listener.v3.Listener=web", "cluster.v3.Cluster=web"}; !slices.Equal(order, want) {
			t.Fatalf("a target gone was sent as %q, want %q", order, want)
		}
		// Nothing else came for api: the next response is web's change.
		watching(t, s.feed, "web", 1)
		sub.push(ev(registrarv1.EndpointEvent_ENDPOINT_ADDED, 4, ep("web", "10.0.0.3", "r1", "z1")))
		if r := c.next("web's change"); r.GetTypeUrl() != resourcev3.EndpointType || !slices.Equal(sotwNames(t, r), []string{"web"}) {
			t.Fatalf("after the removal, got %s %q, want web's endpoints", short(r.GetTypeUrl()), sotwNames(t, r))
		}
	})
	t.Run("delta", func(t *testing.T) {
		t.Parallel()
		s, addr, sub := serveScripted(t, ep("web", "10.0.0.1", "r1", "z1"))
		d := xdstest.DeltaProbe(t, addr, xdstest.Node("order-delta", xdstest.Locality{Region: "r1", Zone: "z1"}))
		for _, typ := range allTypes {
			d.Subscribe(typ, "web", "api")
			if got := xdstest.Names(d.Next(scopeBound)); !slices.Equal(got, []string{"web"}) {
				t.Fatalf("first %s: %q, want web", short(typ), got)
			}
		}
		watching(t, s.feed, "api", 1)
		sub.push(ev(registrarv1.EndpointEvent_ENDPOINT_ADDED, 2, ep("api", "10.0.0.2", "r1", "z1")))
		var order []string
		for range allTypes {
			r := d.Next(scopeBound)
			order = append(order, short(r.GetTypeUrl())+"+"+strings.Join(xdstest.Names(r), ","))
		}
		want := []string{"endpoint.v3.ClusterLoadAssignment+api", "cluster.v3.Cluster+api", "route.v3.RouteConfiguration+api", "listener.v3.Listener+api"}
		if !slices.Equal(order, want) {
			t.Fatalf("a new target was sent as %q, want %q", order, want)
		}
		watching(t, s.feed, "api", 1)
		sub.push(ev(registrarv1.EndpointEvent_ENDPOINT_REMOVED, 3, ep("api", "10.0.0.2", "r1", "z1")))
		order = nil
		for range allTypes {
			r := d.Next(scopeBound)
			order = append(order, short(r.GetTypeUrl())+"-"+strings.Join(r.GetRemovedResources(), ","))
		}
		want = []string{"listener.v3.Listener-api", "route.v3.RouteConfiguration-api", "cluster.v3.Cluster-api", "endpoint.v3.ClusterLoadAssignment-api"}
		if !slices.Equal(order, want) {
			t.Fatalf("a target gone was sent as %q, want %q", order, want)
		}
	})
}

// TestChangeReachesOnlyItsWatchers: two streams, one watching web's four
// resources, the other api's. Changes of api (an endpoint added, one
// drained) and a new target db reach the api stream as api's endpoints
// alone, and the web stream not at all: each stream's next response is
// then a change of its own service (the marker), so anything sent in
// between would have been taken first. Both protocol variants.
func TestChangeReachesOnlyItsWatchers(t *testing.T) {
	t.Run("sotw", func(t *testing.T) {
		t.Parallel()
		s, addr, sub := serveScripted(t, ep("web", "10.0.0.1", "r1", "z1"), ep("api", "10.0.1.1", "r1", "z1"))
		web, api := openSotwADS(t, addr, "web-client"), openSotwADS(t, addr, "api-client")
		for _, typ := range allTypes {
			web.ask(typ, "web")
			web.next("web's first " + short(typ))
			api.ask(typ, "api")
			api.next("api's first " + short(typ))
		}
		watching(t, s.feed, "web", 1)
		watching(t, s.feed, "api", 1)
		pushes0 := sample(t, s.m.pushes.WithLabelValues("endpoint")).GetCounter().GetValue()
		sub.push(ev(registrarv1.EndpointEvent_ENDPOINT_ADDED, 2, ep("api", "10.0.1.2", "r1", "z1")),
			ev(registrarv1.EndpointEvent_ENDPOINT_ADDED, 3, ep("db", "10.0.2.1", "r1", "z1")))
		r := api.next("api's change")
		if r.GetTypeUrl() != resourcev3.EndpointType || !slices.Equal(sotwNames(t, r), []string{"api"}) {
			t.Fatalf("the api stream got %s %q, want api's endpoints alone", short(r.GetTypeUrl()), sotwNames(t, r))
		}
		watching(t, s.feed, "api", 1)
		sub.push(ev(registrarv1.EndpointEvent_ENDPOINT_UPDATED, 4, draining(ep("api", "10.0.1.1", "r1", "z1"))))
		api.next("api drained")

		// The markers.
		watching(t, s.feed, "web", 1)
		watching(t, s.feed, "api", 1)
		sub.push(ev(registrarv1.EndpointEvent_ENDPOINT_ADDED, 5, ep("web", "10.0.0.2", "r1", "z1")))
		if r := web.next("web's marker"); r.GetTypeUrl() != resourcev3.EndpointType || !slices.Equal(sotwNames(t, r), []string{"web"}) {
			t.Fatalf("the web stream's first response after api and db changed: %s %q, want web's marker", short(r.GetTypeUrl()), sotwNames(t, r))
		}
		sub.push(ev(registrarv1.EndpointEvent_ENDPOINT_ADDED, 6, ep("api", "10.0.1.3", "r1", "z1")))
		if r := api.next("api's marker"); r.GetTypeUrl() != resourcev3.EndpointType || !slices.Equal(sotwNames(t, r), []string{"api"}) {
			t.Fatalf("the api stream's response after web changed: %s %q, want api's marker", short(r.GetTypeUrl()), sotwNames(t, r))
		}
		// Four EDS pushes in all: api's two changes, the two markers.
		if n := sample(t, s.m.pushes.WithLabelValues("endpoint")).GetCounter().GetValue() - pushes0; n != 4 {
			t.Errorf("xds_pushes_total{type=endpoint} moved by %v, want 4", n)
		}
	})
	t.Run("delta", func(t *testing.T) {
		t.Parallel()
		s, addr, sub := serveScripted(t, ep("web", "10.0.0.1", "r1", "z1"), ep("api", "10.0.1.1", "r1", "z1"))
		web := xdstest.DeltaProbe(t, addr, xdstest.Node("web-delta", xdstest.Locality{Region: "r1", Zone: "z1"}))
		api := xdstest.DeltaProbe(t, addr, xdstest.Node("api-delta", xdstest.Locality{Region: "r1", Zone: "z1"}))
		for _, typ := range allTypes {
			web.Subscribe(typ, "web")
			web.Next(scopeBound)
			api.Subscribe(typ, "api")
			api.Next(scopeBound)
		}
		watching(t, s.feed, "web", 1)
		watching(t, s.feed, "api", 1)
		sub.push(ev(registrarv1.EndpointEvent_ENDPOINT_ADDED, 2, ep("api", "10.0.1.2", "r1", "z1")),
			ev(registrarv1.EndpointEvent_ENDPOINT_ADDED, 3, ep("db", "10.0.2.1", "r1", "z1")))
		if r := api.Next(scopeBound); r.GetTypeUrl() != resourcev3.EndpointType || !slices.Equal(xdstest.Names(r), []string{"api"}) {
			t.Fatalf("the api stream got %s %q, want api's endpoints alone", short(r.GetTypeUrl()), xdstest.Names(r))
		}
		watching(t, s.feed, "web", 1)
		watching(t, s.feed, "api", 1)
		sub.push(ev(registrarv1.EndpointEvent_ENDPOINT_ADDED, 4, ep("web", "10.0.0.2", "r1", "z1")))
		if r := web.Next(scopeBound); r.GetTypeUrl() != resourcev3.EndpointType || !slices.Equal(xdstest.Names(r), []string{"web"}) {
			t.Fatalf("the web stream's first response after api and db changed: %s %q, want web's marker", short(r.GetTypeUrl()), xdstest.Names(r))
		}
		sub.push(ev(registrarv1.EndpointEvent_ENDPOINT_ADDED, 5, ep("api", "10.0.1.3", "r1", "z1")))
		if r := api.Next(scopeBound); r.GetTypeUrl() != resourcev3.EndpointType || !slices.Equal(xdstest.Names(r), []string{"api"}) {
			t.Fatalf("the api stream's response after web changed: %s %q, want api's marker", short(r.GetTypeUrl()), xdstest.Names(r))
		}
	})
}

// TestWatchesWaitForTheFirstStart: a stream that asks before the feed
// has loaded is answered only once it has, and then with the target it
// asked for (an early empty Listener answer would tell grpc-go that its
// target does not exist).
func TestWatchesWaitForTheFirstStart(t *testing.T) {
	t.Parallel()
	f, err := NewFeed(FeedConfig{Own: own, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	resp := make(chan cacheResponse, 1)
	cancel, err := f.Cache().CreateWatch(&discoverygrpc.DiscoveryRequest{Node: &corev3.Node{Id: "early"}, TypeUrl: resourcev3.ListenerType,
		ResourceNames: []string{"web"}}, newSotwSub("web"), resp)
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	// A cancelled early watch is never opened.
	cancelled := make(chan cacheResponse, 1)
	c2, _ := f.Cache().CreateWatch(&discoverygrpc.DiscoveryRequest{Node: &corev3.Node{Id: "gone"}, TypeUrl: resourcev3.ListenerType,
		ResourceNames: []string{"web"}}, newSotwSub("web"), cancelled)
	c2()
	select {
	case r := <-resp:
		t.Fatalf("answered before the feed loaded: %v", r)
	default:
	}
	f.Apply([]*registrarv1.EndpointEvent{{Type: registrarv1.EndpointEvent_ENDPOINT_ADDED, Endpoint: ep("web", "10.0.0.1", "r1", "z1")}})
	select {
	case r := <-resp:
		out, err := r.GetDiscoveryResponse()
		if err != nil || len(out.GetResources()) != 1 {
			t.Fatalf("the held watch's answer: %v, %v; want web's Listener", out, err)
		}
	case <-time.After(scopeBound):
		t.Fatal("the held watch was not answered once the feed loaded")
	}
	select {
	case r := <-cancelled:
		t.Fatalf("a watch cancelled before the feed loaded was answered: %v", r)
	default:
	}
}

type cacheResponse = cachev3.Response

func newSotwSub(names ...string) *stream.Subscription {
	s := stream.NewSotwSubscription(names, true)
	return &s
}

// TestEDSWatchesSurviveACKs: over real ADS streams (state of the world,
// then delta) watching three services' endpoints, ten changes each
// answered and ACKed leave the stream's one registration in the EDS
// cache as it was (the same watch, indexed once on each name), where a
// LinearCache unregisters and registers the stream on every name at
// every ACK; once the streams end, their registrations are swept.
func TestEDSWatchesSurviveACKs(t *testing.T) {
	s, addr, sub := serveScripted(t, ep("web", "10.0.0.1", "r1", "z1"), ep("api", "10.0.1.1", "r1", "z1"), ep("db", "10.0.2.1", "r1", "z1"))
	names := []string{"api", "db", "web"}
	seq := uint64(1)
	var eds *edsCache
	// registration is the stream's one watch, once the cache holds one
	// registration of one stream, armed, indexed on each name.
	registration := func(t *testing.T) *edsWatch {
		t.Helper()
		var w *edsWatch
		wait.ForState(t, "one armed watch, indexed on each name", scopeBound, func() (bool, string) {
			s.feed.locMu.RLock()
			eds = s.feed.eds[own].c.(*edsCache)
			s.feed.locMu.RUnlock()
			eds.mu.Lock()
			defer eds.mu.Unlock()
			var idx []string
			ok := len(eds.streams) == 1
			for _, n := range names {
				idx = append(idx, n+":"+strconv.Itoa(len(eds.byName[n])))
				ok = ok && len(eds.byName[n]) == 1
			}
			for _, x := range eds.streams {
				w = x
				ok = ok && x.armed
			}
			return ok, strconv.Itoa(len(eds.streams)) + " registrations, index " + strings.Join(idx, " ")
		})
		return w
	}
	change := func(i int) {
		seq++
		sub.push(ev(registrarv1.EndpointEvent_ENDPOINT_ADDED, seq, ep("api", "10.0.1."+strconv.Itoa(i+2), "r1", "z1")))
	}
	t.Run("sotw", func(t *testing.T) {
		c := openSotwADS(t, addr, "survivor")
		c.ask(resourcev3.EndpointType, names...)
		c.next("the first endpoints")
		w0 := registration(t)
		for i := range 10 {
			change(i)
			if r := c.next("api's change"); !slices.Equal(sotwNames(t, r), []string{"api"}) {
				t.Fatalf("change %d: got %q, want api's endpoints alone", i, sotwNames(t, r))
			}
			if w := registration(t); w != w0 {
				t.Fatalf("change %d: the stream's watch was registered anew after its ACK", i)
			}
		}
	})
	t.Run("delta", func(t *testing.T) {
		c := xdstest.DeltaProbe(t, addr, xdstest.Node("survivor-delta", xdstest.Locality{Region: "r1", Zone: "z1"}))
		c.Subscribe(resourcev3.EndpointType, names...)
		c.Next(scopeBound)
		// The sotw stream's registration is parked (its stream ended),
		// not yet swept: wait for the delta one alone by its kind.
		var w0 *edsWatch
		wait.For(t, "the delta stream's watch", scopeBound, func() bool {
			eds.mu.Lock()
			defer eds.mu.Unlock()
			for _, w := range eds.streams {
				if w.delta && w.armed {
					w0 = w
				}
			}
			return w0 != nil
		})
		for i := range 10 {
			change(10 + i)
			if r := c.Next(scopeBound); !slices.Equal(xdstest.Names(r), []string{"api"}) {
				t.Fatalf("change %d: got %q, want api's endpoints alone", i, xdstest.Names(r))
			}
			wait.For(t, "the delta watch re-armed", scopeBound, func() bool {
				eds.mu.Lock()
				defer eds.mu.Unlock()
				ok := w0.armed && eds.streams[w0.key] == w0
				for _, n := range names {
					_, in := eds.byName[n][w0]
					ok = ok && in
				}
				return ok
			})
		}
	})
	// Both streams ended: parked, then dropped by the sweeps of the
	// changes that follow, on a clock moved past parkedFor.
	eds.mu.Lock()
	clock := time.Now()
	eds.now = func() time.Time { return clock } // read under eds.mu
	eds.mu.Unlock()
	for i := range int(parkedFor/time.Second) + 1 {
		eds.mu.Lock()
		clock = clock.Add(1100 * time.Millisecond)
		tick := eds.tick
		eds.mu.Unlock()
		change(100 + i)
		wait.For(t, "a sweep", scopeBound, func() bool {
			eds.mu.Lock()
			defer eds.mu.Unlock()
			return eds.tick > tick
		})
	}
	eds.mu.Lock()
	defer eds.mu.Unlock()
	if len(eds.streams) != 0 || len(eds.byName) != 0 {
		t.Fatalf("after the streams ended: %d registrations, %d names indexed; want none", len(eds.streams), len(eds.byName))
	}
}
