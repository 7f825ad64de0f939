package kubernetes

import (
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/backend/backendtest"
	"github.com/aethermesh/aether/internal/testutil/kubeapi"
	"github.com/aethermesh/aether/internal/testutil/wait"
	"github.com/aethermesh/aether/registry"
)

// requestLog records the RBAC verb and resource of every request a client
// makes, as the API server's authorizer sees them.
type requestLog struct {
	mu   sync.Mutex
	seen map[string]bool // "group/resource verb"
	next http.RoundTripper
}

func (l *requestLog) RoundTrip(req *http.Request) (*http.Response, error) {
	if gr, verb, ok := rbacOf(req); ok {
		l.mu.Lock()
		l.seen[gr+" "+verb] = true
		l.mu.Unlock()
	}
	return l.next.RoundTrip(req)
}

// rbacOf is the group/resource and verb of a resource request: paths
// /api/v1/[namespaces/NS/]RES[/NAME] and /apis/G/V/[namespaces/NS/]RES[/NAME].
func rbacOf(req *http.Request) (string, string, bool) {
	parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	var group string
	switch {
	case len(parts) >= 3 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 4 && parts[0] == "apis":
		group, parts = parts[1], parts[3:]
	default:
		return "", "", false
	}
	if len(parts) >= 3 && parts[0] == "namespaces" {
		parts = parts[2:]
	}
	if len(parts) == 0 {
		return "", "", false
	}
	named := len(parts) >= 2
	var verb string
	switch req.Method {
	case http.MethodGet:
		switch {
		case req.URL.Query().Get("watch") == "true" || req.URL.Query().Get("watch") == "1":
			verb = "watch"
		case named:
			verb = "get"
		default:
			verb = "list"
		}
	case http.MethodPost:
		verb = "create"
	case http.MethodPut:
		verb = "update"
	case http.MethodPatch:
		verb = "patch"
	case http.MethodDelete:
		verb = "delete"
		if !named {
			verb = "deletecollection"
		}
	default:
		return "", "", false
	}
	return group + "/" + parts[0], verb, true
}

// TestRequiredRulesExact: a ServiceAccount granted exactly RequiredRules
// (a Role for the namespaced rules, a ClusterRole for the CRDs) runs the
// backend through the conformance suite, tombstone collection and lease
// lapses without a refusal, and every verb of every rule was used: the
// rules are enough, and none is spare.
func TestRequiredRulesExact(t *testing.T) {
	api := kubeapi.Start(t)
	admin := api.Config()
	ns := testNamespace(t, admin)
	warm := newLiveStore(t, admin, ns) // installs the CRDs, which the ServiceAccount may only read
	_ = warm.Close()
	grantRequiredRules(t, api.Clientset(t), ns, "aether")
	sa := api.ServiceAccountConfig(t, ns, "aether")
	log := &requestLog{seen: map[string]bool{}}
	sa.Wrap(func(rt http.RoundTripper) http.RoundTripper { log.next = rt; return log })

	cs := api.Clientset(t)
	f := backendtest.Factory{New: func(t backendtest.T) backend.Store {
		// A namespace of its own, the ServiceAccount granted the same
		// Role in it.
		tt := t.(*testing.T)
		own := testNamespace(t, admin)
		grantRoleIn(tt, cs, own, ns, "aether")
		s, err := New(ctxT(tt), Config{RESTConfig: sa, Namespace: own, Region: "r1", Cluster: "c1", TombstoneTTL: time.Second, GCInterval: 300 * time.Millisecond})
		if err != nil {
			t.Fatalf("New as the ServiceAccount: %v", err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}}
	for name, run := range map[string]func(backendtest.T, backendtest.Factory){
		"Leases":                 backendtest.RunLeases,
		"Members":                backendtest.RunMembers,
		"WatchResumesWithoutGap": backendtest.RunWatchResumesWithoutGap,
		"Digest":                 backendtest.RunDigest,
		"GetAt":                  backendtest.RunGetAt,
	} {
		if !t.Run(name, func(t *testing.T) { run(t, f) }) {
			t.FailNow()
		}
	}
	// A delete's tombstone, collected once older than the TTL; a node
	// record put again; and a record swept after its lease was deleted
	// from under it.
	s := f.New(t).(*Store)
	ctx := ctxT(t)
	e := &registryv1.ServiceEndpoint{Service: "gc", Ip: "10.0.0.1", Region: "r1", Cluster: "c1", Ports: []*registryv1.Port{{Port: 80}},
		Stamp: &registryv1.WriteStamp{Hlc: 1 << 20, Writer: "w"}}
	if _, err := s.ApplyOrdered(ctx, []backend.Mutation{{ID: registry.IDOf(e), Endpoint: e}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ApplyOrdered(ctx, []backend.Mutation{{ID: registry.IDOf(e), Stamp: &registryv1.WriteStamp{Hlc: 2 << 20, Writer: "w"}}}); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "the tombstone to be collected", 30*time.Second, func() bool {
		log.mu.Lock()
		defer log.mu.Unlock()
		return log.seen[Group+"/"+EndpointsResource.Resource+" delete"]
	})
	id, err := s.GrantLease(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, addr := range []string{"10.0.0.1", "10.0.0.2"} { // a create, then an update (a node announcing again)
		if _, err := s.PutNode(ctx, &registryv1.Node{Name: "orphan", Region: "r1", Cluster: "c1", Address: addr}, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.leases().Delete(ctx, leaseName(id), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := s.reaper.sweep(ctx); err != nil {
		t.Fatalf("sweep as the ServiceAccount: %v", err)
	}

	want := map[string]bool{}
	for _, r := range RequiredRules() {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					want[g+"/"+res+" "+v] = true
				}
			}
		}
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	var unused, ungranted []string
	for k := range want {
		if !log.seen[k] {
			unused = append(unused, k)
		}
	}
	for k := range log.seen {
		if !want[k] {
			ungranted = append(ungranted, k)
		}
	}
	sort.Strings(unused)
	sort.Strings(ungranted)
	if len(unused) > 0 || len(ungranted) > 0 {
		t.Fatalf("RequiredRules is not what the backend uses: granted and never used %v; used and not granted %v", unused, ungranted)
	}
	t.Logf("the backend used exactly the %d verb/resource pairs of RequiredRules", len(want))
}
