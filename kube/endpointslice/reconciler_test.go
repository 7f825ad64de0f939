package endpointslice_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/kubeapi"
	"github.com/aethermesh/aether/internal/testutil/logbuf"
	"github.com/aethermesh/aether/internal/testutil/regtest"
	"github.com/aethermesh/aether/internal/testutil/wait"
	"github.com/aethermesh/aether/kube/endpointslice"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/server"
)

// The reconciler against real parts: a registrar on its embedded etcd,
// written to over gRPC, and Kubernetes' own kube-apiserver, read back with
// client-go.

const ns = "mesh"

type env struct {
	api *kubeapi.Server
	srv *server.Server
	c   registrarv1.RegistrarClient
	cs  kubernetes.Interface
}

func setup(t *testing.T) *env {
	t.Helper()
	api := kubeapi.Start(t)
	cs, err := kubernetes.NewForConfig(api.Config())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	srv := regtest.Start(t, server.Config{
		DataDir:              t.TempDir(),
		EmbeddedEtcdAddr:     "127.0.0.1:0",
		EmbeddedEtcdPeerAddr: "127.0.0.1:0",
		Options:              registrar.Options{ClusterName: "c1", Region: "r1"},
	})
	return &env{api: api, srv: srv, c: regtest.Dial(t, srv.GRPCAddr()), cs: cs}
}

