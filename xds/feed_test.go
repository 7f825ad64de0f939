package xds

import (
	"context"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	listenerservice "github.com/envoyproxy/go-control-plane/envoy/service/listener/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/retry"
	"github.com/aethermesh/aether/internal/testutil/wait"
	"github.com/aethermesh/aether/registrar/replica"
	"github.com/aethermesh/aether/registry"
)

// The feed's own rules (resume after a cut, chunked snapshots, lazy
// localities and their bound, versions) against a scripted replica: a
// subscription is package replica's real Subscription over a Source whose
// batches and cut the test decides. The xDS path end to end, with a real
// registrar and a real client, is e2e_test.go's.

type scriptSource struct {
	mu    sync.Mutex
	froms []string
	subs  chan *scriptSub
	next  []replica.Start
}

func newScript(starts ...replica.Start) *scriptSource {
	return &scriptSource{subs: make(chan *scriptSub, len(starts)), next: starts}
}

func (s *scriptSource) Subscribe(services []string, from string) (*replica.Subscription, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(services) != 0 {
		panic("the feed subscribes to all services")
	}
	if len(s.next) == 0 {
		return nil, replica.ErrShuttingDown
	}
	s.froms = append(s.froms, from)
	st := s.next[0]
	s.next = s.next[1:]
	sub := &scriptSub{ready: make(chan struct{}, 1), cut: make(chan struct{})}
	s.subs <- sub
	return replica.NewSubscription(st, sub), nil
}

func (s *scriptSource) from() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.froms)
}

type scriptSub struct {
	mu      sync.Mutex
	batches [][]*registrarv1.EndpointEvent
	ready   chan struct{}
	cut     chan struct{}
	reason  error
	once    sync.Once
}

func (s *scriptSub) push(b ...*registrarv1.EndpointEvent) {
	s.mu.Lock()
	s.batches = append(s.batches, b)
	s.mu.Unlock()
	select {
	case s.ready <- struct{}{}:
	default:
	}
}

func (s *scriptSub) Ready() <-chan struct{} { return s.ready }
func (s *scriptSub) Take() ([]*registrarv1.EndpointEvent, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.batches) == 0 {
		return nil, false
	}
	b := s.batches[0]
	s.batches = s.batches[1:]
	return b, true
}
func (s *scriptSub) Cut() <-chan struct{}       { return s.cut }
func (s *scriptSub) Reason() error              { return s.reason }
func (s *scriptSub) Update(_, _ []string) error { return replica.ErrWatchesAll }
func (s *scriptSub) Close()                     { s.end(replica.ErrClosed) }
func (s *scriptSub) end(err error) {
	s.once.Do(func() { s.reason = err; close(s.cut) })
}

func ev(typ registrarv1.EndpointEvent_EventType, seq uint64, e *registryv1.ServiceEndpoint) *registrarv1.EndpointEvent {
	return &registrarv1.EndpointEvent{Type: typ, Endpoint: e, Sequence: seq, Version: "E1:" + strconv.FormatUint(seq, 10)}
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// held is what the feed's EDS cache for loc holds: the load assignments
// by name, as "ip,ip@p<priority>" per locality; with the Listener cache's
// version and the EDS cache's. Nil before the feed has loaded, or for a
// locality without a cache of its own.
func held(t *testing.T, f *Feed, loc Locality) (eds map[string]string, lrcVer, edsVer string) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.eds[loc]
	if !f.loaded || l == nil {
		return nil, "", ""
	}
	eds = map[string]string{}
	for name, r := range l.c.GetResources() {
		var parts []string
		for _, l := range r.(*endpointv3.ClusterLoadAssignment).GetEndpoints() {
			var ips []string
			for _, e := range l.GetLbEndpoints() {
				ips = append(ips, e.GetEndpoint().GetAddress().GetSocketAddress().GetAddress())
			}
			parts = append(parts, strings.Join(ips, ",")+"@p"+strconv.Itoa(int(l.GetPriority())))
		}
		slices.Sort(parts)
		eds[name] = strings.Join(parts, " ")
	}
	return eds, f.lds.version(), l.version()
}

