package registrar_test

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/registry"
	"github.com/aethermesh/aether/server"
)

func announce(t testing.TB, c registrarv1.RegistrarClient, name string) *registrarv1.AnnounceNodeResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.AnnounceNode(ctx, &registrarv1.AnnounceNodeRequest{Node: &registryv1.Node{
		Name: name, Zone: "z1", Address: "10.9.0.1", Services: []string{"web"}, Labels: map[string]string{"rack": "r7"},
	}})
	if err != nil {
		t.Fatalf("announce %s: %v", name, err)
	}
	return resp
}

func nodeRecord(t testing.TB, cli *clientv3.Client, name string) *clientv3.GetResponse {
	t.Helper()
	k, _ := registry.NodeID{Region: "r1", Cluster: "c1", Name: name}.Key()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func TestNodeLeaseLapseRemovesNodeAndItsEndpoints(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	ttl := 2 * time.Second
	a := startRegistrar(t, etcd.Endpoints(), func(o *server.Config) { o.NodeTTL = ttl })
	b := startRegistrar(t, etcd.Endpoints(), func(o *server.Config) { o.NodeTTL = ttl })
	ca, cb := dial(t, a.GRPCAddr()), dial(t, b.GRPCAddr())

	resp := announce(t, ca, "n1")
	if resp.Node.LeaseId == 0 || resp.HeartbeatIntervalMs != (ttl/3).Milliseconds() || resp.Node.Region != "r1" {
		t.Fatalf("announce = %v", resp)
	}
	got := nodeRecord(t, cli, "n1")
	if len(got.Kvs) != 1 || got.Kvs[0].Lease != resp.Node.LeaseId {
		t.Fatalf("node record %v not under lease %x", got.Kvs, resp.Node.LeaseId)
	}
	e := ep("web", "10.0.0.1", 80)
	e.Node = "n1"
	register(t, ca, e)
	static := ep("web", "10.0.0.2", 80)
	static.Node = ""
	register(t, ca, static)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	waitFor(t, "B sees both endpoints", 5*time.Second, func() bool {
		l, err := cb.ListAllEndpoints(ctx, &registrarv1.ListAllEndpointsRequest{})
		return err == nil && len(l.Endpoints) == 2
	})
	w := watch(t, cb, &registrarv1.WatchEndpointsRequest{Services: []string{"web"}})
	w.waitSnapshot(t)

	// Heartbeats through B (the other replica) keep the lease alive well
	// past its TTL.
	waitFor(t, "B knows the node", 5*time.Second, func() bool {
		_, err := cb.Heartbeat(ctx, &registrarv1.HeartbeatRequest{Node: "n1"})
		return err == nil
	})
	var lastBeat time.Time
	for end := time.Now().Add(2 * ttl); time.Now().Before(end); time.Sleep(ttl / 4) {
		if _, err := cb.Heartbeat(ctx, &registrarv1.HeartbeatRequest{Node: "n1"}); err != nil {
			t.Fatalf("heartbeat: %v", err)
		}
		lastBeat = time.Now()
	}
	if len(nodeRecord(t, cli, "n1").Kvs) != 1 || w.has("REMOVED web 10.0.0.1") {
		t.Fatal("node or endpoint removed while heartbeats kept coming")
	}
	nodes, err := ca.ListNodes(ctx, &registrarv1.ListNodesRequest{})
	if err != nil || len(nodes.Nodes) != 1 || nodes.Nodes[0].LastHeartbeatAgeSeconds < 0 || nodes.Nodes[0].LastHeartbeatAgeSeconds > ttl.Seconds() || nodes.Nodes[0].Node.Labels["rack"] != "r7" {
		t.Fatalf("list nodes = %v, %v", nodes, err)
	}

	// Heartbeats stop: not gone before the TTL, gone after it, with the
	// node's endpoint (and only that one).
	stopped := lastBeat
	time.Sleep(ttl/2 - time.Since(lastBeat)) // the assertion is about what holds before the TTL runs out
	if len(nodeRecord(t, cli, "n1").Kvs) != 1 || w.has("REMOVED web 10.0.0.1") {
		t.Fatal("node removed before its TTL")
	}
	waitFor(t, "endpoint swept after the lease lapsed", 10*time.Second, func() bool { return w.has("REMOVED web 10.0.0.1") })
	if since := time.Since(stopped); since < ttl {
		t.Fatalf("endpoint removed %v after the last heartbeat, before the %v TTL", since, ttl)
	}
	if len(nodeRecord(t, cli, "n1").Kvs) != 0 {
		t.Fatal("node record still in etcd")
	}
	if w.has("REMOVED web 10.0.0.2") {
		t.Fatal("an endpoint without a node was swept")
	}
	if _, err := cb.Heartbeat(ctx, &registrarv1.HeartbeatRequest{Node: "n1"}); status.Code(err) != codes.NotFound {
		t.Fatalf("heartbeat after lapse: %v, want NOT_FOUND", err)
	}
	waitFor(t, "sweep persisted", 10*time.Second, func() bool { _, v := etcdKey(t, cli, e); return v == nil })
}

func TestSweepNeverTouchesAnotherCluster(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// An endpoint of cluster c2 whose node has no record, written as c2's
	// registrar would, and one of region r2.
	var foreign []string
	for _, origin := range [][2]string{{"r1", "c2"}, {"r2", "c1"}} {
		f := &registryv1.ServiceEndpoint{Service: "web", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: "10.0.5.1",
			Ports: []*registryv1.Port{{Name: "http", Port: 80}}, Region: origin[0], Cluster: origin[1], Node: "gone",
			State: registryv1.State_STATE_SERVING, Weight: 1}
		k, _ := registry.IDOf(f).Key()
		v, _ := registry.EncodeEndpoint(f)
		if _, err := cli.Put(ctx, k, string(v)); err != nil {
			t.Fatal(err)
		}
		foreign = append(foreign, k)
	}
	s := startRegistrar(t, etcd.Endpoints(), func(o *server.Config) { o.NodeTTL = 2 * time.Second })
	c := dial(t, s.GRPCAddr())
	// And one of its own cluster on a node that never announced.
	own := ep("web", "10.0.0.1", 80)
	own.Node = "gone"
	register(t, c, own)
	w := watch(t, c, &registrarv1.WatchEndpointsRequest{})
	w.waitSnapshot(t)
	waitFor(t, "own ghost swept", 15*time.Second, func() bool { return w.has("REMOVED web 10.0.0.1") })
	if n := metricValue(t, s.HTTPAddr(), "registrar_ghost_endpoints_swept_total"); n != 1 {
		t.Fatalf("swept %v endpoints, want 1", n)
	}
	for _, k := range foreign {
		resp, err := cli.Get(ctx, k)
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("another origin's key %s was touched: %v %v", k, resp, err)
		}
	}
	l, _ := c.ListAllEndpoints(ctx, &registrarv1.ListAllEndpointsRequest{})
	if len(l.GetEndpoints()) != 2 {
		t.Fatalf("registrar lists %d endpoints, want the 2 foreign ones", len(l.GetEndpoints()))
	}
}

