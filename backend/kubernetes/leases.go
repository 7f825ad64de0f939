package kubernetes

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/aethermesh/aether/backend"
)

// Node liveness on coordination.k8s.io/v1 Leases. The API server never
// deletes a Lease by itself, so the backend does what etcd's leases do:
//
//   - A lease is a Lease object named aether-lease-<id in hex>: the id
//     alone (what a node record carries, and what any replica renews)
//     names it. spec.renewTime is when it was last renewed, in the API
//     server's time as serverClock estimates it (the latest the server's
//     clock can read), spec.leaseDurationSeconds its TTL in whole seconds.
//   - A lease has lapsed when renewTime + leaseDurationSeconds is before
//     the API server's current time, judged on serverClock's earliest
//     estimate of that time: the one rule every replica applies, on the
//     server's clock read through the Date headers of its responses, never
//     on a replica's own wall clock. Both estimates err towards a longer
//     life, so a skewed or just-started replica may end a lease late, but
//     never early. KeepAliveOnce, LeaseTTL, PutNode and PutMember treat a
//     lapsed lease as gone (backend.ErrLeaseNotFound): a lapsed lease is
//     never revived, since another replica may already be ending it.
//   - Every replica's reaper (nodes.go) ends the leases it judges lapsed
//     with a delete preconditioned on the resourceVersion it judged: a
//     renewal that landed in between changed it, and wins. Ending a lease
//     deletes its node records, which the record watch reports like any
//     other delete.

const (
	leaseNamePrefix = "aether-lease-"
	// labelLease on a node record names the lease (hex id) it lives under.
	labelLease = "aether.dev/lease"
	// holderGranted is a lease's holderIdentity until a node record is put
	// under it (PutNode makes it the node's key).
	holderGranted = "aether"
)

func leaseName(id int64) string { return leaseNamePrefix + strconv.FormatUint(uint64(id), 16) }

func leaseHex(id int64) string { return strconv.FormatUint(uint64(id), 16) }

// leaseIDOf is the lease id a Lease name or lease label stands for, 0 if
// it names none.
func leaseIDOf(s string) int64 {
	id, err := strconv.ParseUint(strings.TrimPrefix(s, leaseNamePrefix), 16, 63)
	if err != nil {
		return 0
	}
	return int64(id)
}

// RequiredRules is the RBAC the backend needs, exactly the verbs it uses
// (TestRequiredRulesExact records every request the backend makes through
// the conformance suite and compares): in its namespace, its records
// (AetherEndpoints, AetherNodes) read, listed, watched, created, updated
// with resourceVersion preconditions, patched (server-side apply of the
// watch fences) and deleted (tombstone collection, ended leases), and the
// Leases of node liveness and membership likewise but never patched; and,
// cluster-scoped (a ClusterRole's rule), its two CRDs read, to check they
// are installed. --kubernetes-install-crds needs InstallCRDRules as well.
func RequiredRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{
			APIGroups: []string{Group},
			Resources: []string{EndpointsResource.Resource, NodesResource.Resource},
			Verbs:     []string{"get", "list", "watch", "create", "update", "patch", "delete"},
		},
		{
			APIGroups: []string{"coordination.k8s.io"},
			Resources: []string{"leases"},
			Verbs:     []string{"get", "list", "watch", "create", "update", "delete"},
		},
		{
			APIGroups:     []string{"apiextensions.k8s.io"},
			Resources:     []string{"customresourcedefinitions"},
			ResourceNames: []string{EndpointsResource.Resource + "." + Group, NodesResource.Resource + "." + Group},
			Verbs:         []string{"get"},
		},
	}
}

// InstallCRDRules is the extra (cluster-scoped) RBAC of
// --kubernetes-install-crds: the CRDs are installed by server-side apply,
// a patch, which creates them when absent (authorized as create, which
// RBAC cannot limit to names).
func InstallCRDRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{
			APIGroups: []string{"apiextensions.k8s.io"},
			Resources: []string{"customresourcedefinitions"},
			Verbs:     []string{"create"},
		},
		{
			APIGroups:     []string{"apiextensions.k8s.io"},
			Resources:     []string{"customresourcedefinitions"},
			ResourceNames: []string{EndpointsResource.Resource + "." + Group, NodesResource.Resource + "." + Group},
			Verbs:         []string{"patch"},
		},
	}
}

