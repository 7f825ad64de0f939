package endpointslice

import (
	"fmt"
	"slices"
	"strconv"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
)

var testCfg = Config{Namespace: "ns", Region: "r1", Cluster: "c1", ZoneHints: true}

func sep(ip string, state registryv1.State) *registryv1.ServiceEndpoint {
	return &registryv1.ServiceEndpoint{
		Service: "web", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: ip,
		Ports: []*registryv1.Port{{Name: "http", Port: 8080}},
		Node:  "node-1", Zone: "z1", Region: "r1", Cluster: "c1", State: state,
	}
}

func many(n int) []*registryv1.ServiceEndpoint {
	var eps []*registryv1.ServiceEndpoint
	for i := range n {
		eps = append(eps, sep(fmt.Sprintf("10.0.%d.%d", i/250, 1+i%250), registryv1.State_STATE_SERVING))
	}
	return eps
}

// apply is what the API server makes of a plan: the slices after it,
// each write moving the resourceVersion.
func apply(t *testing.T, c Config, have []*discoveryv1.EndpointSlice, p Plan) []*discoveryv1.EndpointSlice {
	t.Helper()
	byName := map[string]*discoveryv1.EndpointSlice{}
	rv := 0
	for _, s := range have {
		byName[s.Name] = s
		n, _ := strconv.Atoi(s.ResourceVersion)
		rv = max(rv, n)
	}
	next := func() string { rv++; return strconv.Itoa(rv) }
	for _, s := range p.Create {
		if _, ok := byName[s.Name]; ok {
			t.Fatalf("create of %s, which exists", s.Name)
		}
		if s.ResourceVersion != "" {
			t.Fatalf("create of %s carries resourceVersion %s", s.Name, s.ResourceVersion)
		}
		c := s.DeepCopy()
		c.ResourceVersion = next()
		byName[s.Name] = c
	}
	for _, s := range p.Update {
		old, ok := byName[s.Name]
		if !ok || old.ResourceVersion != s.ResourceVersion {
			t.Fatalf("update of %s at resourceVersion %q: not what is stored", s.Name, s.ResourceVersion)
		}
		if old.AddressType != s.AddressType {
			t.Fatalf("update of %s changes the immutable addressType", s.Name)
		}
		c := s.DeepCopy()
		c.ResourceVersion = next()
		byName[s.Name] = c
	}
	for _, s := range p.Delete {
		if old, ok := byName[s.Name]; !ok || old.ResourceVersion != s.ResourceVersion {
			t.Fatalf("delete of %s at a stale resourceVersion", s.Name)
		}
		delete(byName, s.Name)
	}
	var out []*discoveryv1.EndpointSlice
	for _, s := range byName {
		if len(s.Endpoints) > c.max() {
			t.Fatalf("slice %s holds %d endpoints, over %d", s.Name, len(s.Endpoints), c.max())
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b *discoveryv1.EndpointSlice) int { return compareStr(a.Name, b.Name) })
	return out
}

