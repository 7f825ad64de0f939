package registrar_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/aethermesh/aether/internal/faultproxy"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/internal/testutil/regtest"
	"github.com/aethermesh/aether/internal/testutil/watchcheck"
	"github.com/aethermesh/aether/server"
)

// Peer-watch on real etcd with real registrars. The write-behind batch
// interval is long (peerBatch), so a write on A reaches the backend, and
// B's backend watch, only after it: B's watcher seeing it well within
// peerBound shows that peer-watch delivered it.
const (
	peerBatch = 2 * time.Second
	// peerBound is the stated bound for a write on A to reach a watcher
	// on B through peer-watch: a quarter of the batch interval (measured
	// figures are logged; on an idle machine they are a few ms).
	peerBound = peerBatch / 4
)

func peerWatchOn(o *server.Config) {
	o.PeerWatch = true
	o.WriteBatchInterval = peerBatch
	o.PeerDiscoveryInterval = 100 * time.Millisecond
	o.PeerMemberTTL = 2 * time.Second
	o.SyncInterval = 500 * time.Millisecond
	o.ProgressInterval = 50 * time.Millisecond
	o.Logger = quietLogger()
}

// added reports when a recorder first saw ip ADDED (ok false: not yet).
func added(r *watchcheck.Recorder, ip string) (n int) {
	for _, m := range r.Messages() {
		if m.Type == registrarv1.EndpointEvent_ENDPOINT_ADDED && m.GetEndpoint().GetService() == "web" && m.GetEndpoint().GetIp() == ip {
			n++
		}
	}
	return n
}

func removed(r *watchcheck.Recorder, ip string) bool {
	for _, m := range r.Messages() {
		if m.Type == registrarv1.EndpointEvent_ENDPOINT_REMOVED && m.GetEndpoint().GetService() == "web" && m.GetEndpoint().GetIp() == ip {
			return true
		}
	}
	return false
}

// connected waits until s receives peer-watch streams from n peers.
func connected(t *testing.T, s *server.Server, n int) {
	t.Helper()
	waitFor(t, "peer-watch streams connected", 15*time.Second, func() bool {
		return peerMetric(t, s, "registrar_peer_streams_connected") == float64(n)
	})
}

// peerMetric reads one of s's unlabelled peer-watch metrics from its
// registry (the HTTP port may be TLS).
func peerMetric(t *testing.T, s *server.Server, name string) float64 {
	t.Helper()
	mfs, err := s.Registrar().MetricsRegistry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name || len(mf.GetMetric()) != 1 {
			continue
		}
		m := mf.GetMetric()[0]
		if g := m.GetGauge(); g != nil {
			return g.GetValue()
		}
		return m.GetCounter().GetValue()
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// deliveredWithin registers ip on a and returns how long b's recorder took
// to see it, failing past bound. A's flusher flushes on the leading edge
// (the first write after a quiet interval goes out at once), so a priming
// write goes first: the write under test then waits for A's next flush, a
// batch interval later, and the backend (cli) is checked not to hold it
// yet when B has it: peer-watch delivered it, not the backend's watch.
// (Where A cannot reach the backend, the priming write stays queued and
// the write under test with it.)
func deliveredWithin(t *testing.T, a *server.Server, ca registrarv1.RegistrarClient, rb *watchcheck.Recorder, ip string, bound time.Duration, cli *clientv3.Client) time.Duration {
	t.Helper()
	return deliveredBefore(t, a, ca, rb, ip, bound, func(e *registryv1.ServiceEndpoint) (string, bool) {
		k, v := etcdKey(t, cli, e)
		return k, v != nil
	})
}

// deliveredBefore is deliveredWithin on any backend: held reports whether
// the backend holds e yet (and where).
func deliveredBefore(t *testing.T, a *server.Server, ca registrarv1.RegistrarClient, rb *watchcheck.Recorder, ip string, bound time.Duration, held func(*registryv1.ServiceEndpoint) (string, bool)) time.Duration {
	t.Helper()
	register(t, ca, ep("prime", ip, 80))
	primeFlushed(a)
	start := time.Now()
	e := ep("web", ip, 80)
	register(t, ca, e)
	waitFor(t, "B's watcher sees "+ip+" written on A", 10*time.Second, func() bool { return added(rb, ip) > 0 })
	took := time.Since(start)
	if k, ok := held(e); ok {
		t.Fatalf("%s was in the backend (%s) when B saw it: the backend, not peer-watch, may have delivered it", ip, k)
	}
	if took > bound {
		t.Fatalf("B saw A's write of %s after %v, want within %v (batch interval %v)", ip, took, bound, a.Registrar().Options().WriteBatchInterval)
	}
	return took
}

// primeFlushed waits for A's leading-edge flush of the priming write to
// land (so the next write waits a batch interval); false if A's queue does
// not empty within a second, as when A is cut off from the backend, where
// no flush can deliver anything anyway.
func primeFlushed(a *server.Server) bool {
	deadline := time.Now().Add(time.Second)
	for a.Registrar().PendingWrites() > 0 {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond) // polling a condition with a deadline
	}
	return true
}

