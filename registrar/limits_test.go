package registrar_test

import (
	"context"
	"errors"
	"github.com/aethermesh/aether/internal/testutil/meshtest"
	"io"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/server"
)

// settled proves a refused write left no trace: a marker written afterwards
// is persisted, etcd then holds exactly want keys (marker included), and
// none of absent has a key.
func settled(t *testing.T, c registrarv1.RegistrarClient, cli *clientv3.Client, want int64, absent ...*registryv1.ServiceEndpoint) {
	t.Helper()
	marker := ep("marker", "10.9.9.9", 80)
	marker.Node = "" // counts against no node's --max-endpoints-per-node
	register(t, c, marker)
	waitFor(t, "marker persisted", 10*time.Second, func() bool { _, v := etcdKey(t, cli, marker); return v != nil })
	if n := countKeys(t, cli); n != want {
		t.Fatalf("etcd holds %d keys, want %d", n, want)
	}
	for _, e := range absent {
		if k, v := etcdKey(t, cli, e); v != nil {
			t.Fatalf("refused endpoint was written at %s", k)
		}
	}
}

func TestLimitMaxRecvMsgSize(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	s := startRegistrar(t, etcd.Endpoints(), func(o *server.Config) { o.MaxRecvMsgSize = 64 << 10 })
	c := dial(t, s.GRPCAddr())

	big := ep("web", "10.0.0.1", 80)
	big.Metadata = map[string]string{"blob": strings.Repeat("x", 70<<10)}
	_, err := c.RegisterEndpoint(callCtx(t), &registrarv1.RegisterEndpointRequest{Endpoint: big})
	wantCode(t, "oversized register", err, codes.ResourceExhausted, "received message larger than max", "vs. 65536)")

	// The same request within the limit is judged on its content.
	small := ep("web", "10.0.0.1", 80)
	small.Metadata = map[string]string{"blob": strings.Repeat("x", 100)}
	register(t, c, small)
	settled(t, c, cli, 2)
}

func TestLimitMetadata(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	s := startRegistrar(t, etcd.Endpoints(), func(o *server.Config) {
		o.MaxMetadataEntries = 4
		o.MaxMetadataBytes = 200
	})
	c := dial(t, s.GRPCAddr())
	w := watch(t, c, &registrarv1.WatchEndpointsRequest{})
	w.waitSnapshot(t)

	many := ep("web", "10.0.0.1", 80)
	many.Metadata = map[string]string{"a": "1", "b": "2", "c": "3", "d": "4", "e": "5"}
	_, err := c.RegisterEndpoint(callCtx(t), &registrarv1.RegisterEndpointRequest{Endpoint: many})
	wantCode(t, "5 metadata entries", err, codes.InvalidArgument,
		"endpoint.metadata: 5 entries exceed the limit of 4 (--max-metadata-entries)")

	heavy := ep("web", "10.0.0.2", 80)
	heavy.Metadata = map[string]string{"a": strings.Repeat("v", 150), "b": strings.Repeat("v", 60)}
	_, err = c.RegisterEndpoint(callCtx(t), &registrarv1.RegisterEndpointRequest{Endpoint: heavy})
	wantCode(t, "212 metadata bytes", err, codes.InvalidArgument,
		"endpoint.metadata: 212 bytes of keys and values exceed the limit of 200 (--max-metadata-bytes)")

	// Node labels are metadata too.
	_, err = c.AnnounceNode(callCtx(t), &registrarv1.AnnounceNodeRequest{Node: &registryv1.Node{Name: "n1", Labels: many.Metadata}})
	wantCode(t, "5 node labels", err, codes.InvalidArgument, "5 entries exceed the limit of 4 (--max-metadata-entries)")

	// At the limits, both are accepted.
	ok := ep("web", "10.0.0.3", 80)
	ok.Metadata = map[string]string{"a": strings.Repeat("v", 150), "b": strings.Repeat("v", 44), "c": "", "d": ""}
	register(t, c, ok)

	settled(t, c, cli, 2, many, heavy)
	waitFor(t, "watcher sees the marker", 5*time.Second, func() bool { return w.has("ADDED marker 10.9.9.9") })
	if got := strings.Join(w.changes(), ","); got != "ADDED web 10.0.0.3,ADDED marker 10.9.9.9" {
		t.Fatalf("watcher saw %s; refused writes produced events", got)
	}
}