func compareStr(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// converge plans and applies until nothing is left to do, and checks
// that this takes one round.
func converge(t *testing.T, c Config, eps []*registryv1.ServiceEndpoint, have []*discoveryv1.EndpointSlice) ([]*discoveryv1.EndpointSlice, Plan) {
	t.Helper()
	p := c.Plan("web", eps, have)
	after := apply(t, c, have, p)
	if again := c.Plan("web", eps, after); !again.Empty() {
		t.Fatalf("a second plan still writes: %d creates, %d updates, %d deletes", len(again.Create), len(again.Update), len(again.Delete))
	}
	return after, p
}

func published(ss []*discoveryv1.EndpointSlice) map[string]discoveryv1.Endpoint {
	m := map[string]discoveryv1.Endpoint{}
	for _, s := range ss {
		for _, e := range s.Endpoints {
			m[string(s.AddressType)+" "+e.Addresses[0]] = e
		}
	}
	return m
}

func TestConditionsFollowTheState(t *testing.T) {
	ss, _ := converge(t, testCfg, []*registryv1.ServiceEndpoint{
		sep("10.0.0.1", registryv1.State_STATE_SERVING),
		sep("10.0.0.2", registryv1.State_STATE_DRAINING),
	}, nil)
	if len(ss) != 1 {
		t.Fatalf("%d slices, want 1", len(ss))
	}
	s := ss[0]
	for k, v := range map[string]string{
		discoveryv1.LabelServiceName: "web", discoveryv1.LabelManagedBy: ManagedBy,
		LabelRegion: "r1", LabelCluster: "c1",
	} {
		if s.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, s.Labels[k], v)
		}
	}
	if s.Namespace != "ns" || s.AddressType != discoveryv1.AddressTypeIPv4 {
		t.Errorf("namespace %q address type %q", s.Namespace, s.AddressType)
	}
	if len(s.Ports) != 1 || *s.Ports[0].Name != "http" || *s.Ports[0].Port != 8080 || *s.Ports[0].Protocol != "TCP" || *s.Ports[0].AppProtocol != "http" {
		t.Errorf("ports %+v", s.Ports)
	}
	eps := published(ss)
	for _, tc := range []struct {
		ip                          string
		ready, serving, terminating bool
		hinted                      bool
	}{
		{"10.0.0.1", true, true, false, true},
		{"10.0.0.2", false, true, true, false}, // a draining endpoint is not hinted, as the controller hints only ready ones
	} {
		e, ok := eps["IPv4 "+tc.ip]
		if !ok {
			t.Fatalf("%s not published", tc.ip)
		}
		c := e.Conditions
		if *c.Ready != tc.ready || *c.Serving != tc.serving || *c.Terminating != tc.terminating {
			t.Errorf("%s: ready=%v serving=%v terminating=%v, want %v %v %v", tc.ip, *c.Ready, *c.Serving, *c.Terminating, tc.ready, tc.serving, tc.terminating)
		}
		if *e.Zone != "z1" || *e.NodeName != "node-1" {
			t.Errorf("%s: zone %v node %v", tc.ip, e.Zone, e.NodeName)
		}
		if hinted := e.Hints != nil && len(e.Hints.ForZones) == 1 && e.Hints.ForZones[0].Name == "z1"; hinted != tc.hinted {
			t.Errorf("%s: hints %+v, want hinted=%v", tc.ip, e.Hints, tc.hinted)
		}
	}
}

func TestEndpointAttributes(t *testing.T) {
	grpc := sep("fd00::1", registryv1.State_STATE_SERVING)
	grpc.Protocol = registryv1.Protocol_PROTOCOL_GRPC
	grpc.Node = "Node_7" // not a Kubernetes node name
	tcp := sep("10.0.0.9", registryv1.State_STATE_SERVING)
	tcp.Protocol = registryv1.Protocol_PROTOCOL_TCP
	tcp.Zone = ""
	noHints := testCfg
	noHints.ZoneHints = false
	ss, _ := converge(t, testCfg, []*registryv1.ServiceEndpoint{grpc, tcp}, nil)
	if len(ss) != 2 {
		t.Fatalf("%d slices, want 2 (one per address type)", len(ss))
	}
	eps := published(ss)
	if e := eps["IPv6 fd00::1"]; e.NodeName != nil {
		t.Errorf("node %q published as a node name", *e.NodeName)
	}
	if e := eps["IPv4 10.0.0.9"]; e.Zone != nil || e.Hints != nil {
		t.Errorf("endpoint without a zone has zone %v hints %v", e.Zone, e.Hints)
	}
	for _, s := range ss {
		want := map[discoveryv1.AddressType]*string{discoveryv1.AddressTypeIPv6: ptr("grpc"), discoveryv1.AddressTypeIPv4: nil}[s.AddressType]
		if got := s.Ports[0].AppProtocol; (got == nil) != (want == nil) || got != nil && *got != *want {
			t.Errorf("%s: appProtocol %v, want %v", s.AddressType, got, want)
		}
	}
	ss, _ = converge(t, noHints, []*registryv1.ServiceEndpoint{grpc}, nil)
	if e := published(ss)["IPv6 fd00::1"]; e.Hints != nil {
		t.Errorf("hints %+v with ZoneHints off", e.Hints)
	}
}

