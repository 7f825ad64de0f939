package deploy_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"

	kubestore "github.com/aethermesh/aether/backend/kubernetes"
	"github.com/aethermesh/aether/kube/endpointslice"
)

// A permission is one (group, resource, resource name, verb); a rule
// stands for the product of its lists. "" name: any object.
type permission struct{ group, resource, name, verb string }

func (p permission) String() string {
	s := p.verb + " " + p.resource
	if p.group != "" {
		s += "." + p.group
	}
	if p.name != "" {
		s += "/" + p.name
	}
	return s
}

func flatten(rules []rbacv1.PolicyRule) map[permission]bool {
	out := map[permission]bool{}
	for _, r := range rules {
		names := r.ResourceNames
		if len(names) == 0 {
			names = []string{""}
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, n := range names {
					for _, v := range r.Verbs {
						out[permission{g, res, n, v}] = true
					}
				}
			}
		}
	}
	return out
}

// diffPermissions says what got has beyond want and what it lacks.
func diffPermissions(want, got map[permission]bool) []string {
	var d []string
	for p := range got {
		if !want[p] {
			d = append(d, "extra: "+p.String())
		}
	}
	for p := range want {
		if !got[p] {
			d = append(d, "missing: "+p.String())
		}
	}
	sort.Strings(d)
	return d
}

// clusterScoped are the resources the backends' rules name that are not
// namespaced: their rules belong in a ClusterRole, every other in a Role.
var clusterScoped = map[string]bool{"apiextensions.k8s.io/customresourcedefinitions": true}

// wantRules is what the registrar of a rendered kustomization uses: the
// kubernetes backend's rules, the EndpointSlice reconciler's, or none.
func wantRules(t *testing.T, p *parts) []rbacv1.PolicyRule {
	t.Helper()
	var reg workload
	for _, w := range p.workloads() {
		if w.name == "aether-registrar" {
			reg = w
		}
	}
	env, err := p.env(&reg.pod.Spec.Containers[0])
	if err != nil {
		t.Fatal(err)
	}
	var rules []rbacv1.PolicyRule
	if env["AETHER_BACKEND"].value == "kubernetes" {
		rules = append(rules, kubestore.RequiredRules()...)
	}
	if env["AETHER_ENDPOINTSLICES"].value == "true" {
		rules = append(rules, endpointslice.RequiredRules()...)
	}
	return rules
}

// grantedRules is what the manifests grant ServiceAccount ns/sa, and a
// problem for every rule in the wrong kind of role.
func grantedRules(p *parts, ns, sa string) ([]rbacv1.PolicyRule, []string) {
	var rules []rbacv1.PolicyRule
	var probs []string
	bound := func(subjects []rbacv1.Subject) bool {
		for _, s := range subjects {
			if s.Kind == "ServiceAccount" && s.Name == sa && s.Namespace == ns {
				return true
			}
		}
		return false
	}
	for _, b := range p.roleBindings {
		if !bound(b.Subjects) {
			continue
		}
		if b.RoleRef.Kind != "Role" {
			probs = append(probs, fmt.Sprintf("RoleBinding %s binds a %s: keep the namespaced grant a Role of its own", b.Name, b.RoleRef.Kind))
			continue
		}
		found := false
		for _, r := range p.roles {
			if r.Name == b.RoleRef.Name && r.Namespace == b.Namespace {
				found = true
				for _, rule := range r.Rules {
					for _, g := range rule.APIGroups {
						for _, res := range rule.Resources {
							if clusterScoped[g+"/"+res] {
								probs = append(probs, fmt.Sprintf("Role %s grants cluster-scoped %s.%s: a Role cannot", r.Name, res, g))
							}
						}
					}
				}
				rules = append(rules, r.Rules...)
			}
		}
		if !found {
			probs = append(probs, fmt.Sprintf("RoleBinding %s: Role %s is not in the manifests", b.Name, b.RoleRef.Name))
		}
	}
	for _, b := range p.cRoleBinds {
		if !bound(b.Subjects) {
			continue
		}
		found := false
		for _, r := range p.cRoles {
			if r.Name == b.RoleRef.Name {
				found = true
				for _, rule := range r.Rules {
					for _, g := range rule.APIGroups {
						for _, res := range rule.Resources {
							if !clusterScoped[g+"/"+res] {
								probs = append(probs, fmt.Sprintf("ClusterRole %s grants %s.%s in every namespace: grant it in the registrar's namespace with a Role", r.Name, res, g))
							}
						}
					}
				}
				rules = append(rules, r.Rules...)
			}
		}
		if !found {
			probs = append(probs, fmt.Sprintf("ClusterRoleBinding %s: ClusterRole %s is not in the manifests", b.Name, b.RoleRef.Name))
		}
	}
	return rules, probs
}