// leaseSeconds is ttl rounded up to whole seconds (Lease durations are),
// at least 1.
func leaseSeconds(ttl time.Duration) int32 {
	s := math.Ceil(ttl.Seconds())
	switch {
	case s < 1:
		return 1
	case s > math.MaxInt32:
		return math.MaxInt32
	}
	return int32(s)
}

// lapsed is the rule: renewTime + duration is before the earliest the API
// server's clock can read now.
func (s *Store) lapsed(l *coordinationv1.Lease) bool {
	if l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
		return true // not one of ours, or damaged: nothing keeps it alive
	}
	earliest, _ := s.pacer.clock.now()
	return l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second).Before(earliest)
}

func granted(l *coordinationv1.Lease) time.Duration {
	if l.Spec.LeaseDurationSeconds == nil {
		return 0
	}
	return time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
}

// renewStamp is the renewTime a renewal writes: the latest the server's
// clock can read, so that the lease lives at least its TTL on that clock.
func (s *Store) renewStamp() *metav1.MicroTime {
	_, latest := s.pacer.clock.now()
	return &metav1.MicroTime{Time: latest}
}

func (s *Store) leases() leaseClient { return s.cs.CoordinationV1().Leases(s.ns) }

// liveLease reads a lease, ErrLeaseNotFound when it is missing or lapsed.
func (s *Store) liveLease(ctx context.Context, lease int64, what string) (*coordinationv1.Lease, error) {
	if lease <= 0 {
		return nil, fmt.Errorf("kubernetes: %s: lease %x: %w", what, lease, backend.ErrLeaseNotFound)
	}
	l, err := s.leases().Get(ctx, leaseName(lease), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("kubernetes: %s: lease %x: %w", what, lease, backend.ErrLeaseNotFound)
	case err != nil:
		return nil, fmt.Errorf("kubernetes: %s: lease %x: %w", what, lease, classify(err))
	case s.lapsed(l):
		return nil, fmt.Errorf("kubernetes: %s: lease %x lapsed at %s: %w", what, lease,
			l.Spec.RenewTime.Add(granted(l)).UTC().Format(time.RFC3339Nano), backend.ErrLeaseNotFound)
	}
	return l, nil
}

// GrantLease creates a Lease of ttl rounded up to whole seconds.
func (s *Store) GrantLease(ctx context.Context, ttl time.Duration) (int64, error) {
	secs := leaseSeconds(ttl)
	for range 3 {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			return 0, fmt.Errorf("kubernetes: lease id: %w", err)
		}
		id := int64(binary.BigEndian.Uint64(b[:])&(1<<62-1)) + 1
		now := s.renewStamp()
		holder := holderGranted
		l := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{
				Name:   leaseName(id),
				Labels: map[string]string{LabelManagedBy: managedBy},
			},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity:       &holder,
				LeaseDurationSeconds: &secs,
				AcquireTime:          now,
				RenewTime:            now,
			},
		}
		_, err := s.leases().Create(ctx, l, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			continue // one in 2^62: draw again
		}
		if err != nil {
			return 0, fmt.Errorf("kubernetes: grant lease: %w", classify(err))
		}
		return id, nil
	}
	return 0, errors.New("kubernetes: grant lease: three random lease ids taken")
}

// KeepAliveOnce renews a live lease: renewTime moved to now, written with
// the resourceVersion read as precondition, so that it and a reaper's
// delete cannot both succeed. The first attempt takes the Lease from the
// reaper's cache instead of a read, halving a heartbeat's API calls: a
// cached version is never livelier than the Lease itself (renewals only
// move renewTime on), a stale one fails the precondition, and one that was
// deleted fails with NotFound, so only a cache that shows the lease live
// is trusted, and only to try the write.
func (s *Store) KeepAliveOnce(ctx context.Context, lease int64) (time.Duration, error) {
	for attempt := 0; ; attempt++ {
		var l *coordinationv1.Lease
		if attempt == 0 {
			l = s.cachedLease(lease)
		}
		if l == nil {
			var err error
			if l, err = s.liveLease(ctx, lease, "keep lease alive"); err != nil {
				return 0, err
			}
		}
		l.Spec.RenewTime = s.renewStamp()
		_, err := s.leases().Update(ctx, l, metav1.UpdateOptions{})
		switch {
		case err == nil:
			return granted(l), nil
		case apierrors.IsNotFound(err):
			return 0, fmt.Errorf("kubernetes: keep lease %x alive: ended meanwhile: %w", lease, backend.ErrLeaseNotFound)
		case apierrors.IsConflict(err) && attempt < 4:
			// Renewed by another replica, or a member record put on
			// it, since the read: read again.
			continue
		default:
			return 0, fmt.Errorf("kubernetes: keep lease %x alive: %w", lease, classify(err))
		}
	}
}