func TestSkips(t *testing.T) {
	loop := sep("127.0.0.1", registryv1.State_STATE_SERVING)
	ll := sep("fe80::1", registryv1.State_STATE_SERVING)
	badPort := sep("10.0.0.3", registryv1.State_STATE_SERVING)
	badPort.Ports = []*registryv1.Port{{Name: "http", Port: 80}, {Name: "Admin_Port", Port: 9000}}
	onlyBad := sep("10.0.0.4", registryv1.State_STATE_SERVING)
	onlyBad.Ports = []*registryv1.Port{{Name: "A.B", Port: 80}}
	// The same IP under two protocols with the same ports and
	// appProtocol (UNSPECIFIED and TCP both set none): one is published,
	// the serving one.
	dupA := sep("10.0.0.5", registryv1.State_STATE_DRAINING)
	dupA.Protocol = registryv1.Protocol_PROTOCOL_UNSPECIFIED
	dupB := sep("10.0.0.5", registryv1.State_STATE_SERVING)
	dupB.Protocol = registryv1.Protocol_PROTOCOL_TCP
	ss, p := converge(t, testCfg, []*registryv1.ServiceEndpoint{loop, ll, badPort, onlyBad, dupA, dupB}, nil)
	got := map[string]Reason{}
	for _, s := range p.Skipped {
		got[s.IP+" "+string(s.Reason)] = s.Reason
	}
	for _, want := range []string{"127.0.0.1 address", "fe80::1 address", "10.0.0.3 port_name", "10.0.0.4 no_valid_ports", "10.0.0.5 duplicate_address"} {
		if _, ok := got[want]; !ok {
			t.Errorf("no skip %q in %+v", want, p.Skipped)
		}
	}
	eps := published(ss)
	if len(eps) != 2 {
		t.Fatalf("published %v, want 10.0.0.3 (without its bad port) and 10.0.0.5", eps)
	}
	if e := eps["IPv4 10.0.0.5"]; !*e.Conditions.Ready {
		t.Errorf("the draining duplicate won over the serving one")
	}
	for _, s := range ss {
		for _, port := range s.Ports {
			if *port.Name == "Admin_Port" {
				t.Errorf("slice %s publishes the invalid port name", s.Name)
			}
		}
	}
}

func TestPacksAtMostMaxPerSlice(t *testing.T) {
	ss, p := converge(t, testCfg, many(250), nil)
	if len(p.Create) != 3 || len(ss) != 3 {
		t.Fatalf("%d creates, %d slices; want 3 (100+100+50)", len(p.Create), len(ss))
	}
	total := 0
	for _, s := range ss {
		total += len(s.Endpoints)
	}
	if total != 250 {
		t.Fatalf("%d endpoints published, want 250", total)
	}
	c := testCfg
	c.MaxEndpointsPerSlice = 7
	ss, _ = converge(t, c, many(50), nil)
	for _, s := range ss {
		if len(s.Endpoints) > 7 {
			t.Fatalf("slice of %d with a limit of 7", len(s.Endpoints))
		}
	}
	if len(ss) != 8 {
		t.Errorf("%d slices of 7 for 50 endpoints, want 8", len(ss))
	}
}

// Churn: a change touches the slices that hold what changed, no others.
func TestChangesTouchOnlyTheirSlice(t *testing.T) {
	eps := many(250)
	ss, _ := converge(t, testCfg, eps, nil)
	holder := func(ss []*discoveryv1.EndpointSlice, ip string) string {
		for _, s := range ss {
			for _, e := range s.Endpoints {
				if e.Addresses[0] == ip {
					return s.Name
				}
			}
		}
		return ""
	}

	// Drain one: one update, of its slice.
	drained := slices.Clone(eps)
	drained[42] = sep(eps[42].Ip, registryv1.State_STATE_DRAINING)
	p := testCfg.Plan("web", drained, ss)
	if len(p.Create)+len(p.Delete) != 0 || len(p.Update) != 1 || p.Update[0].Name != holder(ss, eps[42].Ip) {
		t.Fatalf("drain: %d creates %d updates %d deletes", len(p.Create), len(p.Update), len(p.Delete))
	}
	ss = apply(t, testCfg, ss, p)

	// Remove one: one update.
	removed := slices.Delete(slices.Clone(drained), 10, 11)
	p = testCfg.Plan("web", removed, ss)
	if len(p.Create)+len(p.Delete) != 0 || len(p.Update) != 1 || p.Update[0].Name != holder(ss, eps[10].Ip) {
		t.Fatalf("remove: %d creates %d updates %d deletes", len(p.Create), len(p.Update), len(p.Delete))
	}
	ss = apply(t, testCfg, ss, p)

	// Add one: into a slice with room, no new slice.
	added := append(slices.Clone(removed), sep("10.9.9.9", registryv1.State_STATE_SERVING))
	p = testCfg.Plan("web", added, ss)
	if len(p.Create)+len(p.Delete) != 0 || len(p.Update) != 1 {
		t.Fatalf("add: %d creates %d updates %d deletes", len(p.Create), len(p.Update), len(p.Delete))
	}
	ss = apply(t, testCfg, ss, p)
	if len(ss) != 3 || holder(ss, "10.9.9.9") == "" {
		t.Fatalf("after add: %d slices, 10.9.9.9 in %q", len(ss), holder(ss, "10.9.9.9"))
	}

	// Everything else stayed where it was.
	before, _ := converge(t, testCfg, eps, nil)
	for _, e := range eps[100:110] {
		if a, b := holder(before, e.Ip), holder(ss, e.Ip); a != b {
			t.Errorf("%s moved from %s to %s", e.Ip, a, b)
		}
	}

	// Remove all: every slice deleted (no placeholder).
	p = testCfg.Plan("web", nil, ss)
	if len(p.Delete) != 3 || len(p.Create)+len(p.Update) != 0 {
		t.Fatalf("remove all: %d creates %d updates %d deletes", len(p.Create), len(p.Update), len(p.Delete))
	}
}

