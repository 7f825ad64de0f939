package registrar

import (
	"context"
	"errors"
	"fmt"
	"time"

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
// most values it holds (state.epRev), so the backstop asks etcd for keys and
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
// half the interval (backstopPause): the keys are read in parts bounded by
// keys of the last listing (backend.Parts), all at one revision, and
// compared a step at a time, with pauses in between. Done at once, a
// check of every key is one burst of CPU in etcd and in the registrar, and
// on a busy machine every write and watch event waits behind it: the
// fan-out scenario's cross-replica tail (docs/benchmarks.md) is where that
// shows.

// fullFetchRatio: when more than one key in this many needs its value, a
// full listing is cheaper than fetching them a Txn at a time.
const fullFetchRatio = 8

// fetchAlways is how many values are fetched key by key whatever the
// ratio: two Txns, cheaper than any full listing.
const fetchAlways = 256

// digestPlan turns a keys-only listing into a full one.
type digestPlan struct {
	kr   backend.KeyRevisions
	next int // endpoints of kr compared so far
	// have holds the values the snapshot already holds at their listed
	// revision; need the keys whose values must be fetched.
	have     backend.Listing
	needEPs  []registry.EndpointID
	needNode []registry.NodeID
	// listed counts each service's listed endpoints; dirty are the
	// services where the snapshot may differ from the listing: a value
	// to fetch, or a different number of endpoints (one the listing
	// lacks). Every other service matched the listing exactly when
	// compared, and applying the listing would change nothing there
	// (later changes are tracked or guarded), so it need not be looked
	// at again.
	listed map[string]int
	dirty  listingScope
}

// listingScope is the services a listing's application must reconcile;
// nil for all of them.
type listingScope map[string]bool

func newDigestPlan(kr backend.KeyRevisions) *digestPlan {
	have := backend.Listing{Revision: kr.Revision,
		// Nearly every value is the snapshot's in steady state.
		Endpoints: make([]*registryv1.ServiceEndpoint, 0, len(kr.Endpoints)), EndpointRevs: make([]int64, 0, len(kr.Endpoints))}
	return &digestPlan{kr: kr, have: have, listed: map[string]int{}, dirty: listingScope{}}
}

// compareDigest compares up to budget of the plan's endpoints with the
// snapshot, then all of its node records, and reports whether it is done.
func (s *state) compareDigest(p *digestPlan, budget int) (done bool) {
	end := min(len(p.kr.Endpoints), p.next+budget)
	for _, e := range p.kr.Endpoints[p.next:end] {
		p.listed[e.ID.Service]++
		// A key with a local write unpersisted (or in flight: perhaps
		// landed, not yet recorded) is guarded: the listing cannot change
		// it, so its value is not worth fetching.
		guarded := s.queue.holds(e.ID)
		if ep := s.get(e.ID); ep != nil && (guarded || s.epRev[e.ID] == e.ModRevision) {
			p.have.Endpoints = append(p.have.Endpoints, ep)
			p.have.EndpointRevs = append(p.have.EndpointRevs, e.ModRevision)
			continue
		}
		if guarded {
			p.dirty[e.ID.Service] = true // a local removal the listing still shows
			continue
		}
		p.needEPs = append(p.needEPs, e.ID)
		p.dirty[e.ID.Service] = true
	}
	p.next = end
	if p.next < len(p.kr.Endpoints) {
		return false
	}
	// Every listed endpoint of a clean service is in the snapshot, so the
	// same count means the snapshot has no other.
	for svc, m := range s.endpoints {
		if len(m) != p.listed[svc] {
			p.dirty[svc] = true
		}
	}
	for _, n := range p.kr.Nodes {
		if rec, ok := s.nodes[n.ID]; ok && s.nodeRev[n.ID] == n.ModRevision {
			p.have.Nodes = append(p.have.Nodes, rec)
			p.have.NodeRevs = append(p.have.NodeRevs, n.ModRevision)
			continue
		}
		p.needNode = append(p.needNode, n.ID)
	}
	return true
}

// needs is how many values the plan must fetch.
func (p *digestPlan) needs() int { return len(p.needEPs) + len(p.needNode) }

// merge adds the fetched values to the plan's own into the full listing.
func (p *digestPlan) merge(f backend.Listing) backend.Listing {
	l := p.have
	l.Endpoints = append(l.Endpoints, f.Endpoints...)
	l.EndpointRevs = append(l.EndpointRevs, f.EndpointRevs...)
	l.Nodes = append(l.Nodes, f.Nodes...)
	l.NodeRevs = append(l.NodeRevs, f.NodeRevs...)
	l.Skipped = f.Skipped
	return l
}

// backstopList reads the backend for the backstop re-list: keys and
// revisions, then only the values the snapshot lacks, or a full listing
// when most of them are lacking (or the revision was compacted before they
// could be read, or the store offers no keys-only listing). With a watch
// running, call it with tracking started (trackForListing).
func (r *Registrar) backstopList(ctx context.Context) (backend.Listing, listingScope, error) {
	ctx, cancel := context.WithTimeout(ctx, max(r.opts.SyncInterval, 10*time.Second))
	defer cancel()
	start := time.Now()
	if r.digester == nil {
		l, err := r.listFull(ctx, start)
		return l, nil, err
	}
	var bounds []string
	if b := r.bounds.Load(); b != nil {
		bounds = *b
	}
	r.mu.Lock()
	expect := r.st.len()
	r.mu.Unlock()
	pause := r.backstopPause(len(bounds) + expect/listingStep)
	kr, err := r.digester.ListRevisionsInParts(ctx, backend.Parts{Bounds: bounds, Between: pause, Expect: expect})
	if err != nil {
		r.metrics.syncErrors.Inc()
		return backend.Listing{}, nil, fmt.Errorf("keys-only listing: %w", err)
	}
	r.bounds.Store(partBounds(len(kr.Endpoints), func(i int) (string, error) { return kr.Endpoints[i].ID.Key() }))
	p := newDigestPlan(kr)
	for done := false; !done; {
		// Steps, so that no lock hold is long (see listingStep).
		r.mu.Lock()
		done = r.st.compareDigest(p, listingStep)
		r.mu.Unlock()
		if !done {
			if err := pause(ctx); err != nil {
				return backend.Listing{}, nil, err
			}
		}
	}
	total := len(kr.Endpoints) + len(kr.Nodes)
	if p.needs()*fullFetchRatio > total && p.needs() > fetchAlways {
		l, err := r.listFull(ctx, start)
		return l, nil, err
	}
	f, err := r.backend.GetAt(ctx, kr.Revision, p.needEPs, p.needNode)
	if errors.Is(err, backend.ErrCompacted) {
		l, err := r.listFull(ctx, start)
		return l, nil, err
	}
	if err != nil {
		r.metrics.syncErrors.Inc()
		return backend.Listing{}, nil, fmt.Errorf("reading %d changed values at revision %d: %w", p.needs(), kr.Revision, err)
	}
	r.metrics.syncFetched.Add(float64(p.needs()))
	r.metrics.syncDuration.Observe(time.Since(start).Seconds())
	return p.merge(f), p.dirty, nil
}

// backstopPartKeys is about how many keys one part of the backstop's
// keys-only listing reads.
const backstopPartKeys = 2 * listingStep

// backstopSpread is the share of --sync-interval over which the backstop
// spreads its work when a watch is running, and maxBackstopPause the
// longest pause between two of its steps.
const (
	backstopSpread   = 2
	maxBackstopPause = 100 * time.Millisecond
)

// backstopPause returns the pause between the backstop's steps (parts of
// its listing, steps of its comparison), for about steps of them. With a
// watch running the backstop is a check in the background, so its work is
// spread over half the interval: done at once, a check of 100k keys is
// a burst of CPU in etcd and here that every write and watch event queues
// behind. Polling (SyncPoll) learns of every change this way, so it does
// not wait.
func (r *Registrar) backstopPause(steps int) func(context.Context) error {
	d := backstopPauseFor(r.opts.SyncMode, r.opts.SyncInterval, steps)
	return func(ctx context.Context) error {
		if d <= 0 {
			return ctx.Err()
		}
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return nil
		}
	}
}

// backstopPauseFor is the pause between steps (see backstopPause).
func backstopPauseFor(mode string, interval time.Duration, steps int) time.Duration {
	if mode == SyncPoll || steps <= 0 {
		return 0
	}
	return min(interval/backstopSpread/time.Duration(steps), maxBackstopPause)
}

// partBounds picks the next keys-only listing's part bounds from a
// listing of n endpoints in key order: the key of every
// backstopPartKeys-th.
func partBounds(n int, key func(i int) (string, error)) *[]string {
	var out []string
	for i := backstopPartKeys; i < n; i += backstopPartKeys {
		if k, err := key(i); err == nil {
			out = append(out, k)
		}
	}
	return &out
}

// listAll is a full listing, to be reconciled everywhere.
func (r *Registrar) listAll(ctx context.Context) (backend.Listing, listingScope, error) {
	l, err := r.list(ctx)
	return l, nil, err
}
