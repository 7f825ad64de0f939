package replicator_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend/etcd/replicator"
	"github.com/aethermesh/aether/internal/faultproxy"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/internal/testutil/wait"
	"github.com/aethermesh/aether/internal/testutil/watchcheck"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/registry"
	"github.com/aethermesh/aether/server"
)

// Region a's endpoints reach region b through the replicator, under faults
// on the replicator's side: its local watch is cut while a's etcd is
// compacted past where it was (so it must full-sync), and then its leader
// crashes and a standby takes over (a full sync under a new lease). A
// registrar in each region serves the test: a's is the origin (writers go
// through it, acknowledged) and its reference stream is the authoritative
// history; b's sees a's endpoints only through the mirror.
//
// Judged by watchcheck: b's registrar's streams keep every watch guarantee
// against b's own history; b's view of region a (the changes of a's
// endpoints in b's history) moves every endpoint only forward through the
// values a's history gave it (the mirror may skip values, a full sync or a
// coalesced write-behind does, but never goes back, invents or flaps) and
// ends equal to a's state; and b's etcd holds exactly a's subtree, under the
// new leader's lease.
func TestGuaranteePeerViewUnderReplicatorFaults(t *testing.T) {
	ea, eb := etcdtest.Start(t), etcdtest.Start(t)
	ra := startRegion(t, "a", ea)
	rb := startRegion(t, "b", eb)
	ca, cb := dialRegistrar(t, ra.GRPCAddr()), dialRegistrar(t, rb.GRPCAddr())
	refA := recordStream(t, ca, "a-reference", &registrarv1.WatchEndpointsRequest{})
	refB := recordStream(t, cb, "b-reference", &registrarv1.WatchEndpointsRequest{})
	onB := []*watchcheck.Recorder{
		recordStream(t, cb, "b-all", &registrarv1.WatchEndpointsRequest{}),
		recordStream(t, cb, "b-web", &registrarv1.WatchEndpointsRequest{Services: []string{"web"}}),
		recordStream(t, cb, "b-db+cache", &registrarv1.WatchEndpointsRequest{Services: []string{"db", "cache"}}),
	}

	// Two replicas of a's replicator. r1 reaches a's etcd through a proxy,
	// so its local watch can be cut; its session outlives a short cut.
	const leaseTTL, sessionTTL = 12 * time.Second, 3 * time.Second
	px, err := faultproxy.Start(ea.ClientAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = px.Close() })
	cli1 := etcdtest.NewClient(t, px.Addr())
	r1 := runReplicator(t, "a-1", cli1, eb, leaseTTL, sessionTTL)
	waitSynced(t, r1, 15*time.Second)
	r2 := runReplicator(t, "a-2", etcdtest.NewClient(t, ea.Endpoints()...), eb, leaseTTL, sessionTTL)

	var acks watchcheck.AckLog
	writeAll(t, ca, 0, 2, 40, &acks)
	touch(t, ra, ca, 1, &acks)

	// Cut r1's local watch, write, compact a's etcd past r1's position,
	// heal: r1 cannot resume its watch and must full-sync.
	syncs := status(r1).FullSyncs
	px.Cut()
	writeAll(t, ca, 2, 2, 30, &acks)
	touch(t, ra, ca, 2, &acks)
	wait.For(t, "a's writes persisted", 10*time.Second, func() bool { return ra.Registrar().PendingWrites() == 0 })
	cliA := ea.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rev, err := cliA.Get(ctx, "/")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cliA.Compact(ctx, rev.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	px.Heal()
	wait.For(t, "r1 full-syncs after the compaction", 15*time.Second, func() bool {
		s := status(r1)
		return s.IsLeader && s.FullSyncs > syncs && s.Synced
	})
	writeAll(t, ca, 4, 2, 30, &acks)

	// r1 crashes (its local client goes first, so it can neither resign nor
	// revoke its session); a keeps writing while nobody mirrors, until r2
	// takes over.
	crashed := time.Now()
	_ = cli1.Close()
	r1.stop()
	writeAll(t, ca, 6, 2, 40, &acks)
	touch(t, ra, ca, 3, &acks)
	if s := status(r2); s.IsLeader {
		t.Logf("r2 took over before the writes were done: %+v", s)
	}
	waitSynced(t, r2, 15*time.Second)
	t.Logf("r2 took over and synced %v after r1 crashed", time.Since(crashed).Round(time.Millisecond))
	writeAll(t, ca, 8, 2, 30, &acks)
	touch(t, ra, ca, 4, &acks)

	// Converged: b lists exactly a's endpoints, and b's etcd holds a's
	// subtree under r2's lease.
	wait.For(t, "a's writes persisted", 10*time.Second, func() bool { return ra.Registrar().PendingWrites() == 0 })
	la := listAll(t, ca)
	wait.For(t, "b's registrar lists a's endpoints", 15*time.Second, func() bool {
		return sameSet(la.Endpoints, regionOf(listAll(t, cb).Endpoints, "a"))
	})
	lease := status(r2).LeaseID
	if d := mirrorDiff(t, cliA, eb.Client(t), lease); d != "" {
		t.Fatalf("b's mirror of a's subtree: %s", d)
	}
	lb := listAll(t, cb)

	hA := historyUpTo(t, refA, la)
	hA.Acks = acks.All()
	hB := historyUpTo(t, refB, lb, onB...)
	vs := watchcheck.Check(hA)
	vs = append(vs, watchcheck.Check(hB, onB...)...)
	view := watchcheck.View{Name: "b's view of a", Final: regionOf(lb.Endpoints, "a")}
	for _, ev := range hB.Events {
		if ev.Endpoint.Region == "a" {
			view.Changes = append(view.Changes, watchcheck.ViewChange{Type: ev.Type, Endpoint: ev.Endpoint})
		}
	}
	vs = append(vs, watchcheck.CheckView([]watchcheck.History{hA}, view)...)
	if len(vs) > 0 {
		t.Fatalf("%d guarantee violations:\n%s", len(vs), watchcheck.Summary(vs))
	}
	for _, r := range onB {
		if done, err := r.Ended(); done {
			t.Fatalf("stream %s ended: %v", r.Name, err)
		}
	}
	// Not vacuous: a mirror that went back to an older value is caught.
	first := map[registry.EndpointID]*registryv1.ServiceEndpoint{}
	caught := false
	for i, ch := range view.Changes {
		id := registry.IDOf(ch.Endpoint)
		if ch.Type == registrarv1.EndpointEvent_ENDPOINT_ADDED {
			first[id] = ch.Endpoint
		}
		if ch.Type == registrarv1.EndpointEvent_ENDPOINT_UPDATED && first[id] != nil {
			bad := view
			bad.Changes = slices.Insert(slices.Clone(view.Changes), i+1, watchcheck.ViewChange{Type: ch.Type, Endpoint: first[id]})
			caught = len(watchcheck.CheckView([]watchcheck.History{hA}, bad)) > 0
			break
		}
	}
	if !caught {
		t.Fatal("the checker missed a stale value in b's view (or b saw no update)")
	}
	cnt := map[registrarv1.EndpointEvent_EventType]int{}
	for _, ch := range view.Changes {
		cnt[ch.Type]++
	}
	t.Logf("a: %d events, %d acks; b: %d events on %d streams, of a's endpoints %v; r1 full syncs %d, r2 lease %x",
		len(hA.Events), len(hA.Acks), len(hB.Events), len(onB), cnt, status(r1).FullSyncs, int64(lease))
}

