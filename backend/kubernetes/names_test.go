package kubernetes

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

func TestObjectNamesAreValidAndKeyDistinct(t *testing.T) {
	keys := map[string]string{
		"/aether/v1/regions/r1/clusters/c1/services/web/protocols/http1/endpoints/10.0.0.1": "web",
		"/aether/v1/regions/r1/clusters/c1/services/Web/protocols/http1/endpoints/10.0.0.1": "Web",
		"/aether/v1/regions/r1/clusters/c1/services/a_b.C-d/protocols/tcp/endpoints/::1":    "a_b.C-d",
		"/aether/v1/regions/r1/clusters/c1/services/x/protocols/tcp/endpoints/::1":          strings.Repeat("Long_Service.", 10),
		"/aether/v1/regions/r1/clusters/c1/services/_/protocols/tcp/endpoints/::1":          "___",
	}
	seen := map[string]string{}
	for key, svc := range keys {
		name := EndpointObjectName(key, svc)
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			t.Errorf("name %q of %s is not a valid object name: %v", name, key, errs)
		}
		if len(name) > 63 {
			t.Errorf("name %q of %s is %d long; want it short enough to read", name, key, len(name))
		}
		if other, dup := seen[name]; dup {
			t.Errorf("keys %s and %s share the name %s", key, other, name)
		}
		seen[name] = key
		if EndpointObjectName(key, svc) != name {
			t.Errorf("name of %s is not deterministic", key)
		}
	}
	if got := EndpointObjectName("/k", "Web.Front_end"); !strings.HasPrefix(got, "ep-web-front-end-") {
		t.Errorf("readable part of %q: want ep-web-front-end-<hash>", got)
	}
	if n := NodeObjectName("/k", "node-1"); !strings.HasPrefix(n, "node-node-1-") || validation.IsDNS1123Subdomain(n) != nil {
		t.Errorf("node name %q", n)
	}
}

func TestCRDsDecode(t *testing.T) {
	crds, err := CRDs()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range crds {
		names = append(names, c.GetName())
		if c.GetAnnotations()[crdRevisionAnnotation] == "" {
			t.Errorf("%s has no %s annotation", c.GetName(), crdRevisionAnnotation)
		}
	}
	if strings.Join(names, ",") != "aetherendpoints.aether.dev,aethernodes.aether.dev" {
		t.Fatalf("CRDs %v", names)
	}
}

func TestParseRV(t *testing.T) {
	for rv, want := range map[string]int64{"1": 1, "123456789": 123456789} {
		if got, err := parseRV(rv); err != nil || got != want {
			t.Errorf("parseRV(%q) = %d, %v", rv, got, err)
		}
	}
	for _, rv := range []string{"", "0", "01", "abc", "1.5", "-3", "99999999999999999999"} {
		if _, err := parseRV(rv); err == nil {
			t.Errorf("parseRV(%q) accepted a resource version that is not a positive int64", rv)
		}
	}
}
