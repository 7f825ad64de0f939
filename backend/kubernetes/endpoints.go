package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/dynamic"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/registry"
)

// Ordered writes.
//
// Each mutation is one API call on its key's object, conditional on the
// object's resourceVersion as the writer last saw it (an update carrying
// that resourceVersion, which the API server refuses with 409 Conflict
// when the object has moved on), or on its absence (a create, refused with
// 409 AlreadyExists). A refusal re-reads the object (a quorum GET) and
// decides by stamp again: still the newest, it swaps against what it just
// read; overtaken, it is Superseded by what the object holds. A delete
// turns the object into a tombstone, keeping identity and stamp, so the
// same conditions order it against puts; tombstones are collected
// TombstoneTTL after they were written (collect).
//
// A key and its tombstone are one object here, so the caller's two
// guesses name one resourceVersion: KeyRev when it saw the endpoint live,
// TombRev when it saw the tombstone. As on etcd, a guess that holds swaps
// without comparing stamps (the precondition proves the object is the
// version the writer saw, and a writer sends only writes newer than what
// it saw); a guess that fails costs one re-read.
//
// The mutations of one call are independent (the contract), and go out
// concurrently, MaxInFlight API calls at a time across the store; each
// lands at a revision of its own, in no particular order.

// maxOrderedRounds bounds how often one mutation re-reads and swaps again
// within a call: each round settles it unless another writer rewrote the
// object between our read and our swap, every time; what is left is
// retried by the caller later.
const maxOrderedRounds = 6

