package core

import (
	"math"
	"time"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/registry"
)

// A backstop re-list runs in the background while the etcd watch keeps
// being applied: listing a large registry takes long enough (about a second
// for 100k endpoints on a small machine) that stopping the watch for it
// would hold every other replica's writes back by as much, every
// --sync-interval. The price is that the listing arrives at a revision L
// that the snapshot may already have passed. It is still exact, because the
// snapshot notes every change the watch applied since the listing began:
//
//   - an endpoint the watch changed at a revision after L is known newer
//     than the listing, and is left alone;
//   - every other endpoint's state reflects the backend at or before L (the
//     watch is ordered: anything it delivered past L came after everything
//     up to L), so where it differs from the listing a change was missed,
//     and the listing's value is the repair.
//
// The same holds for node records. A listing taken with the watch stopped
// (start-up, a watch that lost its position, poll mode) has nothing to
// track, and one older than the snapshot is then ignored as before.

// relistTrack is what the watch changed since a background listing began:
// the revision of each endpoint's and node record's latest change.
type relistTrack struct {
	endpoints map[registry.EndpointID]int64
	nodes     map[registry.NodeID]int64
}

// TrackForListing starts noting watch changes for a listing about to be
// read. Call it before the listing's read begins, under the same lock as
// the watch's application.
func (s *State) TrackForListing() {
	s.track = &relistTrack{endpoints: map[registry.EndpointID]int64{}, nodes: map[registry.NodeID]int64{}}
}

// Untrack stops noting changes, for a listing that failed.
func (s *State) Untrack() { s.track = nil }

// noteEndpoint and noteNode record a watch change while a listing is out.
func (s *State) noteEndpoint(id registry.EndpointID, rev int64) {
	if s.track != nil && rev > s.track.endpoints[id] {
		s.track.endpoints[id] = rev
	}
}

func (s *State) noteNode(id registry.NodeID, rev int64) {
	if s.track != nil && rev > s.track.nodes[id] {
		s.track.nodes[id] = rev
	}
}

// newerEndpoint and newerNode report whether the watch changed a key after
// rev while the listing was out; false when nothing is tracked.
func (t *relistTrack) newerEndpoint(id registry.EndpointID, rev int64) bool {
	return t != nil && t.endpoints[id] > rev
}

func (t *relistTrack) newerNode(id registry.NodeID, rev int64) bool {
	return t != nil && t.nodes[id] > rev
}

// ListingApply is one listing being folded into the snapshot, a few
// services at a time: reconciling 100k endpoints takes over 100 ms, too
// long to hold the lock that every registration and every delivery takes.
// Between steps the lock is free, local writes and watch batches go on
// (tracking keeps the listing exact across them, as above), and the
// listing's own events go out as they are found.
type ListingApply struct {
	l     backend.Listing
	Scope Scope // the services to reconcile; nil: all
	// Started is when the listing's read began: a provisional peer write
	// applied less than PeerGrace before it is left alone (peer.go).
	// Zero leaves every provisional write alone.
	Started   time.Time
	track     *relistTrack
	byService map[string][]listed
	services  []string // the listing's services, then the snapshot's others
	next      int
	NodeGone  bool // the listing dropped a node record the snapshot had
}

// listed is an endpoint of a listing and its mod revision (0: not known).
type listed struct {
	ep  *registryv1.ServiceEndpoint
	rev int64
}

// revAt is revs[i], or 0 (not known) past its end.
func revAt(revs []int64, i int) int64 {
	if i < len(revs) {
		return revs[i]
	}
	return 0
}

// NewListingApply groups a listing by service. It reads no state, so it
// runs outside the lock.
func NewListingApply(l backend.Listing) *ListingApply {
	a := &ListingApply{l: l, byService: map[string][]listed{}}
	for i, ep := range l.Endpoints {
		if _, ok := a.byService[ep.Service]; !ok {
			a.services = append(a.services, ep.Service)
		}
		a.byService[ep.Service] = append(a.byService[ep.Service], listed{ep, revAt(l.EndpointRevs, i)})
	}
	return a
}

// BeginListing starts applying a; false means the listing is to be
// ignored: older than the snapshot, with nothing tracked to say where.
func (s *State) BeginListing(a *ListingApply) bool {
	a.track = s.track
	if a.l.Revision < s.backendRv && a.track == nil {
		return false
	}
	if a.Scope != nil {
		in := a.services[:0]
		for _, svc := range a.services {
			if a.Scope[svc] {
				in = append(in, svc)
			}
		}
		a.services = in
	}
	for svc := range s.endpoints {
		if _, ok := a.byService[svc]; !ok && (a.Scope == nil || a.Scope[svc]) {
			a.services = append(a.services, svc)
		}
	}
	return true
}

