package core

import (
	"sort"
	"testing"
	"time"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/registry"
)

// A background listing is read at a revision the watch may pass before the
// listing is applied; the cases are what the watch did meanwhile.
func TestBackgroundListing(t *testing.T) {
	a, b, c := mkEP(t, "web", "10.0.0.1"), mkEP(t, "web", "10.0.0.2"), mkEP(t, "db", "10.0.0.3")
	aDrain := mkEP(t, "web", "10.0.0.1", draining)
	for _, tc := range []struct {
		name    string
		start   []*registryv1.ServiceEndpoint // snapshot at revision 10, before the listing starts
		watch   []backend.Event               // applied while the listing is out (batch revision 20)
		listAt  int64
		listed  []*registryv1.ServiceEndpoint
		wantEvs []string
		want    []string // the snapshot afterwards: ip/state
	}{{
		name:  "watch passed the listing, nothing missed: no events",
		start: []*registryv1.ServiceEndpoint{a, b},
		watch: []backend.Event{put(12, c), put(20, aDrain)}, listAt: 15,
		listed: []*registryv1.ServiceEndpoint{a, b, c},
		want:   []string{"10.0.0.1/STATE_DRAINING", "10.0.0.2/STATE_SERVING", "10.0.0.3/STATE_SERVING"},
	}, {
		name:  "a delete after the listing is not undone",
		start: []*registryv1.ServiceEndpoint{a, b},
		watch: []backend.Event{del(18, b)}, listAt: 15,
		listed: []*registryv1.ServiceEndpoint{a, b},
		want:   []string{"10.0.0.1/STATE_SERVING"},
	}, {
		name:  "an add after the listing is not removed",
		start: []*registryv1.ServiceEndpoint{a},
		watch: []backend.Event{put(19, c)}, listAt: 15,
		listed: []*registryv1.ServiceEndpoint{a},
		want:   []string{"10.0.0.1/STATE_SERVING", "10.0.0.3/STATE_SERVING"},
	}, {
		name:  "an endpoint the watch never delivered is repaired",
		start: []*registryv1.ServiceEndpoint{a},
		watch: []backend.Event{put(19, b)}, listAt: 15,
		listed:  []*registryv1.ServiceEndpoint{a, c},
		wantEvs: []string{"ENDPOINT_ADDED 10.0.0.3"},
		want:    []string{"10.0.0.1/STATE_SERVING", "10.0.0.2/STATE_SERVING", "10.0.0.3/STATE_SERVING"},
	}, {
		name:  "a missed delete is repaired",
		start: []*registryv1.ServiceEndpoint{a, b},
		watch: []backend.Event{put(19, c)}, listAt: 15,
		listed:  []*registryv1.ServiceEndpoint{a},
		wantEvs: []string{"ENDPOINT_REMOVED 10.0.0.2"},
		want:    []string{"10.0.0.1/STATE_SERVING", "10.0.0.3/STATE_SERVING"},
	}, {
		name:  "a missed update is repaired",
		start: []*registryv1.ServiceEndpoint{a},
		watch: []backend.Event{put(19, c)}, listAt: 15,
		listed:  []*registryv1.ServiceEndpoint{aDrain},
		wantEvs: []string{"ENDPOINT_UPDATED 10.0.0.1"},
		want:    []string{"10.0.0.1/STATE_DRAINING", "10.0.0.3/STATE_SERVING"},
	}, {
		name:  "the watch changed a key before the listing's revision: the listing is as new",
		start: []*registryv1.ServiceEndpoint{a},
		watch: []backend.Event{put(12, aDrain), put(19, c)}, listAt: 15,
		listed: []*registryv1.ServiceEndpoint{aDrain},
		want:   []string{"10.0.0.1/STATE_DRAINING", "10.0.0.3/STATE_SERVING"},
	}, {
		name:  "the watch is behind the listing: the listing is applied as a newer one",
		start: []*registryv1.ServiceEndpoint{a},
		watch: nil, listAt: 25,
		listed:  []*registryv1.ServiceEndpoint{a, b},
		wantEvs: []string{"ENDPOINT_ADDED 10.0.0.2"},
		want:    []string{"10.0.0.1/STATE_SERVING", "10.0.0.2/STATE_SERVING"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStateForTest("e", 100, 100)
			s.ApplyListing(listing(10, tc.start...))
			s.TrackForListing()
			if tc.watch != nil {
				s.ApplyWatch(backend.WatchBatch{Revision: 20, Events: tc.watch})
			}
			got := types(s.ApplyListing(listing(tc.listAt, tc.listed...)))
			if !eq(got, tc.wantEvs) {
				t.Errorf("events %v, want %v", got, tc.wantEvs)
			}
			if got := snapshotIPs(s); !eq(got, tc.want) {
				t.Errorf("snapshot %v, want %v", got, tc.want)
			}
			if s.track != nil {
				t.Error("tracking left on after the listing")
			}
			if want := max(20, tc.listAt); tc.watch != nil && s.backendRv != want {
				t.Errorf("backend revision %d, want %d", s.backendRv, want)
			}
		})
	}
}