// ApplyOrdered writes muts so that, per key, the write with the newest
// stamp wins (backend.Store).
func (s *Store) ApplyOrdered(ctx context.Context, muts []backend.Mutation) ([]backend.Outcome, error) {
	ps, outs, err := backend.Prepare(muts)
	if err != nil {
		return nil, err
	}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	for i := range muts {
		if outs[i].Err != nil {
			continue
		}
		if err := s.acquire(ctx); err != nil {
			mu.Lock()
			firstErr = cmpErr(firstErr, err)
			mu.Unlock()
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer s.release()
			if err := s.applyOne(ctx, muts[i], ps[i].Key, &outs[i]); err != nil {
				mu.Lock()
				firstErr = cmpErr(firstErr, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return outs, backend.Mark(fmt.Errorf("kubernetes backend: %w", firstErr), backend.ErrUnavailable)
	}
	return outs, nil
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// applyOne settles one mutation, or returns a failure of the moment with o
// unsettled.
func (s *Store) applyOne(ctx context.Context, m backend.Mutation, key string, o *backend.Outcome) error {
	name := EndpointObjectName(key, m.ID.Service)
	stamp := m.StampOf()
	// What the object holds as far as we know: its resourceVersion (0:
	// absent) and whether that version is a live endpoint. A guess is a
	// revision the writer saw the object at, and a resourceVersion names
	// one write of one object, so a precondition that holds means the
	// object is exactly what the writer saw.
	rv, live := o.KeyRev, true
	if rv == 0 {
		rv, live = o.TombRev, false
	}
	for round := 0; round < maxOrderedRounds; round++ {
		obj, err := s.endpointObjectFor(m, key, name, stamp, rv, live)
		if err != nil {
			o.Err = fmt.Errorf("%w: %s: %v", backend.ErrInvalidMutation, key, err)
			return nil
		}
		var got *unstructured.Unstructured
		if rv == 0 {
			got, err = s.eps.Create(ctx, obj, metav1.CreateOptions{FieldManager: fieldManager})
		} else {
			got, err = s.eps.Update(ctx, obj, metav1.UpdateOptions{FieldManager: fieldManager})
		}
		switch {
		case err == nil:
			rev, perr := parseRV(got.GetResourceVersion())
			if perr != nil {
				return perr
			}
			o.Landed, o.Revision = true, rev
			if m.Endpoint != nil {
				o.KeyRev, o.TombRev = rev, 0
			} else {
				o.KeyRev, o.TombRev = 0, rev
			}
			return nil
		case apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err):
			// The object is not what we thought: read what it is.
			s.conflicts.Add(1)
		case apierrors.IsNotFound(err):
			// Updated a version that is gone (collected, or deleted by
			// hand): read, to create it or meet what replaced it.
		case permanent(err):
			o.Err = fmt.Errorf("the API server refused the write of %s: %w", key, err)
			return nil
		default:
			return fmt.Errorf("writing %s: %w", key, classify(err))
		}
		cur, err := s.eps.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			rv, live = 0, false
			o.KeyRev, o.TombRev = 0, 0
			continue
		}
		if err != nil {
			return fmt.Errorf("reading %s after a conflict: %w", key, classify(err))
		}
		var co endpointObject
		if err := fromUnstructured(cur, &co); err != nil {
			s.log.Warn("undecodable endpoint object; overwriting it", "name", name, "err", err)
		}
		if co.Spec.Fence != nil || (co.Spec.Key != "" && co.Spec.Key != key) {
			// A hash collision of two keys (or a fence under a record's
			// name): never overwrite another key's record.
			o.Err = fmt.Errorf("object %s/%s holds key %q, not %s: refusing to overwrite it", s.ns, name, co.Spec.Key, key)
			return nil
		}
		if rv, err = parseRV(co.ResourceVersion); err != nil {
			return err
		}
		var curEp *registryv1.ServiceEndpoint
		live = !co.Spec.Tombstone
		if live {
			if curEp, err = endpointOf(&co.Spec); err != nil {
				s.log.Warn("undecodable endpoint record; overwriting it", "key", key, "err", err)
			}
		}
		curStamp := fromStamp(co.Spec.Stamp)
		if live && curEp == nil {
			curStamp = nil // undecodable: older than any write
		}
		if live {
			o.KeyRev, o.TombRev = rv, 0
		} else {
			o.KeyRev, o.TombRev = 0, rv
		}
		if registry.CompareStamps(stamp, curStamp) <= 0 {
			o.Superseded, o.Current, o.CurrentStamp = true, curEp, curStamp
			return nil
		}
	}
	return nil // unsettled: another writer kept winning the race; the caller retries
}

// endpointObjectFor is the object m writes over the version rv (0:
// absent) of its key's object, live or a tombstone.
func (s *Store) endpointObjectFor(m backend.Mutation, key, name string, stamp *registryv1.WriteStamp, rv int64, live bool) (*unstructured.Unstructured, error) {
	obj := &endpointObject{
		TypeMeta:   metav1.TypeMeta{APIVersion: Group + "/" + Version, Kind: "AetherEndpoint"},
		ObjectMeta: recordMeta(name, key),
	}
	if rv != 0 {
		obj.ResourceVersion = formatRV(rv)
	}
	var err error
	if m.Endpoint != nil {
		obj.Spec, err = endpointSpecOf(key, m.Endpoint)
	} else {
		obj.Labels[LabelTombstone] = "true"
		obj.Spec, err = tombstoneSpecOf(key, m.ID, stamp, rv != 0 && live, s.now())
	}
	if err != nil {
		return nil, err
	}
	return toUnstructured(obj)
}

// decodedEndpoint is what an AetherEndpoint object is to the registry.
type decodedEndpoint struct {
	name  string
	key   string
	rev   int64
	ep    *registryv1.ServiceEndpoint // nil: a tombstone, a fence or undecodable
	tomb  bool
	fence bool
	// deletedLive: a tombstone whose write deleted a live endpoint.
	deletedLive bool
	err         error // why a record did not decode
}

func decodeEndpointObject(u *unstructured.Unstructured) decodedEndpoint {
	d := decodedEndpoint{name: u.GetName()}
	var obj endpointObject
	if err := fromUnstructured(u, &obj); err != nil {
		d.err = err
		return d
	}
	d.key = obj.Spec.Key
	if d.rev, d.err = parseRV(obj.ResourceVersion); d.err != nil {
		return d
	}
	switch {
	case obj.Spec.Fence != nil:
		d.fence = true
	case obj.Spec.Tombstone:
		d.tomb, d.deletedLive = true, obj.Spec.DeletedLive
	default:
		d.ep, d.err = endpointOf(&obj.Spec)
	}
	return d
}

// GetEndpoint reads one endpoint as the API server holds it now: a list
// of the one object by name without a resourceVersion, which the API
// server serves consistently (a quorum read of etcd's revision, and the
// watch cache waits until it has caught up to it), so at is the current
// revision and rev the object's.
func (s *Store) GetEndpoint(ctx context.Context, id registry.EndpointID) (*registryv1.ServiceEndpoint, int64, int64, error) {
	key, err := id.Key()
	if err != nil {
		return nil, 0, 0, err
	}
	if err := s.acquire(ctx); err != nil {
		return nil, 0, 0, err
	}
	defer s.release()
	name := EndpointObjectName(key, id.Service)
	l, err := s.eps.List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	if err != nil {
		return nil, 0, 0, fmt.Errorf("kubernetes backend: get %s: %w", key, classify(err))
	}
	at, err := parseRV(l.GetResourceVersion())
	if err != nil {
		return nil, 0, 0, err
	}
	for i := range l.Items {
		d := decodeEndpointObject(&l.Items[i])
		if d.key != key || d.tomb || d.fence {
			continue
		}
		if d.err != nil {
			s.log.Warn("undecodable endpoint record; treating it as absent", "key", key, "err", d.err)
			return nil, d.rev, at, nil
		}
		return d.ep, d.rev, at, nil
	}
	return nil, 0, at, nil
}

// maxListAttempts bounds how often List starts over after the revision it
// was paging at got compacted.
const maxListAttempts = 3

// maxSkipLogs bounds the per-object warnings of one listing.
const maxSkipLogs = 10

// List returns every endpoint and node record at one revision: the
// endpoints' first page is a consistent read whose resourceVersion R the
// rest follow (continue tokens pin it), and the nodes are listed at R
// exactly.
func (s *Store) List(ctx context.Context) (backend.Listing, error) {
	var err error
	for attempt := 0; attempt < maxListAttempts; attempt++ {
		var l backend.Listing
		l, err = s.list(ctx)
		if err == nil || !errors.Is(err, backend.ErrCompacted) {
			return l, err
		}
		s.log.Info("listing overtaken by compaction; starting over", "attempt", attempt+1, "err", err)
	}
	return backend.Listing{}, err
}

func (s *Store) list(ctx context.Context) (backend.Listing, error) {
	var l backend.Listing
	type rec struct {
		key string
		ep  *registryv1.ServiceEndpoint
		rev int64
	}
	var eps []rec
	skipped := 0
	rev, err := s.pages(ctx, s.eps, metav1.ListOptions{}, func(u *unstructured.Unstructured) {
		d := decodeEndpointObject(u)
		switch {
		case d.fence || d.tomb:
		case d.err != nil:
			if skipped++; skipped <= maxSkipLogs {
				s.log.Warn("undecodable endpoint object; skipped", "name", d.name, "err", d.err)
			}
		default:
			eps = append(eps, rec{d.key, d.ep, d.rev})
		}
	})
	if err != nil {
		return l, err
	}
	l.Revision, l.Skipped = rev, skipped
	if skipped > 0 {
		s.log.Warn("listing skipped undecodable endpoint objects", "count", skipped)
	}
	sort.Slice(eps, func(i, j int) bool { return eps[i].key < eps[j].key })
	for _, r := range eps {
		l.Endpoints = append(l.Endpoints, r.ep)
		l.EndpointRevs = append(l.EndpointRevs, r.rev)
	}
	l.Nodes, l.NodeRevs, err = s.listNodes(ctx, metav1.ListOptions{ResourceVersion: formatRV(rev), ResourceVersionMatch: metav1.ResourceVersionMatchExact})
	return l, err
}

// listNodes lists the node records (opts pins the revision), in key order.
func (s *Store) listNodes(ctx context.Context, opts metav1.ListOptions) ([]*registryv1.Node, []int64, error) {
	type rec struct {
		key string
		n   *registryv1.Node
		rev int64
	}
	var recs []rec
	skipped := 0
	_, err := s.pages(ctx, s.nodes, opts, func(u *unstructured.Unstructured) {
		n, _, rev, err := NodeOf(u)
		switch {
		case errors.Is(err, errFence):
		case err != nil:
			if skipped++; skipped <= maxSkipLogs {
				s.log.Warn("undecodable node object; skipped", "name", u.GetName(), "err", err)
			}
		default:
			key, _ := registry.NodeIDOf(n).Key()
			recs = append(recs, rec{key, n, rev})
		}
	})
	if err != nil {
		return nil, nil, err
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].key < recs[j].key })
	var nodes []*registryv1.Node
	var revs []int64
	for _, r := range recs {
		nodes = append(nodes, r.n)
		revs = append(revs, r.rev)
	}
	return nodes, revs, nil
}