// StepListing reconciles whole services until about budget endpoints have
// been looked at, and the node records and the revision once every service
// is done, which it reports.
//
// A node record the listing no longer has asks for a sweep, as a watch's
// deletion would.
func (s *State) StepListing(a *ListingApply, budget int) (eff Effects, done bool) {
	var evs []*registrarv1.EndpointEvent
	for a.next < len(a.services) && budget > 0 {
		svc := a.services[a.next]
		a.next++
		listed := a.byService[svc]
		budget -= len(listed) + len(s.endpoints[svc])
		evs = append(evs, s.reconcileService(svc, listed, a)...)
	}
	if a.next < len(a.services) {
		return Effects{Events: evs}, false
	}
	s.finishListing(a)
	return Effects{Events: evs, Sweep: a.NodeGone}, true
}

// reconcileService makes one service's endpoints match the listing, except
// those written locally and not yet known persisted by it (guarded) and
// those the watch changed after it.
func (s *State) reconcileService(svc string, eps []listed, a *ListingApply) []*registrarv1.EndpointEvent {
	rev := a.l.Revision
	var evs []*registrarv1.EndpointEvent
	seen := make(map[registry.EndpointID]struct{}, len(eps))
	for _, e := range eps {
		id := registry.IDOf(e.ep)
		seen[id] = struct{}{}
		if s.guarded(id, rev) || a.track.newerEndpoint(id, rev) || s.peerGuarded(id, a) {
			continue
		}
		if s.Get(id) == e.ep {
			// The snapshot's own value, handed back by a keys-only
			// backstop (digest.go): unchanged, and known at e.rev.
			if e.rev > 0 {
				s.epRev[id] = e.rev
			}
			continue
		}
		if ev := s.setAt(id, e.ep, e.rev); ev != nil {
			evs = append(evs, ev)
		}
	}
	var gone []registry.EndpointID
	for id := range s.endpoints[svc] {
		if _, ok := seen[id]; !ok && !s.guarded(id, rev) && !a.track.newerEndpoint(id, rev) && !s.peerGuarded(id, a) {
			gone = append(gone, id)
		}
	}
	for _, id := range gone {
		if ev := s.set(id, nil); ev != nil {
			evs = append(evs, ev)
		}
	}
	return evs
}

// finishListing takes the listing's node records, keeping those the watch
// or our own writes know newer, advances the snapshot's revision and ends
// tracking.
func (s *State) finishListing(a *ListingApply) {
	rev, t := a.l.Revision, a.track
	nodes := make(map[registry.NodeID]*registryv1.Node, len(a.l.Nodes))
	revs := make(map[registry.NodeID]int64, len(a.l.Nodes))
	for i, n := range a.l.Nodes {
		if id := registry.NodeIDOf(n); !t.newerNode(id, rev) {
			nodes[id] = n
			if r := revAt(a.l.NodeRevs, i); r > 0 {
				revs[id] = r
			}
		}
	}
	keep := func(id registry.NodeID) { // the snapshot's word, absent or not
		delete(nodes, id)
		delete(revs, id)
		if n, ok := s.nodes[id]; ok {
			nodes[id] = n
			if r, ok := s.nodeRev[id]; ok {
				revs[id] = r
			}
		}
	}
	if t != nil {
		for id, r := range t.nodes {
			if _, ok := s.nodes[id]; ok && r > rev {
				keep(id) // the watch's word is newer; absent stays absent
			}
		}
	}
	for id, r := range s.nodeFlushed {
		if r > rev { // ours is newer than the listing
			keep(id)
		}
	}
	for id := range s.nodes {
		if _, ok := nodes[id]; !ok {
			a.NodeGone = true
			break
		}
	}
	s.nodes, s.nodeRev = nodes, revs
	s.finishPeer(a)
	s.advance(rev)
	if s.track == t {
		s.track = nil
	}
}

// ApplyListing reconciles the snapshot with a full listing of the backend
// taken at l.Revision in one step, producing events for the differences;
// for start-up, and for tests.
func (s *State) ApplyListing(l backend.Listing) Effects {
	a := NewListingApply(l)
	if !s.BeginListing(a) {
		s.track = nil
		return Effects{}
	}
	eff, _ := s.StepListing(a, math.MaxInt)
	return eff
}