// Without tracking, a listing older than the snapshot is still ignored: a
// foreground listing cannot know what the watch did after it.
func TestUntrackedStaleListingIgnored(t *testing.T) {
	a, b := mkEP(t, "web", "10.0.0.1"), mkEP(t, "web", "10.0.0.2")
	s := newStateForTest("e", 100, 100)
	s.ApplyListing(listing(10, a))
	s.TrackForListing()
	s.Untrack() // the listing failed
	s.ApplyWatch(backend.WatchBatch{Revision: 20, Events: []backend.Event{put(20, b)}})
	if evs := s.ApplyListing(listing(15, a)).Events; evs != nil {
		t.Fatalf("stale untracked listing produced %v", types(evs))
	}
}

// Local writes still win over a background listing.
func TestBackgroundListingKeepsLocalWrites(t *testing.T) {
	a, b := mkEP(t, "web", "10.0.0.1"), mkEP(t, "web", "10.0.0.2")
	s := newStateForTest("e", 100, 100)
	s.ApplyListing(listing(10))
	s.TrackForListing()
	s.register(a, t0) // pending
	s.register(b, t0)
	done := s.TakeBatch(1, time.Time{})
	s.batchDone(done, 18) // one of them persisted after the listing began...
	// ...and the watch delivers that put, then goes past it.
	persisted := s.Get(done[0].ID)
	s.ApplyWatch(backend.WatchBatch{Revision: 20, Events: []backend.Event{put(18, persisted), put(19, mkEP(t, "db", "10.0.0.9"))}})
	if evs := s.ApplyListing(listing(15)).Events; len(evs) != 0 {
		t.Fatalf("listing reverted local writes: %v", types(evs))
	}
	if s.Get(registry.IDOf(a)) == nil || s.Get(registry.IDOf(b)) == nil {
		t.Fatal("local write lost")
	}
}

// Node records follow the same rule.
func TestBackgroundListingNodes(t *testing.T) {
	n1 := &registryv1.Node{Name: "n1", Region: "default", Cluster: "default"}
	n2 := &registryv1.Node{Name: "n2", Region: "default", Cluster: "default"}
	n3 := &registryv1.Node{Name: "n3", Region: "default", Cluster: "default"}
	id := registry.NodeIDOf
	s := newStateForTest("e", 100, 100)
	s.ApplyListing(backend.Listing{Revision: 10, Nodes: []*registryv1.Node{n1, n2}})
	s.TrackForListing()
	s.ApplyWatch(backend.WatchBatch{Revision: 20, Nodes: []backend.NodeEvent{
		{ID: id(n1), Revision: 18},           // n1 left after the listing
		{ID: id(n3), Node: n3, Revision: 19}, // n3 joined after it
	}})
	// The listing (at 15) still has n1, lacks n3, and lacks n2 (whose
	// deletion the watch missed).
	s.ApplyListing(backend.Listing{Revision: 15, Nodes: []*registryv1.Node{n1}})
	var got []string
	for nid := range s.nodes {
		got = append(got, nid.Name)
	}
	sort.Strings(got)
	if !eq(got, []string{"n3"}) {
		t.Fatalf("nodes %v, want [n3]", got)
	}
}

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