func checkRBAC(t *testing.T, p *parts) []string {
	t.Helper()
	got, probs := grantedRules(p, "aether-system", "aether-registrar")
	return append(probs, diffPermissions(flatten(wantRules(t, p)), flatten(got))...)
}

// The manifests grant the registrar's ServiceAccount exactly what its
// backend and the EndpointSlice reconciler use (their RequiredRules), in
// the right kind of role; on etcd, nothing.
func TestRBACIsExactlyTheBackendsRules(t *testing.T) {
	for _, r := range everything(t) {
		p := typedParts(t, r)
		if probs := checkRBAC(t, p); len(probs) > 0 {
			t.Errorf("%s: the registrar's RBAC:\n  %s", r.dir, strings.Join(probs, "\n  "))
		}
	}
}

func TestRBACCheckCatchesExtraAndMissing(t *testing.T) {
	cases := []struct {
		name string
		dir  string
		edit func(p *parts)
		want string
	}{
		{"extra verb", "overlays/kubernetes", func(p *parts) {
			p.roles[0].Rules[0].Verbs = append(p.roles[0].Rules[0].Verbs, "deletecollection")
		}, "extra: deletecollection aetherendpoints.aether.dev"},
		{"missing verb", "overlays/kubernetes", func(p *parts) {
			p.roles[0].Rules[1].Verbs = p.roles[0].Rules[1].Verbs[1:]
		}, "missing: get leases.coordination.k8s.io"},
		{"crd by any name", "overlays/kubernetes", func(p *parts) { p.cRoles[0].Rules[0].ResourceNames = nil }, "extra: get customresourcedefinitions.apiextensions.k8s.io"},
		{"secrets", "overlays/kubernetes", func(p *parts) {
			p.roles[0].Rules = append(p.roles[0].Rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}})
		}, "extra: get secrets"},
		{"cluster-wide records", "overlays/kubernetes", func(p *parts) {
			p.cRoles[0].Rules = append(p.cRoles[0].Rules, p.roles[0].Rules[0])
		}, "in every namespace"},
		{"rbac on etcd", "overlays/etcd", func(p *parts) {
			k := typedParts(t, render(t, "overlays/kubernetes"))
			p.roles, p.roleBindings = k.roles, k.roleBindings
		}, "extra: create aetherendpoints.aether.dev"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := typedParts(t, render(t, c.dir))
			if probs := checkRBAC(t, p); len(probs) > 0 {
				t.Fatalf("unbroken %s already fails: %v", c.dir, probs)
			}
			c.edit(p)
			probs := checkRBAC(t, p)
			for _, pr := range probs {
				if strings.Contains(pr, c.want) {
					return
				}
			}
			t.Fatalf("want a problem containing %q, got %q", c.want, probs)
		})
	}
}

// The kubernetes component's CRDs are byte copies of the backend's own
// (backend/kubernetes/crds, which the registrar embeds): kustomize will not
// load files outside a kustomization's root, so deploy/ keeps copies.
// Refresh: cp backend/kubernetes/crds/*.yaml deploy/components/kubernetes/crds/
func TestCRDCopiesEqualTheBackends(t *testing.T) {
	src, _ := filepath.Glob("../backend/kubernetes/crds/*.yaml")
	dst, _ := filepath.Glob("components/kubernetes/crds/*.yaml")
	if len(src) == 0 {
		t.Fatal("no CRDs in backend/kubernetes/crds")
	}
	base := func(ps []string) []string {
		var b []string
		for _, p := range ps {
			b = append(b, filepath.Base(p))
		}
		return b
	}
	if fmt.Sprint(base(src)) != fmt.Sprint(base(dst)) {
		t.Fatalf("deploy/components/kubernetes/crds holds %v, the backend %v: cp backend/kubernetes/crds/*.yaml deploy/components/kubernetes/crds/", base(dst), base(src))
	}
	for i := range src {
		a, err := os.ReadFile(src[i])
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(dst[i])
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs from %s: cp backend/kubernetes/crds/*.yaml deploy/components/kubernetes/crds/", dst[i], src[i])
		}
	}
	kust, err := os.ReadFile("components/kubernetes/kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range base(src) {
		if !strings.Contains(string(kust), "crds/"+f) {
			t.Errorf("components/kubernetes/kustomization.yaml does not list crds/%s", f)
		}
	}
}
