package registry

import (
	"strings"
	"testing"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
)

func TestEndpointKeyLayout(t *testing.T) {
	id := EndpointID{Region: "eu-west", Cluster: "c1", Service: "payments", Protocol: registryv1.Protocol_PROTOCOL_GRPC, IP: "10.0.0.7"}
	k, err := id.Key()
	if err != nil {
		t.Fatal(err)
	}
	want := "/aether/v1/regions/eu-west/clusters/c1/services/payments/protocols/grpc/endpoints/10.0.0.7"
	if k != want {
		t.Fatalf("key = %q, want %q", k, want)
	}
	if !strings.HasPrefix(k, ClusterPrefix("eu-west", "c1")) || !strings.HasPrefix(k, RegionPrefix("eu-west")) {
		t.Fatalf("key %q is not under its region/cluster prefixes", k)
	}
	back, err := ParseEndpointKey(k)
	if err != nil || back != id {
		t.Fatalf("ParseEndpointKey(%q) = %+v, %v; want %+v", k, back, err, id)
	}
	v6 := id
	v6.IP = "fd00::1"
	k6, err := v6.Key()
	if err != nil || !strings.HasSuffix(k6, "/endpoints/fd00::1") {
		t.Fatalf("v6 key = %q, %v", k6, err)
	}
}

func TestKeyRejectsEscapes(t *testing.T) {
	base := EndpointID{Region: "r", Cluster: "c", Service: "s", Protocol: registryv1.Protocol_PROTOCOL_TCP, IP: "10.0.0.1"}
	cases := map[string]func(*EndpointID){
		"slash in service":     func(id *EndpointID) { id.Service = "a/b" },
		"dotdot service":       func(id *EndpointID) { id.Service = ".." },
		"dot service":          func(id *EndpointID) { id.Service = "." },
		"nul in cluster":       func(id *EndpointID) { id.Cluster = "c\x00" },
		"empty region":         func(id *EndpointID) { id.Region = "" },
		"long service":         func(id *EndpointID) { id.Service = strings.Repeat("a", MaxNameLen+1) },
		"ip with slash":        func(id *EndpointID) { id.IP = "10.0.0.1/32" },
		"non canonical ip":     func(id *EndpointID) { id.IP = "fd00:0::1" },
		"unspecified protocol": func(id *EndpointID) { id.Protocol = registryv1.Protocol_PROTOCOL_UNSPECIFIED },
		"unknown protocol":     func(id *EndpointID) { id.Protocol = 42 },
		"inner dotdot":         func(id *EndpointID) { id.Region = "a..b" },
		"space":                func(id *EndpointID) { id.Cluster = "a b" },
	}
	for name, mut := range cases {
		t.Run(name, func(t *testing.T) {
			id := base
			mut(&id)
			if k, err := id.Key(); err == nil {
				t.Fatalf("Key() = %q, want an error", k)
			}
		})
	}
}

func TestParseEndpointKeyRejects(t *testing.T) {
	for _, k := range []string{
		"",
		"/aether/v1/regions/",
		"/aether/services/s/protocols/grpc/endpoints/10.0.0.1",
		"/aether/v1/regions/r/clusters/c/services/s/protocols/grpc/endpoints/10.0.0.1/extra",
		"/aether/v1/regions/r/clusters/c/services/s/protocols/smtp/endpoints/10.0.0.1",
		"/aether/v1/regions/r/clusters/c/nodes/n1",
		"/aether/v1/regions/r/clusters/c/services/../protocols/grpc/endpoints/10.0.0.1",
		"/aether/v1/regions/r/clusters/c/services/s/protocols/grpc/endpoints/010.0.0.1",
	} {
		if id, err := ParseEndpointKey(k); err == nil {
			t.Errorf("ParseEndpointKey(%q) = %+v, want error", k, id)
		}
	}
}

