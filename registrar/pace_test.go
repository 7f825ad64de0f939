package registrar

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/etcdstore"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/registry"
)

func TestBackstopPauseFor(t *testing.T) {
	for _, tc := range []struct {
		mode     string
		interval time.Duration
		steps    int
		want     time.Duration
	}{
		// Half the interval, shared among the steps.
		{SyncWatch, 5 * time.Second, 73, 5 * time.Second / 2 / 73},
		{SyncWatch, time.Second, 5, 100 * time.Millisecond},
		{SyncWatch, 20 * time.Millisecond, 4, 2500 * time.Microsecond},
		// Never more than maxBackstopPause between two steps.
		{SyncWatch, 5 * time.Second, 2, maxBackstopPause},
		{SyncWatch, time.Hour, 1000, maxBackstopPause},
		// No steps to pause between.
		{SyncWatch, 5 * time.Second, 0, 0},
		// Polling learns of changes only this way: no pause.
		{SyncPoll, 5 * time.Second, 73, 0},
	} {
		if got := backstopPauseFor(tc.mode, tc.interval, tc.steps); got != tc.want {
			t.Errorf("backstopPauseFor(%s, %v, %d) = %v, want %v", tc.mode, tc.interval, tc.steps, got, tc.want)
		}
	}
}

func TestPartBounds(t *testing.T) {
	for _, n := range []int{0, 1, backstopPartKeys, backstopPartKeys + 1, 3*backstopPartKeys + 7} {
		kr := etcdstore.KeyRevisions{Revision: 9}
		for i := range n {
			kr.Endpoints = append(kr.Endpoints, etcdstore.EndpointRevision{ID: paceID(i), ModRevision: 3})
		}
		got := *partBounds(len(kr.Endpoints), func(i int) (string, error) { return kr.Endpoints[i].ID.Key() })
		var want []string
		for i := backstopPartKeys; i < n; i += backstopPartKeys {
			k, err := paceID(i).Key()
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, k)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%d endpoints: bounds %v, want %v", n, got, want)
		}
	}
}

func paceID(i int) registry.EndpointID {
	return registry.EndpointID{Region: "r1", Cluster: "c2", Service: fmt.Sprintf("svc%03d", i/100),
		Protocol: registryv1.Protocol_PROTOCOL_HTTP1, IP: fmt.Sprintf("10.%d.%d.%d", i/65536, i/256%256, i%256)}
}

// partsSpy records how the registrar asks for its keys-only listings.
type partsSpy struct {
	*etcdstore.Store
	mu    sync.Mutex
	calls []partsCall
}

type partsCall struct {
	bounds int
	pauses []time.Duration // how long each Between took
	keys   int
}

func (s *partsSpy) ListRevisionsInParts(ctx context.Context, p etcdstore.Parts) (etcdstore.KeyRevisions, error) {
	c := partsCall{bounds: len(p.Bounds)}
	between := p.Between
	p.Between = func(ctx context.Context) error {
		t0 := time.Now()
		err := between(ctx)
		c.pauses = append(c.pauses, time.Since(t0))
		return err
	}
	kr, err := s.Store.ListRevisionsInParts(ctx, p)
	c.keys = len(kr.Endpoints)
	s.mu.Lock()
	s.calls = append(s.calls, c)
	s.mu.Unlock()
	return kr, err
}

func (s *partsSpy) snapshot() []partsCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]partsCall(nil), s.calls...)
}

