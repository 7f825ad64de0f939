package registrar_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/faultproxy"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/internal/testutil/watchcheck"
	"github.com/aethermesh/aether/registry"
	"github.com/aethermesh/aether/server"
)

// The tests here run real registrars under faults and hand every stream's
// recording to watchcheck, which judges it against the registrar's own
// history (an unfiltered reference stream, cross-checked against the
// writers' acknowledgements and the registrar's final listing).

var guaranteeServices = []string{"web", "db", "cache", "auth"}

// ackLog collects the writers' acknowledged writes.
type ackLog = watchcheck.AckLog

// guaranteeWriters churn over guaranteeServices; meta, if set, pads each
// of four metadata values of every registration.
func guaranteeWriters(meta string) watchcheck.Writers {
	return watchcheck.Writers{Region: "r1", Cluster: "c1", Services: guaranteeServices,
		New: func(w int, svc, ip string) *registryv1.ServiceEndpoint {
			e := ep(svc, ip, 80)
			e.Metadata = map[string]string{"w": fmt.Sprint(w)}
			if meta != "" {
				for _, k := range []string{"a", "b", "c", "d"} {
					e.Metadata[k] = meta
				}
			}
			return e
		}}
}

// churn runs one writer for n writes (at most 30 s).
func churn(c registrarv1.RegistrarClient, writer, n int, meta string, acks *ackLog) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return guaranteeWriters(meta).Churn(ctx, c, writer, n, acks)
}

// runWriters runs writers first..first+writers-1 concurrently, n writes
// each, and waits.
func runWriters(t *testing.T, c registrarv1.RegistrarClient, first, writers, n int, meta string, acks *ackLog) {
	t.Helper()
	if err := guaranteeWriters(meta).Run(c, first, writers, n, acks); err != nil {
		t.Fatal(err)
	}
}

// backgroundWriters runs writers first..first+count-1 until the returned
// stop is called: rounds of 20 writes, writer w taking ids w, w+count, ...
// below 100, then starting over at w with the next round's metadata, so
// that a registration of an address still live is an update with an event
// of its own. A round leaves 8 endpoints live, so the endpoints stay below
// --max-endpoints-per-node (1000) however long the writers run. stop waits
// for them and returns the first write that failed.
func backgroundWriters(c registrarv1.RegistrarClient, first, count int, acks *ackLog) (stop func() error) {
	done := make(chan struct{})
	errs := make(chan error, count)
	var wg sync.WaitGroup
	for w := first; w < first+count; w++ {
		wg.Go(func() {
			for round := 0; ; round++ {
				meta := ""
				if round > 0 {
					meta = fmt.Sprint("round-", round)
				}
				for id := w; id < 100; id += count {
					select {
					case <-done:
						return
					default:
					}
					if err := churn(c, id, 20, meta, acks); err != nil {
						errs <- err
						return
					}
				}
			}
		})
	}
	return func() error {
		close(done)
		wg.Wait()
		close(errs)
		return <-errs
	}
}

// guarded opens a recorded stream that the test's cleanup cancels.
func guarded(t *testing.T, c registrarv1.RegistrarClient, name string, req *registrarv1.WatchEndpointsRequest) *watchcheck.Recorder {
	t.Helper()
	r, err := watchcheck.Watch(context.Background(), c, name, req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Cancel)
	return r
}

// reference opens the unfiltered reference stream and waits for its
// snapshot, so that it precedes every write the test makes next.
func reference(t *testing.T, c registrarv1.RegistrarClient) *watchcheck.Recorder {
	t.Helper()
	ref := guarded(t, c, "reference", &registrarv1.WatchEndpointsRequest{NodeName: "reference"})
	if !ref.WaitCovered(0, 10*time.Second) {
		t.Fatal("reference stream got no snapshot")
	}
	return ref
}

// filteredStreams opens the usual mix of streams.
func filteredStreams(t *testing.T, c registrarv1.RegistrarClient, prefix string) []*watchcheck.Recorder {
	return []*watchcheck.Recorder{
		guarded(t, c, prefix+"all", &registrarv1.WatchEndpointsRequest{}),
		guarded(t, c, prefix+"web", &registrarv1.WatchEndpointsRequest{Services: []string{"web"}}),
		guarded(t, c, prefix+"db+cache", &registrarv1.WatchEndpointsRequest{Services: []string{"db", "cache"}}),
		guarded(t, c, prefix+"none", &registrarv1.WatchEndpointsRequest{Services: []string{"nothing-here"}}),
	}
}

