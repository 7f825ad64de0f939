package kubernetes

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/registry"
)

// everyField fails when m has a field unset, so that a field added to the
// proto and not to the object mapping (crd.go, crds/) makes the round-trip
// tests fail instead of being dropped in storage.
func everyField(t *testing.T, m proto.Message) {
	t.Helper()
	r := m.ProtoReflect()
	fields := r.Descriptor().Fields()
	for i := 0; i < fields.Len(); i++ {
		f := fields.Get(i)
		if !r.Has(f) {
			t.Fatalf("%s.%s is not set in the test value: map it in crd.go and the CRD schema, then set it here", r.Descriptor().Name(), f.Name())
		}
		if f.Kind() == protoreflect.MessageKind && !f.IsList() && !f.IsMap() {
			if sub := r.Get(f).Message().Interface(); sub.ProtoReflect().Descriptor().FullName() != "google.protobuf.Timestamp" {
				everyField(t, sub)
			}
		}
	}
}

func fullEndpoint() *registryv1.ServiceEndpoint {
	return &registryv1.ServiceEndpoint{
		Service: "web", Protocol: registryv1.Protocol_PROTOCOL_GRPC, Ip: "2001:db8::1",
		Ports: []*registryv1.Port{{Name: "grpc", Port: 9090}, {Port: 9091}},
		Node:  "n1", Cluster: "c1", Region: "r1", Zone: "z1", State: registryv1.State_STATE_DRAINING,
		Weight: 7, Metadata: map[string]string{"a": "b", "version": "1.2"},
		CreatedAt: timestamppb.New(time.Date(2026, 12, 2, 3, 4, 5, 123456789, time.UTC)),
		UpdatedAt: timestamppb.New(time.Date(2026, 12, 2, 3, 4, 6, 1, time.UTC)),
		Stamp:     &registryv1.WriteStamp{Hlc: 1<<62 + 5, Writer: "replica-a"},
	}
}

func TestEndpointRoundTrip(t *testing.T) {
	ep := fullEndpoint()
	everyField(t, ep)
	key, err := registry.IDOf(ep).Key()
	if err != nil {
		t.Fatal(err)
	}
	spec, err := endpointSpecOf(key, ep)
	if err != nil {
		t.Fatal(err)
	}
	u, err := toUnstructured(&endpointObject{ObjectMeta: recordMeta(EndpointObjectName(key, ep.Service), key), Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	u.SetResourceVersion("42")
	d := decodeEndpointObject(u)
	if d.err != nil || d.rev != 42 || d.tomb || d.fence || !proto.Equal(d.ep, ep) {
		t.Fatalf("round trip: %+v, want %v at 42", d, ep)
	}
	// A minimal endpoint stays minimal (nil and empty agree with proto).
	min := &registryv1.ServiceEndpoint{Service: "s", Protocol: registryv1.Protocol_PROTOCOL_TCP, Ip: "10.0.0.1", Cluster: "c", Region: "r"}
	k2, _ := registry.IDOf(min).Key()
	spec, _ = endpointSpecOf(k2, min)
	got, err := endpointOf(&spec)
	if err != nil || !proto.Equal(got, min) {
		t.Fatalf("minimal round trip: %v, %v", got, err)
	}
	// A value that names another endpoint than its key is refused.
	spec.IP = "10.0.0.2"
	if _, err := endpointOf(&spec); err == nil {
		t.Fatalf("an object whose fields disagree with its key decoded")
	}
	// An enum value the schema does not know cannot be written.
	bad := proto.Clone(min).(*registryv1.ServiceEndpoint)
	bad.State = 42
	if _, err := endpointSpecOf(k2, bad); err == nil {
		t.Fatalf("an unknown state was encoded")
	}
}

func TestNodeRoundTrip(t *testing.T) {
	n := &registryv1.Node{
		Name: "n1", Cluster: "c1", Region: "r1", Zone: "z1", Address: "10.1.2.3",
		Services: []string{"a", "b"},
		Health: &registryv1.HealthSummary{Status: registryv1.Health_HEALTH_DEGRADED, Message: "1/2", EndpointsServing: 1,
			EndpointsTotal: 2, EndpointsHeld: 3, EndpointsHeldServing: 4},
		Labels: map[string]string{"k": "v"}, LeaseId: 77, LeaseTtlSeconds: 30,
		AnnouncedAt: timestamppb.New(time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)),
		Stamp:       &registryv1.WriteStamp{Hlc: 99, Writer: "w"},
	}
	everyField(t, n)
	u, err := NodeObject(n, 0x4d)
	if err != nil {
		t.Fatal(err)
	}
	if l := u.GetLabels()[labelLease]; l != "4d" {
		t.Fatalf("label %s = %q, want 4d (the reaper selects a lease's records by it)", labelLease, l)
	}
	u.SetResourceVersion("7")
	got, lease, rev, err := NodeOf(u)
	if err != nil || lease != leaseName(0x4d) || rev != 7 || !proto.Equal(got, n) {
		t.Fatalf("round trip: %v %q %d %v, want %v", got, lease, rev, err, n)
	}
}

func TestTombstoneDecodes(t *testing.T) {
	ep := fullEndpoint()
	id := registry.IDOf(ep)
	key, _ := id.Key()
	spec, err := tombstoneSpecOf(key, id, ep.Stamp, true, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	u, _ := toUnstructured(&endpointObject{ObjectMeta: recordMeta("x", key), Spec: spec})
	u.SetResourceVersion("9")
	d := decodeEndpointObject(u)
	if !d.tomb || !d.deletedLive || d.ep != nil || d.key != key || d.err != nil {
		t.Fatalf("tombstone decoded as %+v", d)
	}
}
