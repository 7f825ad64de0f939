package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/tools/cache"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/registry"
)

// Node records (AetherNode objects) under Leases (leases.go), and the
// reaper that ends lapsed leases.

type leaseClient = coordinationv1client.LeaseInterface

func metaAccessor(o runtime.Object) (metav1.Object, error) { return meta.Accessor(o) }

// Reaper timing. A lapsed lease is ended within about reapEvery of the
// rule saying so (plus the lag of this replica's lease watch); the sweep
// for records whose lease is missing altogether (left by a revoker or
// reaper that stopped between deleting the lease and its records, or put
// by a PutNode that raced a reaper) runs less often, as it lists records.
const (
	reapEvery  = 500 * time.Millisecond
	sweepEvery = 30 * time.Second
)

// PutNode writes n's AetherNode under a live lease: the record names the
// Lease (spec.lease, and the aether.dev/lease label its reaper lists by).
// A lease that is missing or lapsed refuses with ErrLeaseNotFound. A
// record put while a reaper ends its lease may outlive the lease by one
// sweep (it is dead by the rule meanwhile, and no reader is told
// otherwise: the lease it names is gone).
func (s *Store) PutNode(ctx context.Context, n *registryv1.Node, lease int64) (int64, error) {
	id := registry.NodeIDOf(n)
	key, err := id.Key()
	if err != nil {
		return 0, fmt.Errorf("kubernetes: put node: %w", err)
	}
	l, err := s.liveLease(ctx, lease, "put node "+key)
	if err != nil {
		return 0, err
	}
	if h := l.Spec.HolderIdentity; h == nil || *h != key {
		// The Lease shows whose it is (kubectl get leases). Written with
		// l's resourceVersion, it also proves the lease was still there
		// after the liveness read.
		l.Spec.HolderIdentity = &key
		if _, err := s.leases().Update(ctx, l, metav1.UpdateOptions{}); err != nil {
			if apierrors.IsNotFound(err) {
				return 0, fmt.Errorf("kubernetes: put node %s: lease %x ended meanwhile: %w", key, lease, backend.ErrLeaseNotFound)
			}
			if !apierrors.IsConflict(err) { // a renewal in between: the holder waits for the next put
				return 0, fmt.Errorf("kubernetes: put node %s: lease %x: %w", key, lease, classify(err))
			}
		}
	}
	obj, err := NodeObject(n, lease)
	if err != nil {
		return 0, fmt.Errorf("kubernetes: put node %s: %w: %v", key, backend.ErrInvalidMutation, err)
	}
	nodes := s.dyn.Resource(NodesResource).Namespace(s.ns)
	for attempt := 0; ; attempt++ {
		cur, err := nodes.Get(ctx, obj.GetName(), metav1.GetOptions{})
		var out *unstructured.Unstructured
		switch {
		case apierrors.IsNotFound(err):
			obj.SetResourceVersion("")
			out, err = nodes.Create(ctx, obj, metav1.CreateOptions{})
		case err != nil:
			return 0, fmt.Errorf("kubernetes: put node %s: %w", key, classify(err))
		default:
			obj.SetResourceVersion(cur.GetResourceVersion())
			out, err = nodes.Update(ctx, obj, metav1.UpdateOptions{})
		}
		switch {
		case err == nil:
			rev, perr := strconv.ParseInt(out.GetResourceVersion(), 10, 64)
			if perr != nil {
				return 0, fmt.Errorf("kubernetes: put node %s: resourceVersion %q: %w", key, out.GetResourceVersion(), perr)
			}
			return rev, nil
		case (apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) || apierrors.IsNotFound(err)) && attempt < 4:
			continue // another replica's put or a reaper's delete in between: read again
		case apierrors.IsInvalid(err):
			return 0, fmt.Errorf("kubernetes: put node %s: %w: %v", key, backend.ErrInvalidMutation, err)
		default:
			return 0, fmt.Errorf("kubernetes: put node %s: %w", key, classify(err))
		}
	}
}

// nodesOf lists the node records under lease.
func (s *Store) nodesOf(ctx context.Context, lease int64) ([]unstructured.Unstructured, error) {
	list, err := s.dyn.Resource(NodesResource).Namespace(s.ns).List(ctx, metav1.ListOptions{LabelSelector: labelLease + "=" + leaseHex(lease)})
	if err != nil {
		return nil, fmt.Errorf("kubernetes: node records of lease %x: %w", lease, classify(err))
	}
	return list.Items, nil
}

// deleteNodesOf deletes the node records under lease, each preconditioned
// on the version listed (a record put again since, under a new lease,
// stays), and returns the revision of the last deletion (0: none). The
// records in before (listed earlier) that the list now lacks were deleted
// by another in between (a reaper); their deletions count too.
func (s *Store) deleteNodesOf(ctx context.Context, lease int64, before []unstructured.Unstructured) (int64, error) {
	now, err := s.nodesOf(ctx, lease)
	if err != nil {
		return 0, err
	}
	listed := make(map[string]bool, len(now))
	for _, o := range now {
		listed[o.GetName()] = true
	}
	for _, o := range before {
		if !listed[o.GetName()] {
			now = append(now, o)
		}
	}
	var last int64
	for i := range now {
		rev, err := s.deleteNode(ctx, &now[i])
		if err != nil {
			return last, err
		}
		last = max(last, rev)
	}
	return last, nil
}

