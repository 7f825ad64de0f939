package core

import (
	"sort"
	"testing"

	"github.com/aethermesh/aether/backend"
)

func snapshotIPs(s *State) []string {
	var out []string
	for _, m := range s.endpoints {
		for _, ep := range m {
			out = append(out, ep.Ip+"/"+ep.State.String())
		}
	}
	sort.Strings(out)
	return out
}

// A listing applied a service per step, with watch batches between the
// steps, ends exactly where one applied at once would, and leaves what the
// watch did between the steps alone.
func TestListingInSteps(t *testing.T) {
	web1, web2 := mkEP(t, "web", "10.0.0.1"), mkEP(t, "web", "10.0.0.2")
	db1, db2 := mkEP(t, "db", "10.0.1.1"), mkEP(t, "db", "10.0.1.2")
	auth1 := mkEP(t, "auth", "10.0.2.1")
	s := newStateForTest("e", 100, 100)
	s.ApplyListing(listing(10, web1, db1, db2))
	s.TrackForListing()
	// The listing (at 15) has auth1, which the watch has not delivered
	// yet, and lacks db1, whose deletion the watch missed.
	a := NewListingApply(listing(15, auth1, web1, db2))
	if !s.BeginListing(a) {
		t.Fatal("listing refused")
	}
	steps := 0
	for done := false; !done; steps++ {
		_, done = s.StepListing(a, 1)
		if steps == 0 {
			// Between steps the watch goes past the listing: auth1 (at
			// 12), then db2 deleted and web2 added after it.
			s.ApplyWatch(backend.WatchBatch{Revision: 20, Events: []backend.Event{put(12, auth1), del(17, db2), put(18, web2)}})
		}
	}
	if steps < 3 {
		t.Fatalf("applied in %d steps, want one per service", steps)
	}
	if got, want := snapshotIPs(s), []string{"10.0.0.1/STATE_SERVING", "10.0.0.2/STATE_SERVING", "10.0.2.1/STATE_SERVING"}; !eq(got, want) {
		t.Fatalf("snapshot %v, want %v", got, want)
	}
	if s.track != nil || s.backendRv != 20 {
		t.Fatalf("after the listing: track %v, backend revision %d", s.track, s.backendRv)
	}
}