// pages reads a listing page by page (PageSize objects each), all at the
// first page's resourceVersion, which it returns; each object goes to fn.
// A continue token the API server no longer honours (410: the revision
// was compacted while paging) is backend.ErrCompacted.
func (s *Store) pages(ctx context.Context, r dynamic.ResourceInterface, opts metav1.ListOptions, fn func(*unstructured.Unstructured)) (int64, error) {
	opts.Limit = s.pageSize
	var rev int64
	for page := 0; ; page++ {
		if err := s.acquire(ctx); err != nil {
			return 0, err
		}
		l, err := r.List(ctx, opts)
		s.release()
		if err != nil {
			return 0, fmt.Errorf("kubernetes backend: listing page %d: %w", page, classify(err))
		}
		if page == 0 {
			if rev, err = parseRV(l.GetResourceVersion()); err != nil {
				return 0, err
			}
		}
		for i := range l.Items {
			fn(&l.Items[i])
		}
		if s.afterPage != nil {
			s.afterPage(ctx, page)
		}
		if l.GetContinue() == "" {
			return rev, nil
		}
		opts = metav1.ListOptions{Limit: s.pageSize, Continue: l.GetContinue(), LabelSelector: opts.LabelSelector}
	}
}

// getAtChunk bounds the key hashes of one label selector, keeping the
// request line short.
const getAtChunk = 100