// subscribe opens a Subscribe stream with start and returns it with its
// first message's error (nil when the stream started).
func subscribe(t *testing.T, c registrarv1.RegistrarClient, services ...string) (registrarv1.Registrar_SubscribeClient, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, err := c.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A stream the server refused before reading ends the Send with io.EOF;
	// its status comes from Recv.
	if err := st.Send(&registrarv1.SubscribeRequest{Request: &registrarv1.SubscribeRequest_Start{Start: &registrarv1.WatchEndpointsRequest{Services: services}}}); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	_, err = st.Recv()
	return st, err
}

func TestLimitMaxWatchServices(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	s := startRegistrar(t, etcd.Endpoints(), func(o *server.Config) { o.MaxWatchServices = 3 })
	c := dial(t, s.GRPCAddr())
	register(t, c, ep("d", "10.0.0.4", 80))

	const msg = "services: 4 distinct services exceed the limit of 3 per watch (--max-watch-services)"
	st, err := c.WatchEndpoints(callCtx(t), &registrarv1.WatchEndpointsRequest{Services: []string{"a", "b", "c", "d"}})
	if err == nil {
		_, err = st.Recv()
	}
	wantCode(t, "WatchEndpoints with 4 services", err, codes.InvalidArgument, msg)
	_, err = subscribe(t, c, "a", "b", "c", "d")
	wantCode(t, "Subscribe start with 4 services", err, codes.InvalidArgument, msg)

	// Duplicates count once; 3 distinct services are fine.
	w := watch(t, c, &registrarv1.WatchEndpointsRequest{Services: []string{"a", "b", "a", "c", "c"}})
	w.waitSnapshot(t)

	sub, err := subscribe(t, c, "a", "b", "c")
	if err != nil {
		t.Fatal(err)
	}
	update := func(add, remove []string) {
		t.Helper()
		if err := sub.Send(&registrarv1.SubscribeRequest{Request: &registrarv1.SubscribeRequest_Update{Update: &registrarv1.SubscriptionUpdate{Add: add, Remove: remove}}}); err != nil {
			t.Fatal(err)
		}
	}
	// Swapping a for d keeps 3: allowed, with d's snapshot.
	update([]string{"d"}, []string{"a"})
	ev, err := sub.Recv()
	if err != nil || ev.Type != registrarv1.EndpointEvent_SERVICES_SNAPSHOT || strings.Join(ev.Services, ",") != "d" || len(ev.Endpoints) != 1 {
		t.Fatalf("after swapping a for d: %v, %v", ev, err)
	}
	// Adding a fourth is refused and ends the stream; no snapshot of e is sent.
	update([]string{"e"}, nil)
	for {
		ev, err = sub.Recv()
		if err != nil {
			break
		}
		if ev.Type == registrarv1.EndpointEvent_SERVICES_SNAPSHOT {
			t.Fatalf("refused update still added services: %v", ev)
		}
	}
	wantCode(t, "update to 4 services", err, codes.InvalidArgument,
		"update: the stream would watch 4 services, more than the limit of 3 (--max-watch-services); nothing was changed")
}