// cachedLease is a copy of the reaper's cached Lease of lease when the
// cache shows it live, else nil.
func (s *Store) cachedLease(lease int64) *coordinationv1.Lease {
	if s.reaper == nil || lease <= 0 {
		return nil
	}
	o, ok, err := s.reaper.informer.GetStore().GetByKey(s.ns + "/" + leaseName(lease))
	if err != nil || !ok {
		return nil
	}
	l, ok := o.(*coordinationv1.Lease)
	if !ok || s.lapsed(l) {
		return nil
	}
	return l.DeepCopy()
}

// LeaseTTL reads a lease: what is left of it on the server's clock, and
// its TTL.
func (s *Store) LeaseTTL(ctx context.Context, lease int64) (time.Duration, time.Duration, error) {
	l, err := s.liveLease(ctx, lease, "lease TTL")
	if err != nil {
		return 0, 0, err
	}
	g := granted(l)
	_, latest := s.pacer.clock.now()
	left := min(l.Spec.RenewTime.Add(g).Sub(latest), g)
	// Not lapsed by the rule (judged on the earliest estimate), so some of
	// it is left even when the latest estimate says otherwise.
	left = max(left, time.Millisecond)
	return left, g, nil
}

// RevokeLease deletes a lease and then the node records under it, and
// returns the revision of the last deletion.
func (s *Store) RevokeLease(ctx context.Context, lease int64) (int64, error) {
	l, err := s.leases().Get(ctx, leaseName(lease), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		// Gone already; records a crashed revoker or reaper left behind
		// still go (they are dead by the rule, and the reaper's sweep
		// would remove them too).
		if _, err := s.deleteNodesOf(ctx, lease, nil); err != nil {
			return 0, err
		}
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("kubernetes: revoke lease %x: %w", lease, classify(err))
	}
	return s.endLease(ctx, l, false)
}

// errRenewedMeanwhile: a reaper's delete lost the race to a renewal.
var errRenewedMeanwhile = errors.New("lease renewed since it was judged lapsed")

// endLease deletes the Lease l (preconditioned on l's resourceVersion
// when lapsed is set: the version judged lapsed) and then its node
// records. It returns the revision of the last deletion; 0 if the lease
// was ended by someone else in between and had no records left.
func (s *Store) endLease(ctx context.Context, l *coordinationv1.Lease, lapsed bool) (int64, error) {
	lease := leaseIDOf(l.Name)
	opts := metav1.DeleteOptions{}
	if lapsed {
		opts.Preconditions = &metav1.Preconditions{ResourceVersion: &l.ResourceVersion, UID: &l.UID}
	}
	// The records are listed before the lease goes too: once it is gone
	// a reaper may delete them before the list after it (they are dead
	// by the rule), and the revision returned must still cover those
	// deletions (deleteNode learns another's from its watch).
	before, err := s.nodesOf(ctx, lease)
	if err != nil {
		return 0, err
	}
	// The lease first: once it is gone no renewal or PutNode can succeed
	// under it, and the records left are dead by the rule.
	rev, err := s.deleteConfirmed(ctx, leaseWatcher{s}, l.Name, l.ResourceVersion, func(ctx context.Context) error {
		return s.leases().Delete(ctx, l.Name, opts)
	})
	switch {
	case apierrors.IsConflict(err) && lapsed:
		return 0, errRenewedMeanwhile
	case apierrors.IsNotFound(err):
		rev = 0 // ended by another replica in between
	case err != nil:
		return 0, fmt.Errorf("kubernetes: end lease %x: %w", lease, classify(err))
	}
	nrev, err := s.deleteNodesOf(ctx, lease, before)
	if err != nil {
		return 0, err
	}
	return max(rev, nrev), nil
}