func TestPeerWatchDeliversBeforeTheFlushAndTheEchoChangesNothing(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	a := startRegistrar(t, etcd.Endpoints(), peerWatchOn)
	b := startRegistrar(t, etcd.Endpoints(), peerWatchOn)
	connected(t, a, 1)
	connected(t, b, 1)
	ca, cb := dial(t, a.GRPCAddr()), dial(t, b.GRPCAddr())
	ref := reference(t, cb)
	streams := filteredStreams(t, cb, "b-")

	var worst time.Duration
	for _, ip := range []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"} {
		worst = max(worst, deliveredWithin(t, a, ca, ref, ip, peerBound, etcd.Client(t)))
	}
	t.Logf("A's writes reached B's watcher within %v (bound %v, batch interval %v)", worst, peerBound, peerBatch)

	// The backend's report of the same writes (after A's flush) changes
	// nothing: recognised as echoes, no second event.
	waitFor(t, "A's writes persisted and echoed to B", 15*time.Second, func() bool {
		return a.Registrar().PendingWrites() == 0 && peerMetric(t, b, "registrar_peer_echoes_total") >= 3
	})
	for _, ip := range []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"} {
		if n := added(ref, ip); n != 1 {
			t.Fatalf("B's reference saw %s ADDED %d times, want once", ip, n)
		}
	}
	if got := peerMetric(t, b, "registrar_peer_events_applied_total"); got < 3 {
		t.Fatalf("B applied %v peer events, want at least 3", got)
	}

	// Churn on A (updates and removals too): B's streams keep every
	// guarantee against B's own history, the backend's echoes included.
	var acks ackLog
	runWriters(t, ca, 0, 3, 40, "", &acks)
	waitFor(t, "A's churn persisted", 20*time.Second, func() bool { return a.Registrar().PendingWrites() == 0 })
	waitFor(t, "B lists what A lists", 20*time.Second, func() bool { return sameListing(t, ca, cb) })
	checkGuarantees(t, cb, ref, nil, nil, streams...)
}

// sameListing reports whether two registrars list the same endpoints
// (identity and attributes).
func sameListing(t *testing.T, x, y registrarv1.RegistrarClient) bool {
	lx, ly := listAllEndpoints(t, x), listAllEndpoints(t, y)
	if len(lx.Endpoints) != len(ly.Endpoints) {
		return false
	}
	seen := map[string]string{}
	for _, e := range lx.Endpoints {
		seen[e.Service+" "+e.Ip] = e.String()
	}
	for _, e := range ly.Endpoints {
		if seen[e.Service+" "+e.Ip] != e.String() {
			return false
		}
	}
	return true
}

