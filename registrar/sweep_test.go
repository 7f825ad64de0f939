package registrar

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/registry"
)

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