// A port change of every endpoint rewrites the slices in place: the
// controller's finalize turns create+delete into an update.
func TestPortChangeUpdatesInPlace(t *testing.T) {
	eps := many(30)
	ss, _ := converge(t, testCfg, eps, nil)
	for _, e := range eps {
		e.Ports[0].Port = 9090
	}
	after, p := converge(t, testCfg, eps, ss)
	if len(p.Create)+len(p.Delete) != 0 || len(p.Update) != 1 {
		t.Fatalf("%d creates %d updates %d deletes, want one update", len(p.Create), len(p.Update), len(p.Delete))
	}
	if after[0].Name != ss[0].Name || *after[0].Ports[0].Port != 9090 {
		t.Fatalf("slice %s ports %d", after[0].Name, *after[0].Ports[0].Port)
	}
}

func TestOtherSlicesAreNeverTouched(t *testing.T) {
	foreign := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "web-abcde", Namespace: "ns", ResourceVersion: "1", Labels: map[string]string{
			discoveryv1.LabelServiceName: "web", discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io",
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.1"}}},
	}
	otherOrigin := foreign.DeepCopy()
	otherOrigin.Name = "web-other"
	otherOrigin.Labels = (Config{Region: "r2", Cluster: "c1"}).Labels("web")
	p := testCfg.Plan("web", many(3), []*discoveryv1.EndpointSlice{foreign, otherOrigin})
	for _, s := range append(append(p.Create, p.Update...), p.Delete...) {
		if s.Name == foreign.Name || s.Name == otherOrigin.Name {
			t.Fatalf("plan writes %s, which is not this origin's", s.Name)
		}
	}
	if len(p.Create) != 1 {
		t.Fatalf("%d creates, want 1", len(p.Create))
	}
}

// A slice over the limit (it was raised before) is trimmed; duplicates
// left by an earlier, interrupted write are dropped from the later slice.
func TestRepairsOverfullAndDuplicates(t *testing.T) {
	big := testCfg
	big.MaxEndpointsPerSlice = 150
	eps := many(150)
	ss, _ := converge(t, big, eps, nil)
	if len(ss) != 1 || len(ss[0].Endpoints) != 150 {
		t.Fatalf("setup: %d slices", len(ss))
	}
	dup := ss[0].DeepCopy()
	dup.Name = testCfg.namePrefix("web") + "9"
	dup.Endpoints = dup.Endpoints[:5]
	after, _ := converge(t, testCfg, eps, append(ss, dup))
	seen := map[string]bool{}
	for _, s := range after {
		for _, e := range s.Endpoints {
			if seen[e.Addresses[0]] {
				t.Fatalf("%s published twice", e.Addresses[0])
			}
			seen[e.Addresses[0]] = true
		}
	}
	if len(seen) != 150 {
		t.Fatalf("%d published, want 150", len(seen))
	}
}

func TestServiceName(t *testing.T) {
	for name, ok := range map[string]bool{
		"web": true, "web-2": true, "a": true,
		"Web": false, "web_2": false, "web.v1": false, "2web": false, "-web": false,
		"a234567890123456789012345678901234567890123456789012345678901234": false, // 64
	} {
		if err := ServiceName(name); (err == nil) != ok {
			t.Errorf("ServiceName(%q) = %v, want ok=%v", name, err, ok)
		}
	}
}

func TestLabelValueOfLongNames(t *testing.T) {
	long := "region-" + string(make([]byte, 0)) + fmt.Sprintf("%0100d", 7)
	v := labelValue(long)
	if len(v) > 63 || v == labelValue(long+"8") {
		t.Fatalf("labelValue(%d chars) = %q", len(long), v)
	}
	if labelValue("eu-west") != "eu-west" {
		t.Fatalf("a short name is changed")
	}
}