// A peer-watch stream cut (A's gRPC address partitioned from B), with
// writes made on A meanwhile, converges through the backend; when the cut
// heals, B reconnects and peer-watch delivers again. B's streams keep
// every guarantee throughout.
func TestPeerWatchStreamCutConvergesThroughTheBackend(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	// A advertises a proxy in front of its gRPC port, so the test can cut
	// B's stream to A while clients still reach A directly.
	addr := regtest.FreeAddr(t)
	px, err := faultproxy.Start(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	a := startAt(t, addr, peerWatchOn, func(o *server.Config) {
		o.EtcdEndpoints = etcd.Endpoints()
		o.PeerAdvertiseAddr = px.Addr()
	})
	b := startRegistrar(t, etcd.Endpoints(), peerWatchOn)
	connected(t, b, 1)
	ca, cb := dial(t, a.GRPCAddr()), dial(t, b.GRPCAddr())
	ref := reference(t, cb)
	streams := filteredStreams(t, cb, "b-")
	deliveredWithin(t, a, ca, ref, "10.0.1.1", peerBound, etcd.Client(t))

	px.Cut()
	connected(t, b, 0)
	var acks ackLog
	runWriters(t, ca, 0, 2, 30, "", &acks)
	register(t, ca, ep("web", "10.0.1.2", 80))
	unregister(t, ca, "web", "10.0.1.1")
	waitFor(t, "B converges through the backend while the stream is cut", 20*time.Second, func() bool { return sameListing(t, ca, cb) })
	// The listing is B's snapshot; its streams deliver a moment later.
	waitFor(t, "B's reference gets the writes made during the cut", 10*time.Second, func() bool {
		return removed(ref, "10.0.1.1") && added(ref, "10.0.1.2") == 1
	})

	px.Heal()
	connected(t, b, 1)
	deliveredWithin(t, a, ca, ref, "10.0.1.3", peerBound, etcd.Client(t))
	waitFor(t, "B lists what A lists", 20*time.Second, func() bool { return sameListing(t, ca, cb) })
	checkGuarantees(t, cb, ref, nil, nil, streams...)
}

// A replica restarted (A: a new incarnation, a new member record) and a
// replica that restarts after missing peer events (B) both converge: B
// drops the old A's stream and connects the new one's; the new B loads
// everything from the backend.
func TestPeerWatchReplicaRestartsConverge(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	a := startRegistrar(t, etcd.Endpoints(), peerWatchOn)
	b := startRegistrar(t, etcd.Endpoints(), peerWatchOn)
	connected(t, b, 1)
	ca, cb := dial(t, a.GRPCAddr()), dial(t, b.GRPCAddr())
	ref := reference(t, cb)
	streams := filteredStreams(t, cb, "b-")
	deliveredWithin(t, a, ca, ref, "10.0.2.1", peerBound, etcd.Client(t))

	addr := a.GRPCAddr()
	closeServer(t, a)
	a = startAt(t, addr, peerWatchOn, func(o *server.Config) { o.EtcdEndpoints = etcd.Endpoints() })
	connected(t, b, 1)
	ca = dial(t, a.GRPCAddr())
	deliveredWithin(t, a, ca, ref, "10.0.2.2", peerBound, etcd.Client(t))
	var acks ackLog
	runWriters(t, ca, 0, 2, 30, "", &acks)
	waitFor(t, "B lists what the new A lists", 20*time.Second, func() bool { return sameListing(t, ca, cb) })
	checkGuarantees(t, cb, ref, nil, nil, streams...)

	// B restarts while A writes: the new B has missed the peer events of
	// the gap and catches up from the backend.
	closeServer(t, b)
	register(t, ca, ep("web", "10.0.2.3", 80))
	unregister(t, ca, "web", "10.0.2.1")
	b = startRegistrar(t, etcd.Endpoints(), peerWatchOn)
	cb = dial(t, b.GRPCAddr())
	connected(t, b, 1)
	ref2 := reference(t, cb)
	deliveredWithin(t, a, ca, ref2, "10.0.2.4", peerBound, etcd.Client(t))
	waitFor(t, "the restarted B lists what A lists", 20*time.Second, func() bool { return sameListing(t, ca, cb) })
	checkGuarantees(t, cb, ref2, nil, nil)
}

// A peer write that never reaches the backend (A cut off from etcd, then
// stopped before any flush could land) is shown by B at once and removed
// by B's backstop once the grace for its flush has passed; the backend
// never held it.
func TestPeerWatchUnconfirmedWriteRemovedByTheBackstop(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	epx, err := faultproxy.Start(stripScheme(etcd.Endpoints()[0]))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { epx.Close() })
	a := startRegistrar(t, []string{"http://" + epx.Addr()}, peerWatchOn)
	b := startRegistrar(t, etcd.Endpoints(), peerWatchOn)
	connected(t, b, 1)
	ca, cb := dial(t, a.GRPCAddr()), dial(t, b.GRPCAddr())
	ref := reference(t, cb)
	streams := filteredStreams(t, cb, "b-")

	epx.Cut() // A can no longer flush
	applied := time.Now()
	deliveredWithin(t, a, ca, ref, "10.0.3.1", peerBound, etcd.Client(t))
	// A dies with the write unpersisted (its last flush cannot land).
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_ = a.Close(ctx)
	cancel()
	if k, v := etcdKey(t, etcd.Client(t), ep("web", "10.0.3.1", 80)); v != nil {
		t.Fatalf("the write reached etcd (%s) though A was cut off", k)
	}
	waitFor(t, "B's backstop removes the unconfirmed peer write", 30*time.Second, func() bool { return removed(ref, "10.0.3.1") })
	// Not before the grace (3 batch intervals and 2 s): a peer write whose
	// flush is merely slow is not removed.
	if took := time.Since(applied); took < 3*peerBatch {
		t.Fatalf("B removed the unconfirmed write after %v, before its grace", took)
	}
	if len(listAllEndpoints(t, cb).Endpoints) != 0 {
		t.Fatal("B still lists the unconfirmed write")
	}
	checkGuarantees(t, cb, ref, nil, nil, streams...)
}

