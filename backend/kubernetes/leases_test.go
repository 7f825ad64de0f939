package kubernetes

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/backend/backendtest"
	"github.com/aethermesh/aether/internal/testutil/kubeapi"
	"github.com/aethermesh/aether/internal/testutil/wait"
	"github.com/aethermesh/aether/registry"
)

// TestLiveness runs the liveness tests on one real kube-apiserver, each
// in a namespace of its own.
func TestLiveness(t *testing.T) {
	cfg := kubeapi.Start(t).Config()
	warmUp(t, cfg)
	t.Run("LeaseLifecycle", func(t *testing.T) { testLeaseLifecycle(t, cfg) })
	t.Run("RevokeCoversAReapersDelete", func(t *testing.T) { testRevokeCoversAReapersDelete(t, cfg) })
	t.Run("RenewalWinsOverReaper", func(t *testing.T) { testRenewalWinsOverReaper(t, cfg) })
	t.Run("LapsedLeaseReaped", func(t *testing.T) { testLapsedLeaseReaped(t, cfg) })
	t.Run("SweepRemovesOrphans", func(t *testing.T) { testSweepRemovesOrphans(t, cfg) })
	t.Run("MembersOnLeases", func(t *testing.T) { testMembersOnLeases(t, cfg) })
	// The contract's own checks (backendtest.RunLeases, RunMembers) run in
	// the store's conformance test (conformance_test.go, RunAll).
}

// warmUp writes a first node record on a fresh API server. The first
// write of an AetherNode costs the API server about 2 s here, once (it
// compiles the CRD's validation rules on first use), which would eat the
// whole TTL of the short leases the tests below time.
func warmUp(t *testing.T, cfg *rest.Config) {
	t.Helper()
	s := newLiveStore(t, cfg, testNamespace(t, cfg))
	ctx := ctxT(t)
	id, err := s.GrantLease(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := s.PutNode(ctx, &registryv1.Node{Name: "warm-up", Region: "r1", Cluster: "c1"}, id); err != nil {
		t.Fatal(err)
	}
	first := time.Since(start)
	start = time.Now()
	if _, err := s.PutNode(ctx, &registryv1.Node{Name: "warm-up-2", Region: "r1", Cluster: "c1"}, id); err != nil {
		t.Fatal(err)
	}
	t.Logf("first node record written in %v, the second in %v", first, time.Since(start))
	_ = s.Close()
}

// testNamespace creates a namespace of its own for one test.
func testNamespace(t backendtest.T, cfg *rest.Config) string {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	ns := "t-" + hex.EncodeToString(b[:])
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("%v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", ns, err)
	}
	return ns
}

// newLiveStore is a Store on srv in a fresh namespace, closed at the end
// of the test.
func newLiveStore(t backendtest.T, cfg *rest.Config, ns string) *Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := New(ctx, Config{RESTConfig: cfg, Namespace: ns, Region: "r1", Cluster: "c1", InstallCRDs: true})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// nodeRecord reads n's AetherNode as the API server holds it (nil when
// absent).
func nodeRecord(t *testing.T, s *Store, n *registryv1.Node) map[string]any {
	t.Helper()
	key, err := registry.NodeIDOf(n).Key()
	if err != nil {
		t.Fatal(err)
	}
	o, err := s.dyn.Resource(NodesResource).Namespace(s.ns).Get(context.Background(), NodeObjectName(key, n.GetName()), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatalf("get node record: %v", err)
	}
	return o.Object
}

func leaseExists(t *testing.T, s *Store, id int64) bool {
	t.Helper()
	_, err := s.leases().Get(context.Background(), leaseName(id), metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("get lease: %v", err)
	}
	return err == nil
}

