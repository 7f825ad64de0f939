package registrar

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/registrar/internal/core"
)

// The backstop re-list reads the backend every --sync-interval to repair
// whatever the watch missed. Reading every value each time costs the
// registrar a decode of the whole registry and the backend a read of every
// value, every interval, on every replica. The snapshot knows the mod
// revision of most values it holds, so the backstop asks for keys and mod
// revisions only and fetches the values of just the keys whose revision
// differs or is not known (core.DigestPlan): in steady state, none. What it
// hands on is an ordinary full listing, applied as any listing is, so the
// repair rules are the same either way. Whether to fetch those values or
// list everything is core.BackstopListsAll's call; the pacing of the
// background work is core.BackstopPause's.

// backstopList reads the backend for the backstop re-list: keys and
// revisions, then only the values the snapshot lacks, or a full listing
// when most of them are lacking (or the revision was compacted before they
// could be read, or the store offers no keys-only listing). With a watch
// running, call it with tracking started (trackForListing).
func (r *Registrar) backstopList(ctx context.Context) (backend.Listing, listingScope, error) {
	ctx, cancel := context.WithTimeout(ctx, max(r.opts.SyncInterval, 10*time.Second))
	defer cancel()
	start := r.clock.Now()
	if r.digester == nil {
		l, err := r.listFull(ctx, start)
		return l, nil, err
	}
	var bounds []string
	if b := r.bounds.Load(); b != nil {
		bounds = *b
	}
	r.mu.Lock()
	expect := r.st.Len()
	r.mu.Unlock()
	pause := r.backstopPause(len(bounds) + expect/listingStep)
	kr, err := r.digester.ListRevisionsInParts(ctx, backend.Parts{Bounds: bounds, Between: pause, Expect: expect})
	if err != nil {
		r.metrics.syncErrors.Inc()
		return backend.Listing{}, nil, fmt.Errorf("keys-only listing: %w", err)
	}
	r.bounds.Store(partBounds(len(kr.Endpoints), func(i int) (string, error) { return kr.Endpoints[i].ID.Key() }))
	p := core.NewDigestPlan(kr)
	for done := false; !done; {
		// Steps, so that no lock hold is long (see listingStep).
		r.mu.Lock()
		done = r.st.CompareDigest(p, listingStep)
		r.mu.Unlock()
		if !done {
			if err := pause(ctx); err != nil {
				return backend.Listing{}, nil, err
			}
		}
	}
	if core.BackstopListsAll(p.Needs(), len(kr.Endpoints)+len(kr.Nodes)) {
		l, err := r.listFull(ctx, start)
		return l, nil, err
	}
	f, err := r.backend.GetAt(ctx, kr.Revision, p.NeedEndpoints, p.NeedNodes)
	if errors.Is(err, backend.ErrCompacted) {
		l, err := r.listFull(ctx, start)
		return l, nil, err
	}
	if err != nil {
		r.metrics.syncErrors.Inc()
		return backend.Listing{}, nil, fmt.Errorf("reading %d changed values at revision %d: %w", p.Needs(), kr.Revision, err)
	}
	r.metrics.syncFetched.Add(float64(p.Needs()))
	r.metrics.syncDuration.Observe(r.clock.Now().Sub(start).Seconds())
	return p.Merge(f), p.Dirty, nil
}

// backstopPartKeys is about how many keys one part of the backstop's
// keys-only listing reads.
const backstopPartKeys = 2 * listingStep

// backstopPause returns the pause between the backstop's steps, for about
// steps of them (core.BackstopPause), on the registrar's clock.
func (r *Registrar) backstopPause(steps int) func(context.Context) error {
	d := core.BackstopPause(r.opts.SyncMode == SyncPoll, r.opts.SyncInterval, steps)
	return func(ctx context.Context) error {
		if d <= 0 {
			return ctx.Err()
		}
		t := r.clock.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C():
			return nil
		}
	}
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