// The control: with peer-watch off (the default) the same write reaches
// B only through A's flush and the backend's watch, after about the batch
// interval, so the bound above is peer-watch's doing. Off, the
// RegistrarPeers service is not served at all.
func TestPeerWatchOffWaitsForTheFlush(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	off := func(o *server.Config) {
		peerWatchOn(o)
		o.PeerWatch = false
	}
	a := startRegistrar(t, etcd.Endpoints(), off)
	b := startRegistrar(t, etcd.Endpoints(), off)
	ca, cb := dial(t, a.GRPCAddr()), dial(t, b.GRPCAddr())
	ref := reference(t, cb)
	register(t, ca, ep("prime", "10.0.5.1", 80)) // spends the leading-edge flush (see deliveredWithin)
	start := time.Now()
	register(t, ca, ep("web", "10.0.5.1", 80))
	waitFor(t, "B sees A's write through the backend", 15*time.Second, func() bool { return added(ref, "10.0.5.1") > 0 })
	if took := time.Since(start); took < peerBound {
		t.Fatalf("without peer-watch B saw A's write after %v, within peer-watch's bound %v: the bound proves nothing", took, peerBound)
	} else {
		t.Logf("without peer-watch: %v (batch interval %v)", took, peerBatch)
	}
	cc, err := grpc.NewClient(a.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	stream, err := registrarv1.NewRegistrarPeersClient(cc).PeerWatch(context.Background(), &registrarv1.PeerWatchRequest{})
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("PeerWatch with peer-watch off: %v, want UNIMPLEMENTED", err)
	}
}
