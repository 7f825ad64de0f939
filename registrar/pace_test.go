package registrar

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	etcdstore "github.com/aethermesh/aether/backend/etcd"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/registrar/internal/core"
	"github.com/aethermesh/aether/registry"
)

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
	want := core.BackstopPause(false, interval, 2+n/listingStep)
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
	size := r.st.Len()
	r.mu.Unlock()
	if size != n {
		t.Fatalf("snapshot holds %d endpoints, want %d", size, n)
	}
}
