package core

import (
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/registry"
)

// The backstop re-list reads the backend every --sync-interval to repair
// whatever the watch missed. Reading every value each time costs the
// registrar a decode of the whole registry and etcd a read of every value
// from its backend, every interval, on every replica: at 100k endpoints
// the largest periodic cost of both in the fan-out scenario's profiles
// (AETHER_BENCH_PROFILE). The snapshot knows the mod revision of
// most values it holds (State.epRev), so the backstop asks etcd for keys and
// mod revisions only (answered from etcd's in-memory index) and fetches the
// values of just the keys whose revision differs or is not known: in steady
// state, none. What it hands on is an ordinary full listing, assembled from
// the fetched values and the snapshot's own, and applied as any listing is
// (relist.go), so the repair rules are the same either way.
//
// Comparing and assembling happen at different times from applying, but
// that is safe: an endpoint whose value the listing takes from the snapshot
// had exactly that value at the listing's revision, and any later change to
// it is either tracked (the watch) or guarded (a local write), and so is
// left alone when the listing is applied.
//
// With a watch running the check is background work, and is spread over
// half the interval (BackstopPause): the keys are read in parts bounded by
// keys of the last listing (backend.Parts), all at one revision, and
// compared a step at a time, with pauses in between. Done at once, a
// check of every key is one burst of CPU in etcd and in the registrar, and
// on a busy machine every write and watch event waits behind it: the
// fan-out scenario's cross-replica tail (docs/benchmarks.md) is where that
// shows.

// DigestPlan turns a keys-only listing into a full one.
type DigestPlan struct {
	kr   backend.KeyRevisions
	next int // endpoints of kr compared so far
	// have holds the values the snapshot already holds at their listed
	// revision; need the keys whose values must be fetched.
	have          backend.Listing
	NeedEndpoints []registry.EndpointID
	NeedNodes     []registry.NodeID
	// listed counts each service's listed endpoints; dirty are the
	// services where the snapshot may differ from the listing: a value
	// to fetch, or a different number of endpoints (one the listing
	// lacks). Every other service matched the listing exactly when
	// compared, and applying the listing would change nothing there
	// (later changes are tracked or guarded), so it need not be looked
	// at again.
	listed map[string]int
	Dirty  Scope
}

// Scope is the services a listing's application must reconcile;
// nil for all of them.
type Scope map[string]bool

func NewDigestPlan(kr backend.KeyRevisions) *DigestPlan {
	have := backend.Listing{Revision: kr.Revision,
		// Nearly every value is the snapshot's in steady state.
		Endpoints: make([]*registryv1.ServiceEndpoint, 0, len(kr.Endpoints)), EndpointRevs: make([]int64, 0, len(kr.Endpoints))}
	return &DigestPlan{kr: kr, have: have, listed: map[string]int{}, Dirty: Scope{}}
}

// CompareDigest compares up to budget of the plan's endpoints with the
// snapshot, then all of its node records, and reports whether it is done.
func (s *State) CompareDigest(p *DigestPlan, budget int) (done bool) {
	end := min(len(p.kr.Endpoints), p.next+budget)
	for _, e := range p.kr.Endpoints[p.next:end] {
		p.listed[e.ID.Service]++
		// A key with a local write unpersisted (or in flight: perhaps
		// landed, not yet recorded) is guarded: the listing cannot change
		// it, so its value is not worth fetching.
		guarded := s.queue.holds(e.ID)
		if ep := s.Get(e.ID); ep != nil && (guarded || s.epRev[e.ID] == e.ModRevision) {
			p.have.Endpoints = append(p.have.Endpoints, ep)
			p.have.EndpointRevs = append(p.have.EndpointRevs, e.ModRevision)
			continue
		}
		if guarded {
			p.Dirty[e.ID.Service] = true // a local removal the listing still shows
			continue
		}
		p.NeedEndpoints = append(p.NeedEndpoints, e.ID)
		p.Dirty[e.ID.Service] = true
	}
	p.next = end
	if p.next < len(p.kr.Endpoints) {
		return false
	}
	// Every listed endpoint of a clean service is in the snapshot, so the
	// same count means the snapshot has no other.
	for svc, m := range s.endpoints {
		if len(m) != p.listed[svc] {
			p.Dirty[svc] = true
		}
	}
	for _, n := range p.kr.Nodes {
		if rec, ok := s.nodes[n.ID]; ok && s.nodeRev[n.ID] == n.ModRevision {
			p.have.Nodes = append(p.have.Nodes, rec)
			p.have.NodeRevs = append(p.have.NodeRevs, n.ModRevision)
			continue
		}
		p.NeedNodes = append(p.NeedNodes, n.ID)
	}
	return true
}

// Needs is how many values the plan must fetch.
func (p *DigestPlan) Needs() int { return len(p.NeedEndpoints) + len(p.NeedNodes) }

// Merge adds the fetched values to the plan's own into the full listing.
func (p *DigestPlan) Merge(f backend.Listing) backend.Listing {
	l := p.have
	l.Endpoints = append(l.Endpoints, f.Endpoints...)
	l.EndpointRevs = append(l.EndpointRevs, f.EndpointRevs...)
	l.Nodes = append(l.Nodes, f.Nodes...)
	l.NodeRevs = append(l.NodeRevs, f.NodeRevs...)
	l.Skipped = f.Skipped
	return l
}