func startRegion(t *testing.T, region string, e *etcdtest.Cluster) *server.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := server.Start(ctx, server.Config{
		EtcdEndpoints: e.Endpoints(),
		GRPCAddr:      "127.0.0.1:0",
		HTTPAddr:      "127.0.0.1:0",
		Options: registrar.Options{
			ClusterName:      "c1",
			Region:           region,
			ProgressInterval: 50 * time.Millisecond,
			Logger:           slog.New(slog.NewTextHandler(io.Discard, nil)),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	})
	return s
}

func dialRegistrar(t *testing.T, addr string) registrarv1.RegistrarClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return registrarv1.NewRegistrarClient(cc)
}

func recordStream(t *testing.T, c registrarv1.RegistrarClient, name string, req *registrarv1.WatchEndpointsRequest) *watchcheck.Recorder {
	t.Helper()
	r, err := watchcheck.Watch(context.Background(), c, name, req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Cancel)
	if !r.WaitCovered(0, 10*time.Second) {
		t.Fatalf("%s got no snapshot", name)
	}
	return r
}

// replica is one replicator running in the background.
type replica struct {
	r      *replicator.Replicator
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

func (h *replica) stop() {
	h.once.Do(func() { h.cancel(); <-h.done })
}

func runReplicator(t *testing.T, identity string, local *clientv3.Client, peer *etcdtest.Cluster, leaseTTL, sessionTTL time.Duration) *replica {
	t.Helper()
	r, err := replicator.New(replicator.Config{
		Region:     "a",
		Local:      local,
		Peers:      []replicator.Peer{{Region: "b", Endpoints: peer.Endpoints()}},
		LeaseTTL:   leaseTTL,
		SessionTTL: sessionTTL,
		Identity:   identity,
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &replica{r: r, cancel: cancel, done: make(chan struct{})}
	go func() { defer close(h.done); _ = r.Run(ctx) }()
	t.Cleanup(h.stop)
	return h
}

func status(h *replica) replicator.PeerStatus { return h.r.Status()[0] }

func waitSynced(t *testing.T, h *replica, d time.Duration) {
	t.Helper()
	wait.For(t, "the replicator leads and is synced with b", d, func() bool {
		s := status(h)
		return s.IsLeader && s.Synced && s.LeaseID != 0
	})
}

func listAll(t *testing.T, c registrarv1.RegistrarClient) *registrarv1.ListAllEndpointsResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l, err := c.ListAllEndpoints(ctx, &registrarv1.ListAllEndpointsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func regionOf(eps []*registryv1.ServiceEndpoint, region string) []*registryv1.ServiceEndpoint {
	return slices.DeleteFunc(slices.Clone(eps), func(e *registryv1.ServiceEndpoint) bool { return e.Region != region })
}

func sameSet(a, b []*registryv1.ServiceEndpoint) bool {
	if len(a) != len(b) {
		return false
	}
	m := map[registry.EndpointID]*registryv1.ServiceEndpoint{}
	for _, e := range a {
		m[registry.IDOf(e)] = e
	}
	for _, e := range b {
		if o, ok := m[registry.IDOf(e)]; !ok || !proto.Equal(o, e) {
			return false
		}
	}
	return true
}

// historyUpTo waits until ref and streams are current with the listing l
// and returns ref's history with l as its final state.
func historyUpTo(t *testing.T, ref *watchcheck.Recorder, l *registrarv1.ListAllEndpointsResponse, streams ...*watchcheck.Recorder) watchcheck.History {
	t.Helper()
	_, seq, err := watchcheck.ParseVersion(l.Version)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range append([]*watchcheck.Recorder{ref}, streams...) {
		if !r.WaitCovered(seq, 10*time.Second) {
			got, _ := r.Covered()
			t.Fatalf("stream %s stuck at %d, want %d", r.Name, got, seq)
		}
	}
	h, vs := watchcheck.HistoryFrom(ref)
	if len(vs) > 0 {
		t.Fatal(watchcheck.Summary(vs))
	}
	h.Final, h.FinalVersion = l.Endpoints, l.Version
	return h
}

// mirrorDiff compares a's subtree in both etcds, keys and values, and
// checks that every mirrored key is under lease.
func mirrorDiff(t *testing.T, origin, peer *clientv3.Client, lease clientv3.LeaseID) string {
	t.Helper()
	get := func(cli *clientv3.Client) map[string]*mvccKV {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := cli.Get(ctx, registry.RegionPrefix("a"), clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]*mvccKV{}
		for _, kv := range resp.Kvs {
			m[string(kv.Key)] = &mvccKV{value: string(kv.Value), lease: clientv3.LeaseID(kv.Lease)}
		}
		return m
	}
	want, got := get(origin), get(peer)
	for k, w := range want {
		g, ok := got[k]
		switch {
		case !ok:
			return "missing " + k
		case g.value != w.value:
			return "different value at " + k
		case g.lease != lease:
			return fmt.Sprintf("%s under lease %x, want %x", k, int64(g.lease), int64(lease))
		}
	}
	if len(got) != len(want) {
		return fmt.Sprintf("%d keys in b, %d in a", len(got), len(want))
	}
	return ""
}

type mvccKV struct {
	value string
	lease clientv3.LeaseID
}

// writeAll runs writers first..first+writers-1 concurrently through region
// a's registrar, each registering, updating and unregistering n endpoints
// of its own, and waits.
func writeAll(t *testing.T, c registrarv1.RegistrarClient, first, writers, n int, acks *watchcheck.AckLog) {
	t.Helper()
	ws := watchcheck.Writers{Region: "a", Cluster: "c1", Services: []string{"web", "db", "cache", "auth"},
		New: func(_ int, svc, ip string) *registryv1.ServiceEndpoint {
			return &registryv1.ServiceEndpoint{Service: svc, Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: ip,
				Ports: []*registryv1.Port{{Name: "http", Port: 80}}, Zone: "z1"}
		}}
	if err := ws.Run(c, first, writers, n, acks); err != nil {
		t.Fatal(err)
	}
}

// touch waits until a's registrar persisted its writes, then updates every
// persisted endpoint of web and db (generation gen), so that b sees updates
// too: a quick update of a new endpoint is folded into its registration
// before it is persisted.
func touch(t *testing.T, s *server.Server, c registrarv1.RegistrarClient, gen int, acks *watchcheck.AckLog) {
	t.Helper()
	wait.For(t, "a's writes persisted", 10*time.Second, func() bool { return s.Registrar().PendingWrites() == 0 })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, e := range regionOf(listAll(t, c).Endpoints, "a") {
		if e.Service != "web" && e.Service != "db" {
			continue
		}
		e = proto.Clone(e).(*registryv1.ServiceEndpoint)
		e.Metadata = map[string]string{"gen": fmt.Sprint(gen)}
		resp, err := c.RegisterEndpoint(ctx, &registrarv1.RegisterEndpointRequest{Endpoint: e})
		if err != nil {
			t.Fatal(err)
		}
		acks.Add(watchcheck.OpRegister, resp.Endpoint, resp.Version)
	}
}