// GetAt reads the given endpoints and node records as they were at rev:
// lists at exactly rev (resourceVersionMatch=Exact) selecting the objects
// by their key-hash label, a hundred at a time.
func (s *Store) GetAt(ctx context.Context, rev int64, eps []registry.EndpointID, nodes []registry.NodeID) (backend.Listing, error) {
	l := backend.Listing{Revision: rev}
	if len(eps)+len(nodes) == 0 {
		return l, nil
	}
	epKeys := make([]string, len(eps))
	for i, id := range eps {
		k, err := id.Key()
		if err != nil {
			return l, err
		}
		epKeys[i] = k
	}
	found := map[string]decodedEndpoint{}
	err := s.byHashAt(ctx, s.eps, rev, epKeys, func(u *unstructured.Unstructured) {
		if d := decodeEndpointObject(u); d.ep != nil {
			found[d.key] = d
		} else if d.err != nil {
			s.log.Warn("undecodable endpoint object; treating it as absent", "name", d.name, "err", d.err)
		}
	})
	if err != nil {
		return backend.Listing{}, err
	}
	for _, k := range epKeys {
		if d, ok := found[k]; ok {
			l.Endpoints = append(l.Endpoints, d.ep)
			l.EndpointRevs = append(l.EndpointRevs, d.rev)
		}
	}
	nodeKeys := make([]string, len(nodes))
	for i, id := range nodes {
		k, err := id.Key()
		if err != nil {
			return backend.Listing{}, err
		}
		nodeKeys[i] = k
	}
	type nrec struct {
		n   *registryv1.Node
		rev int64
	}
	foundN := map[string]nrec{}
	err = s.byHashAt(ctx, s.nodes, rev, nodeKeys, func(u *unstructured.Unstructured) {
		n, _, r, err := NodeOf(u)
		if err == nil {
			k, _ := registry.NodeIDOf(n).Key()
			foundN[k] = nrec{n, r}
		}
	})
	if err != nil {
		return backend.Listing{}, err
	}
	for _, k := range nodeKeys {
		if r, ok := foundN[k]; ok {
			l.Nodes = append(l.Nodes, r.n)
			l.NodeRevs = append(l.NodeRevs, r.rev)
		}
	}
	return l, nil
}