// listAllEndpoints is the registrar's whole listing.
func listAllEndpoints(t *testing.T, c registrarv1.RegistrarClient) *registrarv1.ListAllEndpointsResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l, err := c.ListAllEndpoints(ctx, &registrarv1.ListAllEndpointsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// currentHistory waits until the reference and every live stream are
// current with the registrar's listing, and returns the reference's
// history with that listing as Final, and what the reference's own
// recording violated.
func currentHistory(t *testing.T, c registrarv1.RegistrarClient, ref *watchcheck.Recorder, acks []watchcheck.Ack, streams ...*watchcheck.Recorder) (watchcheck.History, []watchcheck.Violation) {
	t.Helper()
	l := listAllEndpoints(t, c)
	_, final, err := watchcheck.ParseVersion(l.Version)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range append([]*watchcheck.Recorder{ref}, streams...) {
		if done, _ := s.Ended(); done && s != ref {
			continue // judged on what it got
		}
		if !s.WaitCovered(final, 10*time.Second) {
			got, _ := s.Covered()
			done, err := s.Ended()
			t.Fatalf("stream %s stuck at %d, want %d (ended %v: %v)", s.Name, got, final, done, err)
		}
	}
	h, vs := watchcheck.HistoryFrom(ref)
	h.Acks, h.Final, h.FinalVersion = acks, l.Endpoints, l.Version
	return h, vs
}

// checkGuarantees waits until the reference and every live stream are current
// with the registrar's listing, then checks them all. acks may be nil (writes
// made on another replica have that replica's versions); batches lists
// endpoint sets written atomically, each after the sequence given.
func checkGuarantees(t *testing.T, c registrarv1.RegistrarClient, ref *watchcheck.Recorder, acks []watchcheck.Ack, batches []batchSpec, streams ...*watchcheck.Recorder) watchcheck.History {
	t.Helper()
	h, vs := currentHistory(t, c, ref, acks, streams...)
	for _, b := range batches {
		r, err := h.BatchOf(b.after, b.eps...)
		if err != nil {
			t.Fatalf("atomic: %v", err)
		}
		h.Batches = append(h.Batches, r)
	}
	vs = append(vs, watchcheck.Check(h, streams...)...)
	if len(vs) > 0 {
		t.Fatalf("%d guarantee violations:\n%s", len(vs), watchcheck.Summary(vs))
	}
	// The checker is not vacuous here: the same history catches a stream
	// missing one of its change events.
	if r := droppedChange(streams); r != nil {
		if len(watchcheck.Check(h, r)) == 0 {
			t.Fatalf("the checker missed a change dropped from %s", r.Name)
		}
	}
	t.Logf("checked %d streams against %d events (sequences %d..%d), %d acks, %d batches",
		len(streams), len(h.Events), h.Base+1, h.Last(), len(acks), len(h.Batches))
	return h
}

// droppedChange copies the first stream with at least three change events
// and drops its second one.
func droppedChange(streams []*watchcheck.Recorder) *watchcheck.Recorder {
	for _, s := range streams {
		var idx []int
		for i, m := range s.Messages() {
			switch m.Type {
			case registrarv1.EndpointEvent_ENDPOINT_ADDED, registrarv1.EndpointEvent_ENDPOINT_UPDATED, registrarv1.EndpointEvent_ENDPOINT_REMOVED:
				idx = append(idx, i)
			}
		}
		if len(idx) >= 3 {
			return s.Without(idx[1])
		}
	}
	return nil
}

// alive fails the test if any of streams has ended.
func alive(t *testing.T, streams ...*watchcheck.Recorder) {
	t.Helper()
	for _, s := range streams {
		if done, err := s.Ended(); done {
			t.Fatalf("stream %s ended: %v", s.Name, err)
		}
	}
}

type batchSpec struct {
	after uint64
	eps   []*registryv1.ServiceEndpoint
}

// foreignTxn writes eps (another cluster's) to etcd in one transaction, which
// the registrar applies as one batch.
func foreignTxn(t *testing.T, cli *clientv3.Client, eps ...*registryv1.ServiceEndpoint) {
	t.Helper()
	var ops []clientv3.Op
	for _, e := range eps {
		k, err := registry.IDOf(e).Key()
		if err != nil {
			t.Fatal(err)
		}
		v, err := registry.EncodeEndpoint(e)
		if err != nil {
			t.Fatal(err)
		}
		ops = append(ops, clientv3.OpPut(k, string(v)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
		t.Fatal(err)
	}
}

func foreignEP(svc, ip string) *registryv1.ServiceEndpoint {
	return &registryv1.ServiceEndpoint{Service: svc, Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: ip,
		Ports: []*registryv1.Port{{Name: "http", Port: 80}}, Region: "r1", Cluster: "c2", State: registryv1.State_STATE_SERVING, Weight: 1}
}

func fastProgress(o *server.Config) { o.ProgressInterval = 50 * time.Millisecond }

func TestGuaranteeSlowConsumerEvictedAndResumed(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	s := startRegistrar(t, etcd.Endpoints(), fastProgress, func(o *server.Config) { o.WatchBuffer = 512 })
	c := dial(t, s.GRPCAddr())
	slowConn := dial(t, s.GRPCAddr(), grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	ref := reference(t, c)
	streams := filteredStreams(t, dial(t, s.GRPCAddr()), "")

	// The slow stream reads its snapshot and then nothing until evicted.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	slowStream, err := slowConn.WatchEndpoints(ctx, &registrarv1.WatchEndpointsRequest{Services: []string{"web", "db", "cache", "auth"}})
	if err != nil {
		t.Fatal(err)
	}
	slow := watchcheck.NewRecorder("slow", &registrarv1.WatchEndpointsRequest{Services: []string{"web", "db", "cache", "auth"}})
	first, err := slowStream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	slow.Record(first)

	var acks ackLog
	runWriters(t, c, 0, 4, 500, strings.Repeat("x", 250), &acks)
	waitFor(t, "eviction of the slow stream", 10*time.Second, func() bool {
		return metricValue(t, s.HTTPAddr(), "registrar_watch_evictions_total") >= 1
	})
	for {
		ev, err := slowStream.Recv()
		if err != nil {
			if status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("slow stream ended with %v, want RESOURCE_EXHAUSTED", err)
			}
			slow.End(err)
			break
		}
		slow.Record(ev)
	}
	resumed := guarded(t, c, "slow-resumed", &registrarv1.WatchEndpointsRequest{Services: slow.Services, LastVersion: slow.LastToken()})
	resumed.ExpectResume = true
	streams = append(streams, slow, resumed)
	checkGuarantees(t, c, ref, acks.All(), nil, streams...)
	alive(t, append(streams[:4:4], resumed)...)
	if n := len(slow.Messages()); n > 1500 {
		t.Fatalf("slow stream got %d messages before eviction; it was not slow", n)
	}
}

func TestGuaranteeClientConnectionCutAndResume(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	s := startRegistrar(t, etcd.Endpoints(), fastProgress)
	c := dial(t, s.GRPCAddr())
	px, err := faultproxy.Start(s.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	viaProxy := dial(t, px.Addr())
	ref := reference(t, c)
	direct := filteredStreams(t, dial(t, s.GRPCAddr()), "direct-")
	cut := filteredStreams(t, viaProxy, "proxied-")
	var acks ackLog

	runWriters(t, c, 0, 3, 100, "", &acks)
	base, _ := ref.Covered()
	batch := []*registryv1.ServiceEndpoint{foreignEP("web", "10.9.0.1"), foreignEP("db", "10.9.0.2"), foreignEP("cache", "10.9.0.3"), foreignEP("web", "10.9.0.4")}
	foreignTxn(t, cli, batch...)
	// A stream opened mid-churn gets a snapshot as of some sequence.
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = churn(c, 3, 100, "", &acks) }()
	late := guarded(t, dial(t, s.GRPCAddr()), "late-web+auth", &registrarv1.WatchEndpointsRequest{Services: []string{"web", "auth"}})
	px.Cut()
	for _, r := range cut {
		r := r
		waitFor(t, "proxied stream "+r.Name+" ends", 10*time.Second, func() bool { done, _ := r.Ended(); return done })
	}
	wg.Wait()
	runWriters(t, c, 4, 2, 100, "", &acks)
	px.Heal()
	var resumed []*watchcheck.Recorder
	for _, r := range cut {
		rr := guarded(t, viaProxy, r.Name+"-resumed", &registrarv1.WatchEndpointsRequest{Services: r.Services, LastVersion: r.LastToken()})
		rr.ExpectResume = true
		resumed = append(resumed, rr)
	}
	runWriters(t, c, 6, 2, 50, "", &acks)

	all := append(append(append(direct, cut...), resumed...), late)
	checkGuarantees(t, c, ref, acks.All(), []batchSpec{{after: base, eps: batch}}, all...)
	alive(t, append(append(direct, resumed...), late)...)
}

func TestGuaranteeCompactionWhileWatchBroken(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	px, err := faultproxy.Start(stripScheme(etcd.Endpoints()[0]))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	s := startRegistrar(t, []string{"http://" + px.Addr()}, fastProgress, func(o *server.Config) {
		o.SyncInterval = time.Hour // only the watch's compaction handling may resync
		o.SyncDebounce = 10 * time.Millisecond
	})
	c := dial(t, s.GRPCAddr())
	ref := reference(t, c)
	streams := filteredStreams(t, dial(t, s.GRPCAddr()), "")
	var acks ackLog
	runWriters(t, c, 0, 2, 60, "", &acks)
	doomed := foreignEP("web", "10.9.1.1")
	foreignTxn(t, cli, doomed, foreignEP("db", "10.9.1.2"))
	waitFor(t, "registrar sees the foreign endpoints", 10*time.Second, func() bool {
		l, err := c.ListAllEndpoints(context.Background(), &registrarv1.ListAllEndpointsRequest{Services: []string{"db"}})
		if err != nil {
			return false
		}
		for _, e := range l.Endpoints {
			if e.Ip == "10.9.1.2" {
				return true
			}
		}
		return false
	})

	px.Cut()
	// Writes keep being acknowledged and streamed while etcd is unreachable.
	runWriters(t, c, 2, 2, 40, "", &acks)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	foreignTxn(t, cli, foreignEP("cache", "10.9.1.3"), foreignEP("auth", "10.9.1.4"))
	dk, _ := registry.IDOf(doomed).Key()
	resp, err := cli.Delete(ctx, dk)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		if _, err := cli.Put(ctx, "/unrelated", "x"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cli.Compact(ctx, resp.Header.Revision+5); err != nil {
		t.Fatal(err)
	}
	px.Heal()
	waitFor(t, "resync after compaction", 20*time.Second, func() bool {
		l, err := c.ListAllEndpoints(ctx, &registrarv1.ListAllEndpointsRequest{Services: []string{"web", "auth"}})
		if err != nil {
			return false
		}
		var gone, there = true, false
		for _, e := range l.Endpoints {
			gone = gone && e.Ip != "10.9.1.1"
			there = there || e.Ip == "10.9.1.4"
		}
		return gone && there
	})
	waitFor(t, "queued writes persisted", 20*time.Second, func() bool { return s.Registrar().PendingWrites() == 0 })
	runWriters(t, c, 4, 2, 30, "", &acks)
	checkGuarantees(t, c, ref, acks.All(), nil, streams...)
	alive(t, streams...)
}

func TestGuaranteeCrossReplica(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	a := startRegistrar(t, etcd.Endpoints(), fastProgress)
	b := startRegistrar(t, etcd.Endpoints(), fastProgress)
	ca, cb := dial(t, a.GRPCAddr()), dial(t, b.GRPCAddr())
	refA, refB := reference(t, ca), reference(t, cb)
	onA := filteredStreams(t, dial(t, a.GRPCAddr()), "A-")
	onB := filteredStreams(t, dial(t, b.GRPCAddr()), "B-")
	var acks ackLog
	runWriters(t, ca, 0, 4, 100, "", &acks)
	baseB, _ := refB.Covered()
	batch := []*registryv1.ServiceEndpoint{foreignEP("web", "10.9.2.1"), foreignEP("auth", "10.9.2.2"), foreignEP("web", "10.9.2.3")}
	foreignTxn(t, cli, batch...)
	runWriters(t, ca, 4, 2, 50, "", &acks)
	lateB := guarded(t, cb, "B-late-web", &registrarv1.WatchEndpointsRequest{Services: []string{"web"}})

	// A's writes reach B through etcd (write-behind, then B's watch): wait
	// for B to list exactly what A lists.
	waitSameListing(t, "B converges on A's state", ca, cb)
	hA := checkGuarantees(t, ca, refA, acks.All(), nil, onA...)
	// B's own sequence is authoritative for B; A's acks carry A's epoch.
	hB := checkGuarantees(t, cb, refB, nil, []batchSpec{{after: baseB, eps: batch}}, append(onB, lateB)...)
	alive(t, append(append(onA, onB...), lateB)...)
	if hA.Epoch == hB.Epoch {
		t.Fatalf("replicas share epoch %s", hA.Epoch)
	}
}

// waitSameListing waits until two registrars list the same endpoints, in
// the same states, with the same writes' "rev" metadata.
func waitSameListing(t *testing.T, what string, a, b registrarv1.RegistrarClient) {
	t.Helper()
	keys := func(c registrarv1.RegistrarClient) map[string]bool {
		l, err := c.ListAllEndpoints(context.Background(), &registrarv1.ListAllEndpointsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]bool{}
		for _, e := range l.Endpoints {
			m[e.Cluster+"/"+e.Service+"/"+e.Ip+"/"+e.State.String()+"/"+e.Metadata["rev"]] = true
		}
		return m
	}
	waitFor(t, what, 20*time.Second, func() bool {
		x, y := keys(a), keys(b)
		if len(x) != len(y) {
			return false
		}
		for k := range x {
			if !y[k] {
				return false
			}
		}
		return true
	})
}
