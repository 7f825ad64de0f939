package xds

import (
	"slices"
	"strings"
	"sync"
	"testing"

	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
)

func TestServiceOf(t *testing.T) {
	t.Parallel()
	for name, want := range map[string]string{
		"web": "web", "web:grpc": "web", "xds:///web": "web", "xds:///web:admin": "web",
		"*": "", "": "", "xdstp://auth/envoy.config.listener.v3.Listener/web": "", ":grpc": "", "-web": "",
	} {
		if got := serviceOf(name); got != want {
			t.Errorf("serviceOf(%q) = %q, want %q", name, got, want)
		}
	}
}

// recorder is a Demand that logs its calls in order.
type recorder struct {
	mu    sync.Mutex
	calls []string
}

func (r *recorder) Want(s string)   { r.mu.Lock(); r.calls = append(r.calls, "+"+s); r.mu.Unlock() }
func (r *recorder) Unwant(s string) { r.mu.Lock(); r.calls = append(r.calls, "-"+s); r.mu.Unlock() }
func (r *recorder) take() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.calls
	r.calls = nil
	slices.Sort(c)
	return strings.Join(c, " ")
}

// A service is wanted from the first stream that names it (under any
// type, by any target of it) until the last one stops naming it.
func TestDemandCountsStreamsPerService(t *testing.T) {
	t.Parallel()
	r := &recorder{}
	d := newDemand(r)
	sotw := func(id int64, typ string, names ...string) {
		d.sotw(id, &discoverygrpc.DiscoveryRequest{TypeUrl: typ, ResourceNames: names})
	}
	step := func(what, want string) {
		t.Helper()
		if got := r.take(); got != want {
			t.Fatalf("%s: calls %q, want %q", what, got, want)
		}
	}

	sotw(1, resourcev3.ListenerType, "web")
	step("stream 1 asks for web's Listener", "+web")
	sotw(1, resourcev3.ListenerType, "web")
	sotw(1, resourcev3.ClusterType, "web")
	step("an ACK and web's Cluster", "")
	sotw(2, resourcev3.ListenerType) // wildcard
	sotw(2, resourcev3.ClusterType, "*")
	step("a wildcard stream", "")
	d.delta(3, &discoverygrpc.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"web:grpc", "api"}})
	step("delta stream 3 subscribes to web:grpc and api", "+api")
	sotw(1, resourcev3.ListenerType, "db")
	step("stream 1's Listeners are now db alone (its Cluster still names web)", "+db")
	sotw(1, resourcev3.ClusterType, "db")
	step("stream 1 drops web's Cluster; stream 3 still names web", "")
	d.delta(3, &discoverygrpc.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResourceNamesUnsubscribe: []string{"web:grpc"}})
	step("stream 3 unsubscribes web:grpc", "-web")
	d.closed(3)
	step("stream 3 closes", "-api")
	d.delta(4, &discoverygrpc.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, InitialResourceVersions: map[string]string{"api": "v1"}})
	step("a reconnecting delta stream holding api", "+api")
	d.closed(1)
	d.closed(4)
	d.closed(2)
	step("every stream closes", "-api -db")

	var none *demand // Config.Demand unset: every call is a no-op
	none.sotw(1, &discoverygrpc.DiscoveryRequest{ResourceNames: []string{"web"}})
	none.closed(1)
}

// A feed without a Source is driven by Apply: its first call sets the
// snapshots even when empty, so waiting clients get a first answer.
func TestFeedApplyWithoutASource(t *testing.T) {
	t.Parallel()
	own := Locality{Region: "r1", Zone: "z1"}
	f, err := NewFeed(FeedConfig{Own: own, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	f.Start() // no-op without a Source
	defer f.Close()
	if eds, _, _ := held(t, f, own); eds != nil {
		t.Fatalf("a snapshot before any Apply: %v", eds)
	}
	f.Apply(nil)
	eds, _, v1 := held(t, f, own)
	if eds == nil || len(eds) != 0 || v1 == "" {
		t.Fatalf("after an empty first Apply: %v, version %q; want an empty, versioned snapshot", eds, v1)
	}
	web := func(ip string) *registryv1.ServiceEndpoint {
		return &registryv1.ServiceEndpoint{Service: "web", Protocol: registryv1.Protocol_PROTOCOL_GRPC, Ip: ip, Region: "r1", Cluster: "c1",
			Zone: "z1", State: registryv1.State_STATE_SERVING, Ports: []*registryv1.Port{{Name: "grpc", Port: 8080}}}
	}
	add := registrarv1.EndpointEvent_ENDPOINT_ADDED
	f.Apply([]*registrarv1.EndpointEvent{{Type: add, Endpoint: web("10.0.0.1")}, {Type: add, Endpoint: web("10.0.0.2")}})
	eds, _, v2 := held(t, f, own)
	if eds["web"] != "10.0.0.1@p0 10.0.0.2@p0" || v2 == v1 {
		t.Fatalf("after two adds: %v, version %q (was %q)", eds, v2, v1)
	}
	f.Apply([]*registrarv1.EndpointEvent{{Type: registrarv1.EndpointEvent_ENDPOINT_REMOVED, Endpoint: web("10.0.0.1")}})
	if eds, _, _ := held(t, f, own); eds["web"] != "10.0.0.2@p0" {
		t.Fatalf("after a removal: %v", eds)
	}
}