func newTestFeed(t *testing.T, src Source, max int) *Feed {
	t.Helper()
	f, err := NewFeed(FeedConfig{Source: src, Own: Locality{Region: "r1", Zone: "z1"}, MaxLocalities: max, Logger: quiet(),
		Backoff: retry.Backoff{Base: time.Millisecond, Max: 5 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	f.Start()
	t.Cleanup(f.Close)
	return f
}

func TestFeedResumesAfterACutFromTheLastVersion(t *testing.T) {
	src := newScript(
		replica.Start{Snapshot: []*registryv1.ServiceEndpoint{ep("web", "10.0.0.1", "r1", "z1")}, At: registry.Position{Epoch: "E1", Seq: 1}},
		replica.Start{Resumed: true, Missed: []*registrarv1.EndpointEvent{ev(registrarv1.EndpointEvent_ENDPOINT_ADDED, 4, ep("api", "10.0.0.4", "r1", "z1"))},
			At: registry.Position{Epoch: "E1", Seq: 4}},
	)
	f := newTestFeed(t, src, 0)
	own := Locality{Region: "r1", Zone: "z1"}
	sub := <-src.subs
	wait.For(t, "the snapshot", 5*time.Second, func() bool { e, _, _ := held(t, f, own); return e["web"] == "10.0.0.1@p0" })
	_, lrc1, eds1 := held(t, f, own)

	sub.push(ev(registrarv1.EndpointEvent_ENDPOINT_ADDED, 2, ep("web", "10.0.0.2", "r1", "z2")),
		ev(registrarv1.EndpointEvent_ENDPOINT_UPDATED, 3, draining(ep("web", "10.0.0.1", "r1", "z1"))))
	wait.For(t, "the batch", 5*time.Second, func() bool { e, _, _ := held(t, f, own); return e["web"] == "10.0.0.1@p1 10.0.0.2@p0" })
	_, lrc2, eds2 := held(t, f, own)
	if lrc2 != lrc1 || eds2 == eds1 {
		t.Errorf("an endpoint change moved the listener version (%s → %s) or not the EDS one (%s → %s)", lrc1, lrc2, eds1, eds2)
	}

	sub.end(replica.ErrSlowConsumer)
	<-src.subs
	wait.For(t, "the resumed start", 5*time.Second, func() bool { e, _, _ := held(t, f, own); return e["api"] == "10.0.0.4@p0" })
	if got := src.from(); !slices.Equal(got, []string{"", "E1:3"}) {
		t.Errorf("subscribed from %q, want a fresh start then the last event's version E1:3", got)
	}
	_, lrc3, eds3 := held(t, f, own)
	if lrc3 == lrc2 || eds3 == eds2 {
		t.Errorf("a new target moved the listener version %s → %s and EDS %s → %s; both must move", lrc2, lrc3, eds2, eds3)
	}
	for _, v := range []string{eds1, eds2, eds3} {
		if !strings.HasPrefix(v, f.epoch+"-") {
			t.Errorf("version %q lacks the feed's epoch %q", v, f.epoch)
		}
	}
}

func TestFeedAppliesChunkedSnapshotsAndRemovals(t *testing.T) {
	src := newScript(replica.Start{Snapshot: []*registryv1.ServiceEndpoint{ep("old", "10.0.0.9", "r1", "z1")}, At: registry.Position{Epoch: "E1", Seq: 1}})
	f := newTestFeed(t, src, 0)
	own := Locality{Region: "r1", Zone: "z1"}
	sub := <-src.subs
	sub.push(&registrarv1.EndpointEvent{Type: registrarv1.EndpointEvent_FULL_SNAPSHOT, SnapshotContinues: true, Version: "E2:5",
		Endpoints: []*registryv1.ServiceEndpoint{ep("web", "10.0.0.1", "r1", "z1")}})
	sub.push(&registrarv1.EndpointEvent{Type: registrarv1.EndpointEvent_FULL_SNAPSHOT, Version: "E2:5",
		Endpoints: []*registryv1.ServiceEndpoint{ep("web", "10.0.0.2", "r1", "z1"), ep("api", "10.0.0.3", "r1", "z1")}})
	want := map[string]string{"web": "10.0.0.1@p0 10.0.0.2@p0", "api": "10.0.0.3@p0"}
	wait.ForState(t, "both chunks, and old gone", 5*time.Second, func() (bool, string) {
		e, _, _ := held(t, f, own)
		return len(e) == 2 && e["web"] == want["web"] && e["api"] == want["api"], strings.Join(slices.Sorted(func(yield func(string) bool) {
			for k, v := range e {
				if !yield(k + "=" + v) {
					return
				}
			}
		}), " ")
	})
	sub.push(ev(registrarv1.EndpointEvent_ENDPOINT_REMOVED, 6, ep("api", "10.0.0.3", "r1", "z1")))
	wait.For(t, "api's last endpoint removed: no target", 5*time.Second, func() bool {
		e, _, _ := held(t, f, own)
		_, has := e["api"]
		return !has && len(e) == 1
	})
	for _, l := range []*linear{f.lds, f.rds, f.cds} {
		if _, has := l.c.GetResources()["api"]; has {
			t.Errorf("%s: api still served after its last endpoint went", l.prefix)
		}
		if _, has := l.c.GetResources()["web"]; !has {
			t.Errorf("%s: web not served", l.prefix)
		}
	}
}

func TestFeedBuildsLocalitiesOnDemandWithinItsBound(t *testing.T) {
	src := newScript(replica.Start{Snapshot: []*registryv1.ServiceEndpoint{
		ep("web", "10.0.0.1", "r1", "z1"), ep("web", "10.0.1.1", "r1", "z2"), ep("web", "10.1.0.1", "r2", "z1"),
	}, At: registry.Position{Epoch: "E1", Seq: 1}})
	f := newTestFeed(t, src, 2)
	<-src.subs
	own := Locality{Region: "r1", Zone: "z1"}
	wait.For(t, "the own locality's snapshot", 5*time.Second, func() bool { e, _, _ := held(t, f, own); return e["web"] != "" })

	z2 := &corev3.Node{Id: "n-z2", Locality: &corev3.Locality{Region: "r1", Zone: "z2"}}
	f.ensure(z2)
	e, _, _ := held(t, f, Locality{Region: "r1", Zone: "z2"})
	if want := "10.0.0.1@p1 10.0.1.1@p0 10.1.0.1@p2"; e["web"] != want {
		t.Errorf("a z2 node's web: %q, want %q", e["web"], want)
	}
	ownEDS := f.edsOf(&corev3.Node{Id: "no-locality"})
	if ownEDS != f.eds[own] {
		t.Errorf("a node without a locality is served from %s, want the own locality's cache", ownEDS.prefix)
	}
	if got := f.edsOf(z2); got == ownEDS {
		t.Errorf("a z2 node is served from the own locality's cache %s", got.prefix)
	}

	// The bound (2: own and z2) is reached: r3 is served as own.
	r3 := &corev3.Node{Id: "n-r3", Locality: &corev3.Locality{Region: "r3"}}
	f.ensure(r3)
	if got := f.edsOf(r3); got != ownEDS {
		t.Errorf("a locality beyond the bound is served from %s, want own %s", got.prefix, ownEDS.prefix)
	}
	if e, _, _ := held(t, f, Locality{Region: "r3"}); e != nil {
		t.Error("a cache was built for a locality beyond the bound")
	}
}

// TestServeAnswersAndStops: Serve serves the per-type services on its
// listener until its context ends, then stops and joins the feed.
func TestServeAnswersAndStops(t *testing.T) {
	src := newScript(replica.Start{Snapshot: []*registryv1.ServiceEndpoint{ep("web", "10.0.0.1", "r1", "z1")}, At: registry.Position{Epoch: "E1", Seq: 1}})
	s, err := New(Config{Source: src, Locality: Locality{Region: "r1", Zone: "z1"}, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, lis) }()

	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	stream, err := listenerservice.NewListenerDiscoveryServiceClient(cc).StreamListeners(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&discoverygrpc.DiscoveryRequest{Node: &corev3.Node{Id: "lds"}, ResourceNames: []string{"web"}}); err != nil {
		t.Fatal(err)
	}
	r, err := stream.Recv()
	if err != nil || len(r.GetResources()) != 1 {
		t.Fatalf("LDS web: %v, %v", r, err)
	}
	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("Serve: %v, want nil once its context ended", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after its context ended")
	}
}