// byHashAt lists the objects of the given keys at exactly rev.
func (s *Store) byHashAt(ctx context.Context, r dynamic.ResourceInterface, rev int64, keys []string, fn func(*unstructured.Unstructured)) error {
	for lo := 0; lo < len(keys); lo += getAtChunk {
		var hashes []string
		for _, k := range keys[lo:min(lo+getAtChunk, len(keys))] {
			hashes = append(hashes, keyHash(k))
		}
		req, err := labels.NewRequirement(LabelKeyHash, selection.In, hashes)
		if err != nil {
			return fmt.Errorf("kubernetes backend: selector: %w", err)
		}
		opts := metav1.ListOptions{
			LabelSelector:        labels.NewSelector().Add(*req).String(),
			ResourceVersion:      formatRV(rev),
			ResourceVersionMatch: metav1.ResourceVersionMatchExact,
		}
		if _, err := s.pages(ctx, r, opts, fn); err != nil {
			return fmt.Errorf("reading at revision %d: %w", rev, err)
		}
	}
	return nil
}

// Tombstone collection.

// collectLoop collects tombstones every interval until ctx ends.
func (s *Store) collectLoop(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if n, err := s.collect(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("collecting tombstones", "err", err)
		} else if n > 0 {
			s.log.Debug("collected tombstones", "count", n)
		}
	}
}

// collect deletes the tombstones written more than the tombstone TTL ago,
// each conditional on its resourceVersion, so that a put which revived the
// key meanwhile is never deleted; every replica may collect, and losing
// the race to another is harmless. It also removes watch fences not
// written for as long (those of replicas that are gone). It returns how
// many objects it deleted.
func (s *Store) collect(ctx context.Context) (int, error) {
	cutoff := s.now().Add(-s.tombTTL)
	type victim struct {
		r    dynamic.ResourceInterface
		name string
		rv   string
	}
	var victims []victim
	_, err := s.pages(ctx, s.eps, metav1.ListOptions{LabelSelector: LabelTombstone + "=true"}, func(u *unstructured.Unstructured) {
		at, _, _ := unstructured.NestedString(u.Object, "spec", "deletedAt")
		if t, err := time.Parse(time.RFC3339Nano, at); err == nil && t.Before(cutoff) {
			victims = append(victims, victim{s.eps, u.GetName(), u.GetResourceVersion()})
		}
	})
	if err != nil {
		return 0, err
	}
	for _, r := range []dynamic.ResourceInterface{s.eps, s.nodes} {
		_, err := s.pages(ctx, r, metav1.ListOptions{LabelSelector: LabelFence}, func(u *unstructured.Unstructured) {
			at := u.GetAnnotations()[annotationFencedAt]
			if t, err := time.Parse(time.RFC3339Nano, at); err == nil && t.Before(cutoff) {
				victims = append(victims, victim{r, u.GetName(), u.GetResourceVersion()})
			}
		})
		if err != nil {
			return 0, err
		}
	}
	n := 0
	for _, v := range victims {
		rv := v.rv
		if err := s.acquire(ctx); err != nil {
			return n, err
		}
		err := v.r.Delete(ctx, v.name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}})
		s.release()
		switch {
		case err == nil:
			n++
		case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		default:
			return n, fmt.Errorf("deleting %s: %w", v.name, classify(err))
		}
	}
	return n, nil
}
