package kubernetes

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/aethermesh/aether/internal/testutil/kubeapi"
	"github.com/aethermesh/aether/internal/testutil/wait"
)

// grantRequiredRules binds RequiredRules to the ServiceAccount ns/name:
// the namespaced rules in a Role of ns, the CRD rule in a ClusterRole, as
// the deployment's manifests do.
func grantRequiredRules(t *testing.T, cs kubernetes.Interface, ns, name string) {
	t.Helper()
	ctx := ctxT(t)
	var cluster []rbacv1.PolicyRule
	for _, r := range RequiredRules() {
		if len(r.APIGroups) == 1 && r.APIGroups[0] == "apiextensions.k8s.io" {
			cluster = append(cluster, r)
		}
	}
	grantRoleIn(t, cs, ns, ns, name)
	subj := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}}
	cr := ns + "-" + name
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: cr}, Rules: cluster}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: cr}, Subjects: subj,
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: cr},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// grantRoleIn grants the namespaced RequiredRules in roleNS to the
// ServiceAccount saNS/name.
func grantRoleIn(t *testing.T, cs kubernetes.Interface, roleNS, saNS, name string) {
	t.Helper()
	ctx := ctxT(t)
	var local []rbacv1.PolicyRule
	for _, r := range RequiredRules() {
		if !(len(r.APIGroups) == 1 && r.APIGroups[0] == "apiextensions.k8s.io") {
			local = append(local, r)
		}
	}
	subj := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: saNS, Name: name}}
	if _, err := cs.RbacV1().Roles(roleNS).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: local}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().RoleBindings(roleNS).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name}, Subjects: subj,
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestPriorityAndFairness429: the real API server's own throttling. A
// FlowSchema puts the registrar's ServiceAccount in a priority level of
// the least concurrency APF allows (one share: a few seats) that rejects
// instead of queueing, and the store is let to send 64 requests at once:
// the API server answers many with 429 and Retry-After, and every call
// still succeeds, through client-go's retries and the pacer's hold. The
// ServiceAccount has exactly RequiredRules.
func TestPriorityAndFairness429(t *testing.T) {
	api := kubeapi.Start(t)
	admin := api.Config()
	cs := api.Clientset(t)
	ns := testNamespace(t, admin)
	newLiveStore(t, admin, ns) // installs the CRDs, which the ServiceAccount may only read
	ctx := ctxT(t)
	sa := api.ServiceAccountConfig(t, ns, "aether")
	grantRequiredRules(t, cs, ns, "aether")

	one := int32(1)
	zero := int32(0)
	if _, err := cs.FlowcontrolV1().PriorityLevelConfigurations().Create(ctx, &flowcontrolv1.PriorityLevelConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "aether-tiny"},
		Spec: flowcontrolv1.PriorityLevelConfigurationSpec{
			Type: flowcontrolv1.PriorityLevelEnablementLimited,
			Limited: &flowcontrolv1.LimitedPriorityLevelConfiguration{
				NominalConcurrencyShares: &one,
				LendablePercent:          &zero,
				BorrowingLimitPercent:    &zero,
				LimitResponse:            flowcontrolv1.LimitResponse{Type: flowcontrolv1.LimitResponseTypeReject},
			},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	fs, err := cs.FlowcontrolV1().FlowSchemas().Create(ctx, &flowcontrolv1.FlowSchema{
		ObjectMeta: metav1.ObjectMeta{Name: "aether-tiny"},
		Spec: flowcontrolv1.FlowSchemaSpec{
			PriorityLevelConfiguration: flowcontrolv1.PriorityLevelConfigurationReference{Name: "aether-tiny"},
			MatchingPrecedence:         100,
			DistinguisherMethod:        &flowcontrolv1.FlowDistinguisherMethod{Type: flowcontrolv1.FlowDistinguisherMethodByUserType},
			Rules: []flowcontrolv1.PolicyRulesWithSubjects{{
				Subjects: []flowcontrolv1.Subject{{
					Kind:           flowcontrolv1.SubjectKindServiceAccount,
					ServiceAccount: &flowcontrolv1.ServiceAccountSubject{Namespace: ns, Name: "aether"},
				}},
				ResourceRules: []flowcontrolv1.ResourcePolicyRule{{
					Verbs: []string{"*"}, APIGroups: []string{"*"}, Resources: []string{"*"}, Namespaces: []string{"*"}, ClusterScope: true,
				}},
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The API server applies new flow control configuration a moment
	// later: wait until the ServiceAccount's requests are classified by
	// the new FlowSchema (the response header names its UID).
	probe, err := rest.HTTPClientFor(sa)
	if err != nil {
		t.Fatal(err)
	}
	wait.For(t, "the ServiceAccount's requests to fall under the new FlowSchema", 30*time.Second, func() bool {
		resp, err := probe.Get(sa.Host + "/apis/coordination.k8s.io/v1/namespaces/" + ns + "/leases")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.Header.Get(flowcontrolv1.ResponseHeaderMatchedFlowSchemaUID) == string(fs.UID)
	})

	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	s, err := New(sctx, Config{RESTConfig: sa, Namespace: ns, Region: "r1", Cluster: "c1", MaxInFlight: 64})
	if err != nil {
		t.Fatalf("New as the ServiceAccount with RequiredRules: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	id, err := s.GrantLease(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	const workers, calls = 64, 10
	var failed atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for range calls {
				if _, _, err := s.LeaseTTL(ctx, id); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
			}
		})
	}
	wg.Wait()
	n, waited := s.pacer.Throttled()
	s.pacer.mu.Lock()
	limit := s.pacer.limit
	s.pacer.mu.Unlock()
	t.Logf("%d reads by %d workers through a priority level of one share in %v: %d answered 429 by the API server, the whole client held back %v, %d failed; in-flight bound now %.1f of 64",
		workers*calls, workers, time.Since(start).Round(time.Millisecond), n, waited.Round(time.Millisecond), failed.Load(), limit)
	if n == 0 {
		t.Fatalf("the API server sent no 429: the priority level did not throttle")
	}
	if failed.Load() > 0 {
		t.Fatalf("%d calls failed despite the retries: %v", failed.Load(), firstErr.Load())
	}
}