// objectWatcher watches one object from a resourceVersion on.
type objectWatcher interface {
	watchOne(ctx context.Context, name, fromRV string) (watch.Interface, error)
}

type leaseWatcher struct{ s *Store }

func (w leaseWatcher) watchOne(ctx context.Context, name, fromRV string) (watch.Interface, error) {
	return w.s.leases().Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", name).String(),
		ResourceVersion: fromRV,
	})
}

// deleteConfirmed runs del, a delete of the object name at version rv,
// and returns the revision the deletion was written at. The API server's
// answer to a delete is a Status without it (neither Leases nor custom
// resources return the deleted object), so the deletion's revision is
// read from a watch of that one object opened from rv before the delete:
// the delete is preconditioned on rv or is of whatever version is there,
// and the first DELETED event after rv is the one this delete caused.
// Another's delete in between makes this one fail with NotFound; the
// revision returned with that error is then the other's deletion (from
// the same watch; 0 without one).
func (s *Store) deleteConfirmed(ctx context.Context, w objectWatcher, name, rv string, del func(context.Context) error) (int64, error) {
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	wi, werr := w.watchOne(wctx, name, rv)
	if werr != nil {
		// Without the watch the delete still happens; its revision is
		// then unknown, and the store's current one after it stands in
		// (later than the deletion, which only makes a resume from it
		// skip nothing of this key's).
		s.log.Debug("watch to confirm a deletion's revision", "name", name, "err", werr)
	}
	derr := del(ctx)
	if derr != nil && (wi == nil || !apierrors.IsNotFound(derr)) {
		if wi != nil {
			wi.Stop()
		}
		return 0, derr
	}
	if wi == nil {
		return s.currentRevision(ctx)
	}
	defer wi.Stop()
	if derr != nil {
		// Gone already: when it went is on the watch opened at rv.
		rev, err := waitDeleted(wctx, wi, name)
		if err != nil {
			rev = 0
		}
		return rev, derr
	}
	rev, err := waitDeleted(wctx, wi, name)
	if err == nil {
		return rev, nil
	}
	if ctx.Err() != nil {
		return 0, ctx.Err()
	}
	return s.currentRevision(ctx)
}

// errNoDeletion: a watch ended, failed or timed out before it showed the
// deletion waited for.
var errNoDeletion = errors.New("no deletion event on the watch")

// waitDeleted returns the revision of the first DELETED event of name on
// wi.
func waitDeleted(ctx context.Context, wi watch.Interface, name string) (int64, error) {
	for {
		select {
		case ev, ok := <-wi.ResultChan():
			if !ok {
				return 0, errNoDeletion
			}
			switch ev.Type {
			case watch.Deleted:
				m, err := metaAccessor(ev.Object)
				if err != nil {
					return 0, fmt.Errorf("%w: %v", errNoDeletion, err)
				}
				if m.GetName() != name {
					continue
				}
				rev, err := strconv.ParseInt(m.GetResourceVersion(), 10, 64)
				if err != nil {
					return 0, fmt.Errorf("%w: %v", errNoDeletion, err)
				}
				return rev, nil
			case watch.Error:
				return 0, errNoDeletion
			}
		case <-ctx.Done():
			return 0, fmt.Errorf("%w: %w", errNoDeletion, ctx.Err())
		}
	}
}

// currentRevision is the store's revision now: a quorum list of (at most
// one) Lease reports it.
func (s *Store) currentRevision(ctx context.Context) (int64, error) {
	l, err := s.leases().List(ctx, metav1.ListOptions{Limit: 1, LabelSelector: LabelManagedBy + "=" + managedBy})
	if err != nil {
		return 0, fmt.Errorf("kubernetes: current revision: %w", classify(err))
	}
	rev, err := strconv.ParseInt(l.ResourceVersion, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("kubernetes: current revision: resourceVersion %q: %w", l.ResourceVersion, err)
	}
	return rev, nil
}