func TestLeaveAndReannounce(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	s := startRegistrar(t, etcd.Endpoints())
	c := dial(t, s.GRPCAddr())
	first := announce(t, c, "n1")
	again := announce(t, c, "n1")
	if again.Node.LeaseId != first.Node.LeaseId || !again.Node.AnnouncedAt.AsTime().Equal(first.Node.AnnouncedAt.AsTime()) {
		t.Fatalf("re-announce changed the lease: %x -> %x", first.Node.LeaseId, again.Node.LeaseId)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.LeaveNode(ctx, &registrarv1.LeaveNodeRequest{Node: "n1"}); err != nil {
		t.Fatal(err)
	}
	if len(nodeRecord(t, cli, "n1").Kvs) != 0 {
		t.Fatal("node record survives LeaveNode")
	}
	if _, err := c.LeaveNode(ctx, &registrarv1.LeaveNodeRequest{Node: "n1"}); status.Code(err) != codes.NotFound {
		t.Fatalf("second leave: %v", err)
	}
	third := announce(t, c, "n1")
	if third.Node.LeaseId == first.Node.LeaseId {
		t.Fatal("a node that left got its revoked lease back")
	}
	for _, bad := range []*registryv1.Node{{Name: "a/b"}, {Name: "n2", Cluster: "other"}, {Name: "n3", Address: "nope"}} {
		if _, err := c.AnnounceNode(ctx, &registrarv1.AnnounceNodeRequest{Node: bad}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("announce %v: %v, want INVALID_ARGUMENT", bad, err)
		}
	}
}
