package registrar

import (
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

// trackForListing starts noting watch changes for a listing about to be
// read. Call it before the listing's read begins, under the same lock as
// the watch's application.
func (s *state) trackForListing() {
	s.track = &relistTrack{endpoints: map[registry.EndpointID]int64{}, nodes: map[registry.NodeID]int64{}}
}

// untrack stops noting changes, for a listing that failed.
func (s *state) untrack() { s.track = nil }

// noteEndpoint and noteNode record a watch change while a listing is out.
func (s *state) noteEndpoint(id registry.EndpointID, rev int64) {
	if s.track != nil && rev > s.track.endpoints[id] {
		s.track.endpoints[id] = rev
	}
}

func (s *state) noteNode(id registry.NodeID, rev int64) {
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
