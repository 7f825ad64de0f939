package registrar_test

import (
	"context"
	"testing"
	"time"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/registry"
	"github.com/aethermesh/aether/server"
)

// Two regions, each with its own etcd and a registrar hosting the
// replicator: each region's endpoints reach the other's watchers through
// the mirror, and removals follow.
func TestTwoRegionsSeeEachOther(t *testing.T) {
	t.Parallel()
	ea, eb := etcdtest.Start(t), etcdtest.Start(t)
	region := func(name, peer string, peerEtcd *etcdtest.Cluster) func(*server.Config) {
		return func(o *server.Config) {
			o.Region = name
			o.PeerEtcd = []string{peer + "=" + peerEtcd.Endpoints()[0]}
			o.ReplicationLeaseTTL = 3 * time.Second
		}
	}
	a := startRegistrar(t, ea.Endpoints(), region("ra", "rb", eb))
	b := startRegistrar(t, eb.Endpoints(), region("rb", "ra", ea))
	ca, cb := dial(t, a.GRPCAddr()), dial(t, b.GRPCAddr())

	wb := watch(t, cb, &registrarv1.WatchEndpointsRequest{Services: []string{"web"}})
	wb.waitSnapshot(t)
	register(t, ca, ep("web", "10.0.0.1", 80))
	register(t, cb, ep("web", "10.0.0.2", 80))
	waitFor(t, "B's watcher sees A's endpoint", 15*time.Second, func() bool { return wb.has("ADDED web 10.0.0.1") })

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	waitFor(t, "A lists B's endpoint", 15*time.Second, func() bool {
		l, err := ca.ListAllEndpoints(ctx, &registrarv1.ListAllEndpointsRequest{Services: []string{"web"}})
		return err == nil && len(l.Endpoints) == 2
	})
	l, _ := cb.ListAllEndpoints(ctx, &registrarv1.ListAllEndpointsRequest{Services: []string{"web"}})
	origins := map[string]string{}
	for _, e := range l.Endpoints {
		origins[e.Ip] = e.Region
	}
	if origins["10.0.0.1"] != "ra" || origins["10.0.0.2"] != "rb" {
		t.Fatalf("B lists origins %v", origins)
	}
	// The mirrored copy in B's etcd is under A's heartbeat lease.
	k, _ := registry.IDOf(l.Endpoints[0]).Key()
	if l.Endpoints[0].Region != "ra" {
		k, _ = registry.IDOf(l.Endpoints[1]).Key()
	}
	got, err := eb.Client(t).Get(ctx, k)
	if err != nil || len(got.Kvs) != 1 || got.Kvs[0].Lease == 0 {
		t.Fatalf("mirrored key %s in B: %v, %v (want it under a lease)", k, got, err)
	}

	st, err := ca.ReplicationStatus(ctx, &registrarv1.ReplicationStatusRequest{})
	if err != nil || !st.Enabled || st.Region != "ra" || len(st.Peers) != 1 {
		t.Fatalf("A's replication status: %v, %v", st, err)
	}
	waitFor(t, "A reports its peer synced", 10*time.Second, func() bool {
		st, err := ca.ReplicationStatus(ctx, &registrarv1.ReplicationStatusRequest{})
		return err == nil && st.Peers[0].Region == "rb" && st.Peers[0].IsLeader && st.Peers[0].Reachable && st.Peers[0].Synced && st.Peers[0].LeaseId != 0
	})

	// B cannot write A's origin, and a removal in A reaches B.
	if _, err := cb.UnregisterEndpoint(ctx, &registrarv1.UnregisterEndpointRequest{Service: "web", Protocol: 1, Ip: "10.0.0.1", Region: "ra"}); err == nil {
		t.Fatal("region B's registrar removed an endpoint of region A")
	}
	unregister(t, ca, "web", "10.0.0.1")
	waitFor(t, "B's watcher sees the removal", 15*time.Second, func() bool { return wb.has("REMOVED web 10.0.0.1") })

	// Without --peer-etcd, status says replication is off.
	solo := startRegistrar(t, ea.Endpoints(), func(o *server.Config) { o.Region = "ra" })
	if st, err := dial(t, solo.GRPCAddr()).ReplicationStatus(ctx, &registrarv1.ReplicationStatusRequest{}); err != nil || st.Enabled {
		t.Fatalf("status without peers: %v, %v", st, err)
	}
}

func TestPeerEtcdFlagErrors(t *testing.T) {
	t.Parallel()
	for _, spec := range []string{"", "rb", "=http://x:2379", "r1=http://x:2379", "a/b=http://x:2379"} {
		_, err := server.Start(context.Background(), server.Config{
			PeerEtcd:      []string{spec},
			GRPCAddr:      "127.0.0.1:0",
			HTTPAddr:      "127.0.0.1:0",
			EtcdEndpoints: []string{"http://127.0.0.1:1"},
			Options: registrar.Options{
				Region: "r1",
				Logger: quietLogger(),
			},
		})
		if err == nil {
			t.Errorf("--peer-etcd %q accepted", spec)
		}
	}
}