func TestLimitMaxStreamsPerIdentityPlaintext(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	s := startRegistrar(t, etcd.Endpoints(), func(o *server.Config) { o.MaxStreamsPerIdentity = 2 })
	c := dial(t, s.GRPCAddr())

	// Streams that end on an error path release their slot: a refused
	// filter, a bad first Subscribe message, a client that cancels.
	for i := 0; i < 3; i++ {
		_, err := subscribe(t, c, "bad/name")
		wantCode(t, "bad filter", err, codes.InvalidArgument, "services")
		ctx, cancel := context.WithCancel(context.Background())
		st, err := c.Subscribe(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_ = st.Send(&registrarv1.SubscribeRequest{})
		_, err = st.Recv()
		wantCode(t, "bad first message", err, codes.InvalidArgument, "the first Subscribe message must set start")
		cancel()
		w := watch(t, c, &registrarv1.WatchEndpointsRequest{})
		w.waitSnapshot(t)
		w.cancel()
	}

	var open []*recorder
	waitFor(t, "two streams open", 10*time.Second, func() bool {
		w := watch(t, c, &registrarv1.WatchEndpointsRequest{})
		waitFor(t, "stream answers", 10*time.Second, func() bool { done, _ := w.ended(); return done || len(w.snapshot()) > 0 })
		if done, _ := w.ended(); !done {
			open = append(open, w)
		}
		return len(open) == 2
	})

	const msg = "address 127.0.0.1 already has 2 open watch streams, the limit (--max-streams-per-identity 2)"
	st, err := c.WatchEndpoints(callCtx(t), &registrarv1.WatchEndpointsRequest{})
	if err == nil {
		_, err = st.Recv()
	}
	wantCode(t, "third WatchEndpoints", err, codes.ResourceExhausted, "WatchEndpoints: "+msg)
	_, err = subscribe(t, c)
	wantCode(t, "third stream as Subscribe", err, codes.ResourceExhausted, "Subscribe: "+msg)

	// Closing one frees its slot.
	open[0].cancel()
	waitFor(t, "a slot frees up", 10*time.Second, func() bool {
		w := watch(t, c, &registrarv1.WatchEndpointsRequest{})
		waitFor(t, "stream answers", 10*time.Second, func() bool { done, _ := w.ended(); return done || len(w.snapshot()) > 0 })
		done, _ := w.ended()
		return !done
	})
}

func TestLimitMaxStreamsPerIdentityMTLS(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	m := meshtest.New(t, "example.org")
	srv, _ := startSecure(t, etcd, m, func(o *server.Config) { o.MaxStreamsPerIdentity = 1 })
	nodeA := tlsClient(t, srv.GRPCAddr(), m.CA, m, "node-node-a")
	op := tlsClient(t, srv.GRPCAddr(), m.CA, m, "operator-alice")

	w := watch(t, nodeA, &registrarv1.WatchEndpointsRequest{})
	w.waitSnapshot(t)
	_, err := subscribe(t, nodeA)
	wantCode(t, "node-a's second stream", err, codes.ResourceExhausted,
		"Subscribe: identity spiffe://example.org/node/node-a already has 1 open watch streams, the limit (--max-streams-per-identity 1)")
	// Another identity from the same address has its own budget.
	if _, err := subscribe(t, op); err != nil {
		t.Fatalf("operator's stream: %v", err)
	}
}

func TestLimitMaxEndpointsPerNode(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	s := startRegistrar(t, etcd.Endpoints(), func(o *server.Config) { o.MaxEndpointsPerNode = 2 })
	c := dial(t, s.GRPCAddr())
	w := watch(t, c, &registrarv1.WatchEndpointsRequest{})
	w.waitSnapshot(t)

	register(t, c, nodeEP("web", "10.0.0.1", "n1"))
	register(t, c, nodeEP("api", "10.0.0.1", "n1"))
	third := nodeEP("db", "10.0.0.1", "n1")
	_, err := c.RegisterEndpoint(callCtx(t), &registrarv1.RegisterEndpointRequest{Endpoint: third})
	wantCode(t, "third endpoint of n1", err, codes.ResourceExhausted,
		`register: node "n1" of region "r1" cluster "c1" already has 2 endpoints, the limit (--max-endpoints-per-node 2)`)

	// Updates of existing endpoints are always allowed; other nodes and
	// node-less endpoints have their own budgets.
	upd := nodeEP("web", "10.0.0.1", "n1")
	upd.Weight = 7
	if resp := register(t, c, upd); resp.Endpoint.Weight != 7 {
		t.Fatalf("update: %v", resp.Endpoint)
	}
	if _, err := c.DrainEndpoint(callCtx(t), &registrarv1.DrainEndpointRequest{Service: "api", Protocol: upd.Protocol, Ip: "10.0.0.1"}); err != nil {
		t.Fatalf("drain: %v", err)
	}
	register(t, c, nodeEP("db", "10.0.0.2", "n2"))
	settled(t, c, cli, 4, third)
	waitFor(t, "watcher sees the marker", 5*time.Second, func() bool { return w.has("ADDED marker 10.9.9.9") })
	if w.has("ADDED db 10.0.0.1") {
		t.Fatalf("watcher saw the refused endpoint: %v", w.changes())
	}

	// Unregistering frees a slot.
	unregister(t, c, "api", "10.0.0.1")
	register(t, c, third)
	waitFor(t, "third endpoint persisted", 10*time.Second, func() bool { _, v := etcdKey(t, cli, third); return v != nil })
}