// With a watch running, the backstop reads a large registry in parts
// bounded by its last listing, and pauses between them for its share of
// half the interval; the listing it assembles is still the whole registry.
func TestBackstopReadsInPacedParts(t *testing.T) {
	etcd := etcdtest.Start(t)
	const n = 2*backstopPartKeys + 500
	writer := etcdstore.New(etcd.Client(t), etcdstore.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var muts []etcdstore.Mutation
	for i := range n {
		id := paceID(i)
		muts = append(muts, etcdstore.Mutation{ID: id, Endpoint: &registryv1.ServiceEndpoint{Service: id.Service, Protocol: id.Protocol,
			Ip: id.IP, Ports: []*registryv1.Port{{Name: "http", Port: 80}}, Region: id.Region, Cluster: id.Cluster,
			State: registryv1.State_STATE_SERVING, Weight: 1}})
	}
	if _, err := writer.Apply(ctx, muts); err != nil {
		t.Fatal(err)
	}
	spy := &partsSpy{Store: etcdstore.New(etcd.Client(t), etcdstore.Options{})}
	const interval = 800 * time.Millisecond
	r, err := New(Options{ClusterName: "c1", Region: "r1", SyncInterval: interval, Logger: quietLog()}, spy)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer r.Close(context.Background())
	deadline := time.Now().Add(30 * time.Second)
	for len(spy.snapshot()) < 3 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	calls := spy.snapshot()
	if len(calls) < 3 {
		t.Fatalf("%d backstop listings in 30 s at a %v interval", len(calls), interval)
	}
	// Bounded by the start-up listing, then by the last keys-only one.
	// Steps: 2 parts' bounds and n/listingStep comparison steps.
	want := backstopPauseFor(SyncWatch, interval, 2+n/listingStep)
	for i, c := range calls {
		if c.bounds != 2 || len(c.pauses) != 2 || c.keys != n {
			t.Errorf("listing %d: %d bounds, %d pauses, %d keys; want 2, 2, %d", i+1, c.bounds, len(c.pauses), c.keys, n)
		}
		for _, p := range c.pauses {
			if p < want {
				t.Errorf("listing %d paused %v between parts, want at least %v", i+1, p, want)
			}
		}
	}
	r.mu.Lock()
	size := r.st.len()
	r.mu.Unlock()
	if size != n {
		t.Fatalf("snapshot holds %d endpoints, want %d", size, n)
	}
}

// The ghost sweep looks at a few services per hold of the lock, and still
// removes every ghost in one sweep: on every node without a record, in
// this cluster only, never a static endpoint or one within its grace.
func TestSweepInStepsRemovesEveryGhost(t *testing.T) {
	r, err := New(Options{Region: "r1", ClusterName: "c1", WriteQueueLimit: 1 << 30, NodeTTL: 30 * time.Second, Logger: quietLog()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	now := t0.Add(time.Hour)
	r.now = func() time.Time { return now }
	for _, n := range []string{"n0", "n1", "n2"} {
		id := registry.NodeID{Region: "r1", Cluster: "c1", Name: n}
		r.st.setNode(id, &registryv1.Node{Name: n, Region: "r1", Cluster: "c1"}, 0)
	}
	const total = 3*listingStep + 101
	wantGhosts := map[registry.EndpointID]bool{}
	for i := range total {
		ep := &registryv1.ServiceEndpoint{Service: fmt.Sprintf("svc%03d", i%300), Protocol: registryv1.Protocol_PROTOCOL_HTTP1,
			Ip: fmt.Sprintf("10.1.%d.%d", i/256, i%256), Ports: []*registryv1.Port{{Name: "http", Port: 80}},
			Region: "r1", Cluster: "c1", Node: fmt.Sprintf("n%d", i%6), State: registryv1.State_STATE_SERVING, Weight: 1}
		at := t0
		switch {
		case i%50 == 0:
			ep.Node = "" // static: never swept
		case i%50 == 1:
			ep.Cluster = "c2" // another cluster's: never swept
		case i%50 == 2:
			at = now.Add(-time.Second) // within the grace
		}
		mustRegister(t, r.st, ep)
		if i%50 == 2 {
			got := r.st.get(registry.IDOf(ep))
			got.CreatedAt = timestamppb.New(at)
		}
		if ep.Node != "" && ep.Cluster == "c1" && i%6 >= 3 && i%50 != 2 {
			wantGhosts[registry.IDOf(ep)] = true
		}
	}
	w := newWatcher(nil, 1<<20)
	r.hub.add(w)
	if n := r.sweep(); n != len(wantGhosts) {
		t.Fatalf("swept %d, want %d", n, len(wantGhosts))
	}
	if r.st.len() != total-len(wantGhosts) {
		t.Fatalf("%d endpoints left, want %d", r.st.len(), total-len(wantGhosts))
	}
	for id := range wantGhosts {
		if r.st.get(id) != nil {
			t.Fatalf("ghost %s left", id)
		}
	}
	// Each hold of the lock published its own removals: several batches,
	// none larger than a step's endpoints.
	batches, removed := 0, 0
	for b, ok := w.next(); ok; b, ok = w.next() {
		batches++
		removed += len(b)
		if len(b) > listingStep {
			t.Errorf("one batch of %d removals: more than a step's %d endpoints", len(b), listingStep)
		}
	}
	if removed != len(wantGhosts) || batches < total/listingStep {
		t.Errorf("watcher got %d removals in %d batches, want %d in at least %d", removed, batches, len(wantGhosts), total/listingStep)
	}
	if n := r.sweep(); n != 0 {
		t.Fatalf("second sweep removed %d", n)
	}
}

// chanSender is a stream that hands what is sent to a channel.
type chanSender struct {
	ctx context.Context
	out chan *registrarv1.EndpointEvent
}

func (c *chanSender) Send(ev *registrarv1.EndpointEvent) error { c.out <- ev; return nil }
func (c *chanSender) SendMsg(m any) error                      { return c.Send(m.(*registrarv1.EndpointEvent)) }
func (c *chanSender) Context() context.Context                 { return c.ctx }

// Once a stream's start is sent, the stream no longer holds it: a
// snapshot of every endpoint a stream follows, kept for the stream's life,
// would be marked by every collection.
func TestStreamLetsItsStartGo(t *testing.T) {
	r, err := New(Options{Region: "r1", ClusterName: "c1", WriteQueueLimit: 1 << 20, Logger: quietLog()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		mustRegister(t, r.st, &registryv1.ServiceEndpoint{Service: "web", Protocol: registryv1.Protocol_PROTOCOL_HTTP1,
			Ip: fmt.Sprintf("10.2.0.%d", i), Ports: []*registryv1.Port{{Name: "http", Port: 80}}, Region: "r1", Cluster: "c1",
			State: registryv1.State_STATE_SERVING, Weight: 1})
	}
	svc := &service{r: r}
	for _, resume := range []bool{false, true} {
		from := version{}
		if resume {
			from = version{epoch: r.st.epoch, seq: 10}
		}
		sub := r.subscribe(nil, from)
		if sub.resumed != resume || (len(sub.snapshot) == 0 && len(sub.missed) == 0) {
			t.Fatalf("resume %v: subscription resumed=%v with %d endpoints, %d events", resume, sub.resumed, len(sub.snapshot), len(sub.missed))
		}
		ctx, cancel := context.WithCancel(context.Background())
		st := &chanSender{ctx: ctx, out: make(chan *registrarv1.EndpointEvent, 100)}
		stop := make(chan error)
		done := make(chan error)
		go func() { done <- svc.serveUntil(st, sub, &registrarv1.WatchEndpointsRequest{}, stop) }()
		// The start: a snapshot of all 50, or the 40 missed events and a
		// bookmark.
		for got := 0; got < 50; {
			ev := <-st.out
			got += len(ev.GetEndpoints())
			if ev.GetType() == registrarv1.EndpointEvent_PROGRESS {
				got = 50
			}
		}
		stop <- errors.New("test over")
		<-done
		cancel()
		if sub.snapshot != nil || sub.missed != nil {
			t.Errorf("resume %v: the stream still holds %d endpoints and %d events it sent", resume, len(sub.snapshot), len(sub.missed))
		}
	}
}