// testRevokeCoversAReapersDelete: a record listed before its lease was
// deleted, and deleted by another (a reaper, which may sweep it as soon as
// the lease is gone) before the revoker's own list, still counts: the
// revision returned is its deletion's, not an earlier one. (CI once saw
// RevokeLease return the lease's deletion, one revision before the
// record's, deleted by this replica's own reaper in between.)
func testRevokeCoversAReapersDelete(t *testing.T, cfg *rest.Config) {
	s := newLiveStore(t, cfg, testNamespace(t, cfg))
	ctx := ctxT(t)
	id, err := s.GrantLease(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	n := &registryv1.Node{Name: "n1", Region: "r1", Cluster: "c1"}
	putRev, err := s.PutNode(ctx, n, id)
	if err != nil {
		t.Fatal(err)
	}
	before, err := s.nodesOf(ctx, id)
	if err != nil || len(before) != 1 {
		t.Fatalf("nodesOf = %d records, %v; want the one put", len(before), err)
	}
	w, err := s.dyn.Resource(NodesResource).Namespace(s.ns).Watch(ctx, metav1.ListOptions{ResourceVersion: formatRV(putRev)})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	// The other's delete, between the revoker's two lists.
	if err := s.dyn.Resource(NodesResource).Namespace(s.ns).Delete(ctx, before[0].GetName(), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deletedAt := deletionRevision(ctx, t, w)
	got, err := s.deleteNodesOf(ctx, id, before)
	if err != nil || got != deletedAt {
		t.Fatalf("deleteNodesOf = %d, %v; want %d, the other's deletion of the record listed before", got, err, deletedAt)
	}
	// Without the earlier list the deletion is not seen: what the
	// revoker returned before the fix.
	if got, err := s.deleteNodesOf(ctx, id, nil); err != nil || got != 0 {
		t.Fatalf("deleteNodesOf without the earlier list = %d, %v; want 0", got, err)
	}
}

// deletionRevision waits for the first DELETED event on w and returns
// its revision.
func deletionRevision(ctx context.Context, t *testing.T, w watch.Interface) int64 {
	t.Helper()
	for {
		select {
		case ev := <-w.ResultChan():
			if ev.Type == watch.Deleted {
				m, _ := metaAccessor(ev.Object)
				if rev, _ := parseRV(m.GetResourceVersion()); rev != 0 {
					return rev
				}
			}
		case <-ctx.Done():
			t.Fatal("no delete event for the node record")
		}
	}
}

// testLeaseLifecycle: a lease is a Lease object; a node record put under
// it names it; revoking deletes both, and returns the revision the
// record's deletion was written at (as a watch of the record reports it).
func testLeaseLifecycle(t *testing.T, cfg *rest.Config) {
	s := newLiveStore(t, cfg, testNamespace(t, cfg))
	ctx := ctxT(t)

	id, err := s.GrantLease(ctx, 1500*time.Millisecond)
	if err != nil || id == 0 {
		t.Fatalf("GrantLease = %x, %v", id, err)
	}
	l, err := s.leases().Get(ctx, leaseName(id), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the Lease of a granted lease: %v", err)
	}
	if *l.Spec.LeaseDurationSeconds != 2 || l.Spec.RenewTime == nil || l.Labels[LabelManagedBy] != managedBy {
		t.Fatalf("Lease %+v: want 2 s (1.5 s rounded up), a renewTime and the managed-by label", l.Spec)
	}
	n := &registryv1.Node{Name: "n1", Region: "r1", Cluster: "c1", Zone: "z1", Address: "10.0.0.9",
		Health: &registryv1.HealthSummary{Status: registryv1.Health_HEALTH_HEALTHY, EndpointsTotal: 2}}
	putRev, err := s.PutNode(ctx, n, id)
	if err != nil || putRev <= 0 {
		t.Fatalf("PutNode = %d, %v", putRev, err)
	}
	rec := nodeRecord(t, s, n)
	spec, _ := rec["spec"].(map[string]any)
	labels, _ := rec["metadata"].(map[string]any)["labels"].(map[string]any)
	if spec["lease"] != leaseName(id) || labels[labelLease] != leaseHex(id) {
		t.Fatalf("node record %v: want spec.lease %s and label %s=%s", rec, leaseName(id), labelLease, leaseHex(id))
	}
	if l, _ := s.leases().Get(ctx, leaseName(id), metav1.GetOptions{}); l == nil || *l.Spec.HolderIdentity != "/aether/v1/regions/r1/clusters/c1/nodes/n1" {
		t.Fatalf("the Lease's holder after PutNode: %+v", l)
	}
	ttl, err := s.KeepAliveOnce(ctx, id)
	if err != nil || ttl != 2*time.Second {
		t.Fatalf("KeepAliveOnce = %v, %v; want 2s", ttl, err)
	}
	left, g, err := s.LeaseTTL(ctx, id)
	if err != nil || g != 2*time.Second || left <= 0 || left > g {
		t.Fatalf("LeaseTTL = %v of %v, %v", left, g, err)
	}

	// A watch of the record from its put sees the revocation's delete.
	w, err := s.dyn.Resource(NodesResource).Namespace(s.ns).Watch(ctx, metav1.ListOptions{ResourceVersion: formatRV(putRev)})
	if err != nil {
		t.Fatalf("watch node records: %v", err)
	}
	defer w.Stop()
	revoked, err := s.RevokeLease(ctx, id)
	if err != nil || revoked <= putRev {
		t.Fatalf("RevokeLease = %d, %v; want a revision after the put at %d", revoked, err, putRev)
	}
	deletedAt := deletionRevision(ctx, t, w)
	if deletedAt != revoked {
		t.Fatalf("RevokeLease returned %d, the record's deletion was written at %d", revoked, deletedAt)
	}
	if nodeRecord(t, s, n) != nil || leaseExists(t, s, id) {
		t.Fatalf("after RevokeLease the record or the Lease is still there")
	}
	for name, err := range map[string]error{
		"KeepAliveOnce": func() error { _, err := s.KeepAliveOnce(ctx, id); return err }(),
		"LeaseTTL":      func() error { _, _, err := s.LeaseTTL(ctx, id); return err }(),
		"PutNode":       func() error { _, err := s.PutNode(ctx, n, id); return err }(),
		"PutMember":     s.PutMember(ctx, "r1", "c1", backend.Member{Epoch: "e", Addr: "a:1"}, id),
	} {
		if !errors.Is(err, backend.ErrLeaseNotFound) {
			t.Errorf("%s of a revoked lease: %v, want ErrLeaseNotFound", name, err)
		}
	}
	if r, err := s.RevokeLease(ctx, id); r != 0 || err != nil {
		t.Fatalf("revoking twice: %d, %v; want 0, nil", r, err)
	}
}

// testRenewalWinsOverReaper: a reaper's delete is preconditioned on the
// version it judged lapsed; a renewal that landed after that judgement
// changed the version, so the delete is refused and the lease and its
// record stay. Without the precondition the delete would win.
func testRenewalWinsOverReaper(t *testing.T, cfg *rest.Config) {
	s := newLiveStore(t, cfg, testNamespace(t, cfg))
	ctx := ctxT(t)
	id, err := s.GrantLease(ctx, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	n := &registryv1.Node{Name: "n1", Region: "r1", Cluster: "c1"}
	if _, err := s.PutNode(ctx, n, id); err != nil {
		t.Fatal(err)
	}
	judged, err := s.leases().Get(ctx, leaseName(id), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.KeepAliveOnce(ctx, id); err != nil { // lands after the judgement
		t.Fatal(err)
	}
	if _, err := s.endLease(ctx, judged.DeepCopy(), true); !errors.Is(err, errRenewedMeanwhile) {
		t.Fatalf("ending a lease renewed since it was judged: %v, want errRenewedMeanwhile", err)
	}
	if !leaseExists(t, s, id) || nodeRecord(t, s, n) == nil {
		t.Fatalf("a renewal lost to a reaper's stale judgement")
	}
	// The same delete at the current version ends it.
	cur, _ := s.leases().Get(ctx, leaseName(id), metav1.GetOptions{})
	if rev, err := s.endLease(ctx, cur, true); err != nil || rev == 0 {
		t.Fatalf("ending the lease at its current version: %d, %v", rev, err)
	}
	if leaseExists(t, s, id) || nodeRecord(t, s, n) != nil {
		t.Fatalf("the lease or its record survived its end")
	}
}

// testLapsedLeaseReaped: a lease renewed in time keeps its record; left
// alone it lapses, another replica's reaper (the granting replica is
// gone) deletes the Lease and the record, and a lapsed lease is never
// revived by a late renewal.
func testLapsedLeaseReaped(t *testing.T, cfg *rest.Config) {
	ns := testNamespace(t, cfg)
	a := newLiveStore(t, cfg, ns)
	b := newLiveStore(t, cfg, ns)
	ctx := ctxT(t)
	id, err := a.GrantLease(ctx, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	n := &registryv1.Node{Name: "n1", Region: "r1", Cluster: "c1"}
	if _, err := a.PutNode(ctx, n, id); err != nil {
		t.Fatal(err)
	}
	var last time.Time
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(300 * time.Millisecond) { // the heartbeat cadence under test
		last = time.Now() // the renewal is stamped after this
		if _, err := b.KeepAliveOnce(ctx, id); err != nil {
			t.Fatalf("renewal through the other replica: %v", err)
		}
		if nodeRecord(t, a, n) == nil {
			t.Fatalf("the record went while its lease was renewed every 300 ms")
		}
	}
	_ = a.Close() // the granting replica's reaper is gone; b's ends the lease
	wait.For(t, "the lapsed lease's record to be deleted", 15*time.Second, func() bool { return nodeRecord(t, b, n) == nil })
	if since := time.Since(last); since < time.Second {
		t.Fatalf("record deleted %v after the last renewal, before the 1 s TTL", since)
	}
	if leaseExists(t, b, id) {
		t.Fatalf("the lapsed Lease was left")
	}
	if _, err := b.KeepAliveOnce(ctx, id); !errors.Is(err, backend.ErrLeaseNotFound) {
		t.Fatalf("renewing a lapsed lease: %v, want ErrLeaseNotFound", err)
	}
	if ended, _ := b.reaper.counts(); ended == 0 {
		t.Fatalf("the other replica's reaper ended nothing")
	}
}

// testSweepRemovesOrphans: a record whose Lease is gone (its revoker
// stopped between the two deletes) is removed by the sweep; a record
// whose Lease exists is left.
func testSweepRemovesOrphans(t *testing.T, cfg *rest.Config) {
	s := newLiveStore(t, cfg, testNamespace(t, cfg))
	ctx := ctxT(t)
	orphan := &registryv1.Node{Name: "orphan", Region: "r1", Cluster: "c1"}
	kept := &registryv1.Node{Name: "kept", Region: "r1", Cluster: "c1"}
	var ids []int64
	for _, n := range []*registryv1.Node{orphan, kept} {
		id, err := s.GrantLease(ctx, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.PutNode(ctx, n, id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := s.leases().Delete(ctx, leaseName(ids[0]), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := s.reaper.sweep(ctx); err != nil {
		t.Fatalf("sweep: %v", err)
	}
	if nodeRecord(t, s, orphan) != nil {
		t.Fatalf("the sweep left a record whose lease is gone")
	}
	if nodeRecord(t, s, kept) == nil {
		t.Fatalf("the sweep removed a record whose lease is live")
	}
}

// testMembersOnLeases: member records ride on their replica's Lease,
// listed per (region, cluster) in epoch order, and go with it, whether
// revoked or lapsed.
func testMembersOnLeases(t *testing.T, cfg *rest.Config) {
	s := newLiveStore(t, cfg, testNamespace(t, cfg))
	ctx := ctxT(t)
	long, err := s.GrantLease(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	short, err := s.GrantLease(ctx, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PutMember(ctx, "r1", "c1", backend.Member{Epoch: "e2", Addr: "b:1"}, long); err != nil {
		t.Fatal(err)
	}
	if err := s.PutMember(ctx, "r1", "c1", backend.Member{Epoch: "e1", Addr: "a:1"}, short); err != nil {
		t.Fatal(err)
	}
	if err := s.PutMember(ctx, "r1", "c2", backend.Member{Epoch: "e3", Addr: "c:1"}, long); err != nil {
		t.Fatal(err)
	}
	got, err := s.ListMembers(ctx, "r1", "c1")
	if err != nil || len(got) != 2 || got[0].Epoch != "e1" || got[1].Epoch != "e2" {
		t.Fatalf("ListMembers = %v, %v; want e1, e2", got, err)
	}
	// The short lease is never renewed: its member drops out by the rule,
	// then its Lease is reaped.
	wait.For(t, "the unrenewed member to drop out", 10*time.Second, func() bool {
		got, err := s.ListMembers(ctx, "r1", "c1")
		return err == nil && len(got) == 1 && got[0].Epoch == "e2"
	})
	wait.For(t, "the unrenewed member's Lease to be reaped", 10*time.Second, func() bool { return !leaseExists(t, s, short) })
	if _, err := s.RevokeLease(ctx, long); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"c1", "c2"} {
		if got, err := s.ListMembers(ctx, "r1", c); err != nil || len(got) != 0 {
			t.Fatalf("ListMembers(%s) after revoking = %v, %v", c, got, err)
		}
	}
}