// start runs a reconciler over the registrar until t ends (or stop).
func (e *env) start(t *testing.T, mut ...func(*endpointslice.ReconcilerConfig)) (*endpointslice.Reconciler, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg := endpointslice.ReconcilerConfig{
		Config:     endpointslice.Config{Namespace: ns, Region: "r1", Cluster: "c1", ZoneHints: true},
		Source:     e.srv.Registrar(),
		Client:     e.cs,
		Logger:     regtest.QuietLogger(),
		Registerer: reg,
	}
	for _, m := range mut {
		m(&cfg)
	}
	r, err := endpointslice.NewReconciler(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.Start()
	t.Cleanup(r.Close)
	return r, reg
}

func ep(svc, ip string) *registryv1.ServiceEndpoint {
	e := regtest.EP(svc, ip, 8080)
	e.Node = "node-a"
	return e
}

// slicesOf lists the slices of svc in ns carrying managedBy (all of any
// manager with "").
func (e *env) slicesOf(t *testing.T, svc, managedBy string) []discoveryv1.EndpointSlice {
	t.Helper()
	sel := discoveryv1.LabelServiceName + "=" + svc
	if managedBy != "" {
		sel += "," + discoveryv1.LabelManagedBy + "=" + managedBy
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l, err := e.cs.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		t.Fatal(err)
	}
	sort.Slice(l.Items, func(i, j int) bool { return l.Items[i].Name < l.Items[j].Name })
	return l.Items
}

// state is the published endpoints of svc: ip → "ready/serving/terminating".
func (e *env) state(t *testing.T, svc string) map[string]string {
	m := map[string]string{}
	for _, s := range e.slicesOf(t, svc, endpointslice.ManagedBy) {
		for _, p := range s.Endpoints {
			c := p.Conditions
			m[p.Addresses[0]] = fmt.Sprintf("%v/%v/%v", *c.Ready, *c.Serving, *c.Terminating)
		}
	}
	return m
}

func (e *env) waitState(t *testing.T, svc string, want map[string]string) {
	t.Helper()
	wait.ForState(t, "slices of "+svc+" to show "+fmt.Sprint(want), 20*time.Second, func() (bool, string) {
		got := e.state(t, svc)
		return fmt.Sprint(got) == fmt.Sprint(want), fmt.Sprint(got)
	})
}

func counter(t *testing.T, reg *prometheus.Registry, name, op string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if op == "" || labelOf(m, "op") == op {
				total += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	return total
}

func labelOf(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// TestSlicesFollowRegisterDrainRemove: registering, draining and removing
// endpoints shows up in the slices with the controller's conditions; a
// slice of another manager for the same service is never touched.
func TestSlicesFollowRegisterDrainRemove(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	foreign, err := e.cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "web-by-someone-else", Labels: map[string]string{
			discoveryv1.LabelServiceName: "web", discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io",
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.1"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	_, reg := e.start(t)
	// A reconciler configured for another cluster publishes none of c1's
	// endpoints, and leaves c1's slices alone.
	_, otherReg := e.start(t, func(c *endpointslice.ReconcilerConfig) { c.Cluster = "c9" })
	for _, ip := range []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"} {
		regtest.Register(t, e.c, ep("web", ip))
	}
	e.waitState(t, "web", map[string]string{"10.0.0.1": "true/true/false", "10.0.0.2": "true/true/false", "10.0.0.3": "true/true/false"})

	got := e.slicesOf(t, "web", endpointslice.ManagedBy)
	if len(got) != 1 {
		t.Fatalf("%d slices, want 1", len(got))
	}
	s := got[0]
	if s.AddressType != discoveryv1.AddressTypeIPv4 || len(s.Ports) != 1 || *s.Ports[0].Name != "http" || *s.Ports[0].Port != 8080 {
		t.Fatalf("slice %s: type %s ports %+v", s.Name, s.AddressType, s.Ports)
	}
	p := s.Endpoints[0]
	if p.Zone == nil || *p.Zone != "z1" || p.NodeName == nil || *p.NodeName != "node-a" || p.Hints == nil || p.Hints.ForZones[0].Name != "z1" {
		t.Fatalf("endpoint %+v: want zone z1, node node-a, hinted for z1", p)
	}

	if _, err := e.c.DrainEndpoint(ctx, &registrarv1.DrainEndpointRequest{Service: "web", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: "10.0.0.2"}); err != nil {
		t.Fatal(err)
	}
	e.waitState(t, "web", map[string]string{"10.0.0.1": "true/true/false", "10.0.0.2": "false/true/true", "10.0.0.3": "true/true/false"})

	if _, err := e.c.UnregisterEndpoint(ctx, &registrarv1.UnregisterEndpointRequest{Service: "web", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: "10.0.0.3"}); err != nil {
		t.Fatal(err)
	}
	e.waitState(t, "web", map[string]string{"10.0.0.1": "true/true/false", "10.0.0.2": "false/true/true"})

	for _, ip := range []string{"10.0.0.1", "10.0.0.2"} {
		if _, err := e.c.UnregisterEndpoint(ctx, &registrarv1.UnregisterEndpointRequest{Service: "web", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: ip}); err != nil {
			t.Fatal(err)
		}
	}
	wait.For(t, "the service's last slice deleted", 20*time.Second, func() bool {
		return len(e.slicesOf(t, "web", endpointslice.ManagedBy)) == 0
	})

	all := e.slicesOf(t, "web", "")
	if len(all) != 1 || all[0].Name != foreign.Name || all[0].ResourceVersion != foreign.ResourceVersion {
		t.Fatalf("the other manager's slice changed: %+v", all)
	}
	if n := counter(t, otherReg, "endpointslice_writes_total", ""); n != 0 {
		t.Errorf("the reconciler of cluster c9 wrote %v times", n)
	}
	if n := counter(t, reg, "endpointslice_writes_total", "create"); n != 1 {
		t.Errorf("%v creates, want 1", n)
	}
	if n := counter(t, reg, "endpointslice_writes_total", "delete"); n != 1 {
		t.Errorf("%v deletes, want 1", n)
	}
}

// TestManyEndpointsAndRestartAdopts: 250 endpoints make three slices of at
// most 100; a restarted reconciler adopts them (one more endpoint updates
// one slice, nothing is created or duplicated); a slice changed behind its
// back is a conflict it relists and repairs.
func TestManyEndpointsAndRestartAdopts(t *testing.T) {
	e := setup(t)
	r1, _ := e.start(t)
	want := map[string]string{}
	for i := range 250 {
		ip := fmt.Sprintf("10.1.%d.%d", i/200, 1+i%200)
		regtest.Register(t, e.c, ep("api", ip))
		want[ip] = "true/true/false"
	}
	e.waitState(t, "api", want)
	before := e.slicesOf(t, "api", endpointslice.ManagedBy)
	if len(before) != 3 {
		t.Fatalf("%d slices for 250 endpoints, want 3", len(before))
	}
	for _, s := range before {
		if len(s.Endpoints) > 100 {
			t.Fatalf("slice %s holds %d endpoints", s.Name, len(s.Endpoints))
		}
	}
	r1.Close()

	_, reg := e.start(t)
	regtest.Register(t, e.c, ep("api", "10.1.9.9"))
	want["10.1.9.9"] = "true/true/false"
	e.waitState(t, "api", want)
	after := e.slicesOf(t, "api", endpointslice.ManagedBy)
	names := func(ss []discoveryv1.EndpointSlice) []string {
		var out []string
		for _, s := range ss {
			out = append(out, s.Name)
		}
		return out
	}
	if !slices.Equal(names(before), names(after)) {
		t.Fatalf("slices %v after the restart, %v before: not adopted", names(after), names(before))
	}
	moved := 0
	for i := range after {
		if after[i].ResourceVersion != before[i].ResourceVersion {
			moved++
		}
	}
	if moved != 1 || counter(t, reg, "endpointslice_writes_total", "create") != 0 {
		t.Fatalf("%d slices rewritten and %v created after the restart; want one update", moved, counter(t, reg, "endpointslice_writes_total", "create"))
	}

	// Someone edits a managed slice: the reconciler's next write of it
	// is refused (its resourceVersion is stale), it relists and converges.
	victim := after[0].DeepCopy()
	victim.Endpoints = victim.Endpoints[:len(victim.Endpoints)-1]
	if _, err := e.cs.DiscoveryV1().EndpointSlices(ns).Update(context.Background(), victim, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var touched string
	for _, p := range victim.Endpoints[:1] {
		touched = p.Addresses[0]
	}
	if _, err := e.c.DrainEndpoint(context.Background(), &registrarv1.DrainEndpointRequest{Service: "api", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: touched}); err != nil {
		t.Fatal(err)
	}
	want[touched] = "false/true/true"
	e.waitState(t, "api", want)
	if n := counter(t, reg, "endpointslice_conflicts_total", ""); n < 1 {
		t.Errorf("no conflict counted")
	}
}

// TestResyncRepairsAndSkips: a managed slice deleted by hand comes back
// at the next resync; a service whose name no Kubernetes Service can have
// is skipped and counted.
func TestResyncRepairsAndSkips(t *testing.T) {
	e := setup(t)
	_, reg := e.start(t, func(c *endpointslice.ReconcilerConfig) {
		c.Resync = time.Second
		c.ServiceNames = map[string]string{"db.v2": "db-v2"}
	})
	regtest.Register(t, e.c, ep("db", "10.2.0.1"))
	regtest.Register(t, e.c, ep("Bad_Name", "10.2.0.2"))
	// Renamed, and the service whose own name is the rename's target
	// (skipped, not merged into it).
	regtest.Register(t, e.c, ep("db.v2", "10.2.0.3"))
	regtest.Register(t, e.c, ep("db-v2", "10.2.0.4"))
	e.waitState(t, "db-v2", map[string]string{"10.2.0.3": "true/true/false"})
	regtest.Register(t, e.c, ep("db", "fd00::2:1"))
	e.waitState(t, "db", map[string]string{"10.2.0.1": "true/true/false", "fd00::2:1": "true/true/false"})
	types := map[discoveryv1.AddressType]bool{}
	for _, s := range e.slicesOf(t, "db", endpointslice.ManagedBy) {
		types[s.AddressType] = true
	}
	if len(types) != 2 || !types[discoveryv1.AddressTypeIPv4] || !types[discoveryv1.AddressTypeIPv6] {
		t.Fatalf("address types %v, want a slice of each family", types)
	}
	unregister(t, e.c, "db", "fd00::2:1")
	e.waitState(t, "db", map[string]string{"10.2.0.1": "true/true/false"})
	s := e.slicesOf(t, "db", endpointslice.ManagedBy)[0]
	if err := e.cs.DiscoveryV1().EndpointSlices(ns).Delete(context.Background(), s.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "the deleted slice recreated by a resync", 20*time.Second, func() bool {
		return len(e.slicesOf(t, "db", endpointslice.ManagedBy)) == 1
	})
	e.waitState(t, "db", map[string]string{"10.2.0.1": "true/true/false"})
	wait.For(t, "the bad service name counted", 10*time.Second, func() bool {
		return counter(t, reg, "endpointslice_skipped_services", "") == 2
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l, err := e.cs.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range l.Items {
		if strings.Contains(strings.ToLower(s.Name), "bad") {
			t.Fatalf("slice %s for a skipped service", s.Name)
		}
	}
}

// TestElectionOneWriter: of two replicas' reconcilers with an Election,
// one writes; when it stops, the other takes over and publishes what
// changed meanwhile, adopting the slices rather than duplicating them.
func TestElectionOneWriter(t *testing.T) {
	e := setup(t)
	elect := func(id string) func(*endpointslice.ReconcilerConfig) {
		return func(c *endpointslice.ReconcilerConfig) {
			c.Election = &endpointslice.Election{Identity: id, LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 200 * time.Millisecond}
		}
	}
	a, regA := e.start(t, elect("a"))
	wait.For(t, "a to lead", 10*time.Second, func() bool {
		l, err := e.cs.CoordinationV1().Leases(ns).Get(context.Background(), (endpointslice.Config{Region: "r1", Cluster: "c1"}).LeaseName(), metav1.GetOptions{})
		return err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == "a"
	})
	_, regB := e.start(t, elect("b"))
	for i := range 5 {
		regtest.Register(t, e.c, ep("pay", fmt.Sprintf("10.3.0.%d", i+1)))
	}
	want := map[string]string{}
	for i := range 5 {
		want[fmt.Sprintf("10.3.0.%d", i+1)] = "true/true/false"
	}
	e.waitState(t, "pay", want)
	if n := counter(t, regB, "endpointslice_writes_total", ""); n != 0 {
		t.Fatalf("the follower wrote %v times", n)
	}
	if n := counter(t, regA, "endpointslice_writes_total", ""); n < 1 {
		t.Fatalf("the leader wrote nothing")
	}

	a.Close() // releases the lease
	if _, err := e.c.DrainEndpoint(context.Background(), &registrarv1.DrainEndpointRequest{Service: "pay", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: "10.3.0.1"}); err != nil {
		t.Fatal(err)
	}
	want["10.3.0.1"] = "false/true/true"
	e.waitState(t, "pay", want)
	if n := len(e.slicesOf(t, "pay", endpointslice.ManagedBy)); n != 1 {
		t.Fatalf("%d slices after the handover, want 1", n)
	}
	if n := counter(t, regB, "endpointslice_writes_total", "create"); n != 0 {
		t.Fatalf("the new leader created %v slices instead of adopting", n)
	}
}

func unregister(t *testing.T, c registrarv1.RegistrarClient, svc, ip string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.UnregisterEndpoint(ctx, &registrarv1.UnregisterEndpointRequest{Service: svc, Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: ip}); err != nil {
		t.Fatalf("unregister %s %s: %v", svc, ip, err)
	}
}

// TestRequiredRulesSuffice: a reconciler acting as a ServiceAccount that
// has exactly RequiredRules in the namespace (a Role) elects itself and
// creates, updates and deletes slices; without the Role it writes nothing
// (so the rules, not some wider grant, are what let it).
func TestRequiredRulesSuffice(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	sa, err := kubernetes.NewForConfig(e.api.ServiceAccountConfig(t, ns, "aether-registrar"))
	if err != nil {
		t.Fatal(err)
	}
	elect := func(c *endpointslice.ReconcilerConfig) {
		c.Client = sa
		c.Election = &endpointslice.Election{Identity: "sa", LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 200 * time.Millisecond}
		c.Backoff.Base, c.Backoff.Max = 50*time.Millisecond, 200*time.Millisecond
	}

	// No Role yet: the ServiceAccount may not even list (a reconciler
	// without an election shows it), nor take the Lease.
	r, reg := e.start(t, func(c *endpointslice.ReconcilerConfig) { elect(c); c.Election = nil })
	regtest.Register(t, e.c, ep("rbac", "10.4.0.1"))
	wait.For(t, "the listing refused", 10*time.Second, func() bool {
		return counter(t, reg, "endpointslice_errors_total", "list") > 0
	})
	r.Close()
	var logs logbuf.Buffer
	r, reg = e.start(t, elect, func(c *endpointslice.ReconcilerConfig) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	wait.For(t, "the election refused", 10*time.Second, func() bool {
		return strings.Contains(logs.String(), "forbidden") && strings.Contains(logs.String(), "leases")
	})
	if _, err := e.cs.CoordinationV1().Leases(ns).Get(ctx, (endpointslice.Config{Region: "r1", Cluster: "c1"}).LeaseName(), metav1.GetOptions{}); err == nil {
		t.Fatalf("the Lease exists without the Role")
	}
	if n := len(e.slicesOf(t, "rbac", endpointslice.ManagedBy)); n != 0 || counter(t, reg, "endpointslice_writes_total", "") != 0 {
		t.Fatalf("%d slices written without the Role", n)
	}
	r.Close()

	if _, err := e.cs.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "aether-endpointslices"},
		Rules:      endpointslice.RequiredRules(),
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cs.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "aether-endpointslices"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "aether-endpointslices"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "aether-registrar", Namespace: ns}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, reg = e.start(t, elect)
	e.waitState(t, "rbac", map[string]string{"10.4.0.1": "true/true/false"})
	if _, err := e.c.DrainEndpoint(ctx, &registrarv1.DrainEndpointRequest{Service: "rbac", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: "10.4.0.1"}); err != nil {
		t.Fatal(err)
	}
	e.waitState(t, "rbac", map[string]string{"10.4.0.1": "false/true/true"})
	unregister(t, e.c, "rbac", "10.4.0.1")
	wait.For(t, "the slice deleted", 20*time.Second, func() bool {
		return len(e.slicesOf(t, "rbac", endpointslice.ManagedBy)) == 0
	})
	if n := counter(t, reg, "endpointslice_errors_total", ""); n != 0 {
		t.Fatalf("%v API errors with the Role", n)
	}
}
