package registry

import (
	"fmt"
	"strings"
	"testing"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
)

func validEndpoint() *registryv1.ServiceEndpoint {
	return &registryv1.ServiceEndpoint{
		Service: "web", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: "10.0.0.1",
		Ports: []*registryv1.Port{{Port: 8080}}, Region: "r", Cluster: "c",
	}
}

func TestNormalizeDefaults(t *testing.T) {
	in := validEndpoint()
	in.Ip = "::ffff:10.0.0.1"
	ep, err := NormalizeEndpoint(in, DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	if ep.Ip != "10.0.0.1" || ep.State != registryv1.State_STATE_SERVING || ep.Weight != 1 || ep.Ports[0].Name != "http" {
		t.Fatalf("normalized = %v", ep)
	}
	if in.Ip != "::ffff:10.0.0.1" || in.Ports[0].Name != "" {
		t.Fatal("NormalizeEndpoint modified its input")
	}
}

func TestNormalizeRejects(t *testing.T) {
	bigMeta := map[string]string{}
	for i := 0; i < DefaultLimits.MaxMetadataEntries+1; i++ {
		bigMeta[fmt.Sprintf("k%d", i)] = "v"
	}
	heavyMeta := map[string]string{} // 20 entries of 4+250 bytes: 5080 bytes
	for i := 0; i < 20; i++ {
		heavyMeta[fmt.Sprintf("k%03d", i)] = strings.Repeat("v", 250)
	}
	cases := []struct {
		name  string
		mut   func(*registryv1.ServiceEndpoint)
		field string
		msg   string
	}{
		{"empty service", func(e *registryv1.ServiceEndpoint) { e.Service = "" }, "endpoint.service", "must not be empty"},
		{"slash service", func(e *registryv1.ServiceEndpoint) { e.Service = "a/b" }, "endpoint.service", "must not contain '/'"},
		{"nul service", func(e *registryv1.ServiceEndpoint) { e.Service = "a\x00b" }, "endpoint.service", "NUL"},
		{"long service", func(e *registryv1.ServiceEndpoint) { e.Service = strings.Repeat("x", 200) }, "endpoint.service", "limit is 128"},
		{"bad ip", func(e *registryv1.ServiceEndpoint) { e.Ip = "10.0.0.256" }, "endpoint.ip", "not an IPv4 or IPv6"},
		{"empty ip", func(e *registryv1.ServiceEndpoint) { e.Ip = "" }, "endpoint.ip", "must not be empty"},
		{"unspecified ip", func(e *registryv1.ServiceEndpoint) { e.Ip = "0.0.0.0" }, "endpoint.ip", "unspecified"},
		{"zoned ip", func(e *registryv1.ServiceEndpoint) { e.Ip = "fe80::1%eth0" }, "endpoint.ip", "zone"},
		{"no ports", func(e *registryv1.ServiceEndpoint) { e.Ports = nil }, "endpoint.ports", "at least one"},
		{"port 0", func(e *registryv1.ServiceEndpoint) { e.Ports[0].Port = 0 }, "endpoint.ports[0].port", "0 is not a port"},
		{"port 70000", func(e *registryv1.ServiceEndpoint) { e.Ports[0].Port = 70000 }, "endpoint.ports[0].port", "70000 is not a port"},
		{"dup port names", func(e *registryv1.ServiceEndpoint) {
			e.Ports = []*registryv1.Port{{Name: "a", Port: 1}, {Name: "a", Port: 2}}
		}, "endpoint.ports[1].name", "duplicate"},
		{"unnamed of two", func(e *registryv1.ServiceEndpoint) {
			e.Ports = []*registryv1.Port{{Name: "a", Port: 1}, {Port: 2}}
		}, "endpoint.ports[1].name", "more than one port"},
		{"unspecified protocol", func(e *registryv1.ServiceEndpoint) { e.Protocol = 0 }, "endpoint.protocol", "must be set"},
		{"unknown protocol", func(e *registryv1.ServiceEndpoint) { e.Protocol = 9 }, "endpoint.protocol", "unknown protocol 9"},
		{"unknown state", func(e *registryv1.ServiceEndpoint) { e.State = 7 }, "endpoint.state", "unknown state 7"},
		{"too many metadata", func(e *registryv1.ServiceEndpoint) { e.Metadata = bigMeta }, "endpoint.metadata", "33 entries exceed the limit of 32 (--max-metadata-entries)"},
		{"heavy metadata", func(e *registryv1.ServiceEndpoint) { e.Metadata = heavyMeta }, "endpoint.metadata", "5080 bytes of keys and values exceed the limit of 4096 (--max-metadata-bytes)"},
		{"long metadata value", func(e *registryv1.ServiceEndpoint) { e.Metadata = map[string]string{"k": strings.Repeat("v", 300)} }, "endpoint.metadata", "300 bytes"},
		{"bad metadata key", func(e *registryv1.ServiceEndpoint) { e.Metadata = map[string]string{"a b": "v"} }, "endpoint.metadata", "contains"},
		{"slash node", func(e *registryv1.ServiceEndpoint) { e.Node = "n/1" }, "endpoint.node", "'/'"},
		{"bad zone", func(e *registryv1.ServiceEndpoint) { e.Zone = "-z" }, "endpoint.zone", "start and end"},
		{"weight", func(e *registryv1.ServiceEndpoint) { e.Weight = 1 << 20 }, "endpoint.weight", "exceeds"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ep := validEndpoint()
			c.mut(ep)
			_, err := NormalizeEndpoint(ep, DefaultLimits)
			fe, ok := err.(*FieldError)
			if !ok {
				t.Fatalf("err = %v, want *FieldError", err)
			}
			if fe.Field != c.field || !strings.Contains(fe.Reason, c.msg) {
				t.Fatalf("err = %q (field %q), want field %q containing %q", fe.Error(), fe.Field, c.field, c.msg)
			}
		})
	}
}

func TestSameAttributes(t *testing.T) {
	a, _ := NormalizeEndpoint(validEndpoint(), DefaultLimits)
	b, _ := NormalizeEndpoint(validEndpoint(), DefaultLimits)
	if !SameAttributes(a, b) {
		t.Fatal("equal endpoints differ")
	}
	b.State = registryv1.State_STATE_DRAINING
	if SameAttributes(a, b) {
		t.Fatal("state change not seen")
	}
	c, _ := NormalizeEndpoint(validEndpoint(), DefaultLimits)
	c.Metadata = map[string]string{"x": "y"}
	if SameAttributes(a, c) {
		t.Fatal("metadata change not seen")
	}
}
