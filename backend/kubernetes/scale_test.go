package kubernetes

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/backend/backendtest"
	"github.com/aethermesh/aether/internal/testutil/kubeapi"
	"github.com/aethermesh/aether/registry"
)

// TestPropagationAcrossStores measures what the registrar's sync rests on:
// writes of one store (a replica) reaching another store's feed, through
// the API server's watch and the fenced merge of the two streams (the
// node stream is idle throughout, so every event waits for a fence). It
// writes AETHER_KUBE_SCALE endpoints (default 2000) in batches of 100 and
// reports write throughput, propagation p50/p99/max, and how long a full
// List and a digest of them take. It fails if any write is missing from
// the feed or the listing.
func TestPropagationAcrossStores(t *testing.T) {
	n := 2000
	if v, err := strconv.Atoi(os.Getenv("AETHER_KUBE_SCALE")); err == nil && v > 0 {
		n = v
	}
	srv := kubeapi.Start(t)
	ns := freshNamespace(t, srv.Clientset(t))
	inflight, _ := strconv.Atoi(os.Getenv("AETHER_KUBE_INFLIGHT"))
	writer := openStore(t, srv, ns, func(c *Config) { c.MaxInFlight = inflight })
	reader := openStore(t, srv, ns, nil)
	base, err := reader.List(ctxFor(t, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	feed := reader.Watch(ctxFor(t, 10*time.Minute), base.Revision)

	var mu sync.Mutex
	sent := map[registry.EndpointID]time.Time{}
	lat := make([]time.Duration, 0, n)
	done := make(chan struct{})
	go func() {
		defer close(done)
		got := 0
		for b := range feed {
			now := time.Now()
			mu.Lock()
			for _, e := range b.Events {
				if at, ok := sent[e.ID]; ok {
					lat = append(lat, now.Sub(at))
					delete(sent, e.ID)
					got++
				}
			}
			mu.Unlock()
			if got == n {
				return
			}
		}
	}()

	start := time.Now()
	const batch = 100
	for lo := 0; lo < n; lo += batch {
		var muts []backend.Mutation
		for i := lo; i < min(lo+batch, n); i++ {
			ep := testEndpoint(fmt.Sprintf("scale-%d", i%50), i, "n", 100, "A", "c1")
			muts = append(muts, backend.Mutation{ID: registry.IDOf(ep), Endpoint: ep})
		}
		// Stamp the send time of a batch just before it goes out: the
		// latency is from the write's call to the other store's feed.
		now := time.Now()
		mu.Lock()
		for _, m := range muts {
			sent[m.ID] = now
		}
		mu.Unlock()
		for i, o := range applyAll(t, writer, muts...) {
			if !o.Landed {
				t.Fatalf("write %d of the batch at %d did not land: %+v", i, lo, o)
			}
		}
	}
	wrote := time.Since(start)
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		mu.Lock()
		t.Fatalf("the reader's feed is missing %d of %d writes", len(sent), n)
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	pct := func(p float64) time.Duration { return lat[min(int(float64(len(lat))*p), len(lat)-1)] }

	start = time.Now()
	l, err := reader.List(ctxFor(t, time.Minute))
	if err != nil || len(l.Endpoints) != n {
		t.Fatalf("List: %d endpoints, %v; want %d", len(l.Endpoints), err, n)
	}
	listed := time.Since(start)
	start = time.Now()
	kr, err := reader.ListRevisionsInParts(ctxFor(t, time.Minute), backend.Parts{})
	if err != nil || len(kr.Endpoints) != n {
		t.Fatalf("digest: %d endpoints, %v; want %d", len(kr.Endpoints), err, n)
	}
	digested := time.Since(start)

	// Single writes, one at a time: from the call to the other store's
	// feed, so one write's round trip plus the propagation itself.
	c := backendtest.Watch(t, reader, l.Revision)
	var single []time.Duration
	for i := range 100 {
		ep := testEndpoint("single", i, "n", 200, "A", "c1")
		at := time.Now()
		o := applyAll(t, writer, backend.Mutation{ID: registry.IDOf(ep), Endpoint: ep})[0]
		c.UpTo(t, o.Revision)
		single = append(single, time.Since(at))
	}
	sort.Slice(single, func(i, j int) bool { return single[i] < single[j] })
	t.Logf("%d endpoints in batches of %d: written in %v (%.0f/s); propagation to the other store's feed p50 %v p99 %v max %v; List %v, digest %v; %d fences; single writes call-to-feed p50 %v p99 %v",
		n, batch, wrote.Round(time.Millisecond), float64(n)/wrote.Seconds(), pct(0.5).Round(time.Millisecond), pct(0.99).Round(time.Millisecond),
		lat[len(lat)-1].Round(time.Millisecond), listed.Round(time.Millisecond), digested.Round(time.Millisecond), reader.fenceSeq.Load(),
		single[50].Round(time.Millisecond), single[98].Round(time.Millisecond))
}