func TestCodecChecksKey(t *testing.T) {
	ep := &registryv1.ServiceEndpoint{Service: "s", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: "10.1.2.3", Region: "r", Cluster: "c",
		Ports: []*registryv1.Port{{Name: "http", Port: 80}}}
	k, _ := IDOf(ep).Key()
	b, err := EncodeEndpoint(ep)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeEndpoint(k, b)
	if err != nil || got.GetPorts()[0].GetPort() != 80 {
		t.Fatalf("round trip: %v %v", got, err)
	}
	other, _ := EndpointID{Region: "r", Cluster: "c", Service: "s", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, IP: "10.1.2.4"}.Key()
	if _, err := DecodeEndpoint(other, b); err == nil {
		t.Fatal("value under the wrong key decoded without error")
	}
	if _, err := DecodeEndpoint(k, []byte{0xff, 0xff}); err == nil {
		t.Fatal("garbage decoded without error")
	}
}

func TestNodeKeyLayout(t *testing.T) {
	id := NodeID{Region: "eu", Cluster: "c1", Name: "node-7"}
	k, err := id.Key()
	if err != nil || k != "/aether/v1/regions/eu/clusters/c1/nodes/node-7" {
		t.Fatalf("key = %q, %v", k, err)
	}
	if back, err := ParseNodeKey(k); err != nil || back != id {
		t.Fatalf("ParseNodeKey = %+v, %v", back, err)
	}
	if IsEndpointKey(k) || !IsNodeKey(k) {
		t.Fatal("node key misclassified")
	}
	// Names that are segment names elsewhere in the schema.
	for _, eid := range []EndpointID{
		{Region: "eu", Cluster: "c1", Service: "nodes", Protocol: registryv1.Protocol_PROTOCOL_TCP, IP: "10.0.0.1"},
		{Region: "eu", Cluster: "nodes", Service: "nodes", Protocol: registryv1.Protocol_PROTOCOL_TCP, IP: "10.0.0.1"},
	} {
		ek, err := eid.Key()
		if err != nil {
			t.Fatal(err)
		}
		if !IsEndpointKey(ek) || IsNodeKey(ek) {
			t.Errorf("endpoint key %q misclassified as a node key", ek)
		}
	}
	for _, nid := range []NodeID{{Region: "eu", Cluster: "services", Name: "endpoints"}, {Region: "eu", Cluster: "nodes", Name: "nodes"}} {
		nk, err := nid.Key()
		if err != nil {
			t.Fatal(err)
		}
		if IsEndpointKey(nk) || !IsNodeKey(nk) {
			t.Errorf("node key %q misclassified", nk)
		}
	}
	for _, bad := range []string{"/aether/v1/regions/eu/clusters/c1/nodes/", "/aether/v1/regions/eu/clusters/c1/nodes/a/b", "/aether/v1/regions/eu/clusters/c1/nodes/.."} {
		if _, err := ParseNodeKey(bad); err == nil {
			t.Errorf("ParseNodeKey(%q) accepted", bad)
		}
	}
	if _, err := (NodeID{Region: "eu", Cluster: "c1", Name: "a/b"}).Key(); err == nil {
		t.Fatal("slash in node name accepted")
	}
}

func TestNormalizeNode(t *testing.T) {
	n, err := NormalizeNode(&registryv1.Node{Name: "n1", Region: "r", Cluster: "c", Address: "::ffff:10.0.0.1",
		Services: []string{"web", "db", "web"}, LeaseId: 42}, DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	if n.Address != "10.0.0.1" || len(n.Services) != 2 || n.Services[0] != "db" || n.LeaseId != 0 || n.Health.Status != registryv1.Health_HEALTH_HEALTHY {
		t.Fatalf("normalized = %v", n)
	}
	for name, bad := range map[string]*registryv1.Node{
		"no name":     {Region: "r", Cluster: "c"},
		"bad address": {Name: "n", Region: "r", Cluster: "c", Address: "x"},
		"bad service": {Name: "n", Region: "r", Cluster: "c", Services: []string{"a/b"}},
		"bad label":   {Name: "n", Region: "r", Cluster: "c", Labels: map[string]string{"a b": "c"}},
		"bad health":  {Name: "n", Region: "r", Cluster: "c", Health: &registryv1.HealthSummary{Status: 9}},
	} {
		if _, err := NormalizeNode(bad, DefaultLimits); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