// deleteNode deletes one record at the version given and returns the
// revision of its deletion, or of another's deletion of that version in
// between (as far as the watch could tell; else 0); 0 and no error when
// it changed meanwhile.
func (s *Store) deleteNode(ctx context.Context, o *unstructured.Unstructured) (int64, error) {
	nodes := s.dyn.Resource(NodesResource).Namespace(s.ns)
	rv, uid := o.GetResourceVersion(), o.GetUID()
	rev, err := s.deleteConfirmed(ctx, nodeWatcher{s}, o.GetName(), rv, func(ctx context.Context) error {
		return nodes.Delete(ctx, o.GetName(), metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv, UID: &uid}})
	})
	switch {
	case apierrors.IsNotFound(err):
		return rev, nil
	case apierrors.IsConflict(err):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("kubernetes: delete node record %s: %w", o.GetName(), classify(err))
	}
	return rev, nil
}

type nodeWatcher struct{ s *Store }

func (w nodeWatcher) watchOne(ctx context.Context, name, fromRV string) (watch.Interface, error) {
	return w.s.dyn.Resource(NodesResource).Namespace(w.s.ns).Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", name).String(),
		ResourceVersion: fromRV,
	})
}

// reaper ends lapsed leases. Every replica runs one; racing reapers are
// harmless (each delete is preconditioned, and a second finds nothing).
// It judges leases from an informer's cache of the backend's Leases (one
// watch per replica, not a list per pass); a cache that lags only makes a
// judgement late, or its delete's precondition stale, which fails.
type reaper struct {
	s        *Store
	informer cache.SharedIndexInformer
	stop     context.CancelFunc
	wg       sync.WaitGroup

	mu    sync.Mutex
	ended int64 // leases ended by this replica's reaper
	swept int64 // orphaned records removed
}

// counts is how many leases this reaper ended and orphaned records it
// removed.
func (r *reaper) counts() (ended, swept int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ended, r.swept
}

// startReaper starts s's reaper; Close stops it (stopReaper).
func (s *Store) startReaper() {
	ctx, cancel := context.WithCancel(context.Background())
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = LabelManagedBy + "=" + managedBy
			return s.leases().List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = LabelManagedBy + "=" + managedBy
			return s.leases().Watch(ctx, o)
		},
	}
	r := &reaper{
		s:        s,
		informer: cache.NewSharedIndexInformer(lw, &coordinationv1.Lease{}, 0, cache.Indexers{}),
		stop:     cancel,
	}
	s.reaper = r
	r.wg.Add(2)
	go func() { defer r.wg.Done(); r.informer.RunWithContext(ctx) }()
	go func() { defer r.wg.Done(); r.run(ctx) }()
}

func (s *Store) stopReaper() {
	if s.reaper == nil {
		return
	}
	s.reaper.stop()
	s.reaper.wg.Wait()
}

func (r *reaper) run(ctx context.Context) {
	if !cache.WaitForCacheSync(ctx.Done(), r.informer.HasSynced) {
		return
	}
	tick := time.NewTicker(reapEvery)
	defer tick.Stop()
	lastSweep := time.Time{}
	for {
		r.pass(ctx)
		if time.Since(lastSweep) >= sweepEvery {
			if err := r.sweep(ctx); err != nil && ctx.Err() == nil {
				r.s.log.Warn("sweeping node records of ended leases", "err", err)
			}
			lastSweep = time.Now()
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return
		}
	}
}

// pass ends every cached lease the rule says has lapsed.
func (r *reaper) pass(ctx context.Context) {
	for _, o := range r.informer.GetStore().List() {
		l, ok := o.(*coordinationv1.Lease)
		if !ok || leaseIDOf(l.Name) == 0 || !r.s.lapsed(l) {
			continue
		}
		switch _, err := r.s.endLease(ctx, l.DeepCopy(), true); {
		case err == nil:
			r.mu.Lock()
			r.ended++
			r.mu.Unlock()
			r.s.log.Debug("ended a lapsed lease", "lease", l.Name, "renewed", l.Spec.RenewTime, "ttl_seconds", *l.Spec.LeaseDurationSeconds)
		case errors.Is(err, errRenewedMeanwhile):
		case ctx.Err() != nil:
			return
		default:
			r.s.log.Warn("ending a lapsed lease", "lease", l.Name, "err", err)
		}
	}
}

// sweep deletes node records whose lease no longer exists. It lists the
// records before reading leases, so a lease granted after the listing
// cannot be mistaken for a missing one, and it confirms a missing lease
// with a read of its own before deleting.
func (r *reaper) sweep(ctx context.Context) error {
	nodes := r.s.dyn.Resource(NodesResource).Namespace(r.s.ns)
	opts := metav1.ListOptions{LabelSelector: labelLease, Limit: 500}
	for {
		list, err := nodes.List(ctx, opts)
		if err != nil {
			return fmt.Errorf("list node records: %w", classify(err))
		}
		for i := range list.Items {
			o := &list.Items[i]
			lease := leaseIDOf(o.GetLabels()[labelLease])
			if _, cached, _ := r.informer.GetStore().GetByKey(r.s.ns + "/" + leaseName(lease)); cached {
				continue // the pass judges it
			}
			_, err := r.s.leases().Get(ctx, leaseName(lease), metav1.GetOptions{})
			if !apierrors.IsNotFound(err) {
				continue // there after all (or unknown: next sweep)
			}
			if rev, err := r.s.deleteNode(ctx, o); err != nil {
				return err
			} else if rev > 0 {
				r.mu.Lock()
				r.swept++
				r.mu.Unlock()
				r.s.log.Info("removed a node record whose lease was gone", "record", o.GetName(), "lease", leaseName(lease))
			}
		}
		if list.GetContinue() == "" {
			return nil
		}
		opts.Continue = list.GetContinue()
	}
}
