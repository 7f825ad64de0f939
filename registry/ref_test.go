package registry

import (
	"testing"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
)

func TestRefRoundTrips(t *testing.T) {
	id := EndpointID{Region: "eu", Cluster: "c1", Service: "web", Protocol: registryv1.Protocol_PROTOCOL_GRPC, IP: "fd00::1"}
	if back := IDOfRef(id.Ref()); back != id {
		t.Fatalf("IDOfRef(Ref(%+v)) = %+v", id, back)
	}
	// A reference names the same identity as the endpoint it refers to.
	ep := &registryv1.ServiceEndpoint{Region: "eu", Cluster: "c1", Service: "web", Protocol: registryv1.Protocol_PROTOCOL_GRPC, Ip: "fd00::1", Node: "n1"}
	if got := IDOfRef(IDOf(ep).Ref()); got != IDOf(ep) {
		t.Fatalf("IDOfRef = %+v, IDOf = %+v", got, IDOf(ep))
	}
	if got := IDOfRef(nil); got != (EndpointID{}) {
		t.Fatalf("IDOfRef(nil) = %+v", got)
	}
}
