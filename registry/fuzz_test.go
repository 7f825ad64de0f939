package registry

import (
	"errors"
	"github.com/aethermesh/aether/internal/testutil/prototest"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
)

// FuzzEndpointKey: no input builds a key outside its origin subtree, and
// parsing inverts building.
func FuzzEndpointKey(f *testing.F) {
	f.Add("eu-west", "c1", "payments", int32(3), "10.0.0.7")
	f.Add("r", "c", "s", int32(1), "fd00::1")
	f.Add("..", "c", "s", int32(1), "10.0.0.1")
	f.Add("r", "c/../../other", "s", int32(2), "10.0.0.1")
	f.Add("r", "c", "s\x00", int32(4), "::ffff:10.0.0.1")
	f.Add("r", "c", "s", int32(9), "10.0.0.1/32")
	f.Fuzz(func(t *testing.T, region, cluster, service string, proto int32, ip string) {
		id := EndpointID{Region: region, Cluster: cluster, Service: service, Protocol: registryv1.Protocol(proto), IP: ip}
		key, err := id.Key()
		if err != nil {
			return
		}
		if !strings.HasPrefix(key, ServicePrefix(region, cluster, service)) || !strings.HasPrefix(key, RegionPrefix(region)) {
			t.Fatalf("key %q escapes its origin subtree %q", key, ClusterPrefix(region, cluster))
		}
		if n := strings.Count(strings.TrimPrefix(key, Root), "/"); n != 8 {
			t.Fatalf("key %q has %d separators below the root, want 8", key, n)
		}
		back, err := ParseEndpointKey(key)
		if err != nil || back != id {
			t.Fatalf("ParseEndpointKey(%q) = %+v, %v; want %+v", key, back, err, id)
		}
	})
}

// FuzzParseEndpointKey: whatever parses rebuilds to the same key.
func FuzzParseEndpointKey(f *testing.F) {
	f.Add("/aether/v1/regions/r/clusters/c/services/s/protocols/grpc/endpoints/10.0.0.1")
	f.Add("/aether/v1/regions/r/clusters/c/services/s/protocols/http1/endpoints/fd00::1")
	f.Add("/aether/v1/regions/r/clusters/c/nodes/n1")
	f.Add("/aether/v1/regions//clusters/c/services/s/protocols/grpc/endpoints/10.0.0.1")
	f.Fuzz(func(t *testing.T, key string) {
		if id, err := ParseEndpointKey(key); err == nil {
			if k, err := id.Key(); err != nil || k != key {
				t.Fatalf("ParseEndpointKey(%q) = %+v, which builds %q, %v", key, id, k, err)
			}
		}
		if id, err := ParseNodeKey(key); err == nil {
			if k, err := id.Key(); err != nil || k != key {
				t.Fatalf("ParseNodeKey(%q) = %+v, which builds %q, %v", key, id, k, err)
			}
		}
	})
}

// FuzzNormalizeEndpoint: validation never panics, every rejection is a
// FieldError (which the registrar turns into INVALID_ARGUMENT), and every
// acceptance yields an endpoint with a valid key, no unknown fields and an
// encoding within the byte bound, that survives the codec.
func FuzzNormalizeEndpoint(f *testing.F) {
	for _, ep := range []*registryv1.ServiceEndpoint{
		{Service: "web", Protocol: 1, Ip: "10.0.0.1", Region: "r", Cluster: "c", Ports: []*registryv1.Port{{Port: 80}}},
		{Service: "web", Protocol: 3, Ip: "fd00::1", Region: "r", Cluster: "c", Node: "n", Zone: "z",
			Ports: []*registryv1.Port{{Name: "a", Port: 1}, {Name: "b", Port: 65535}}, Metadata: map[string]string{"k": "v"}, State: 2, Weight: 7},
		{Service: "a/b", Protocol: 9, Ip: "0.0.0.0", Ports: []*registryv1.Port{{Port: 0}}},
	} {
		b, err := proto.Marshal(ep)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(append(b, unknownField(64)...)) // a field of a newer API version
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		in := &registryv1.ServiceEndpoint{}
		if err := proto.Unmarshal(data, in); err != nil {
			return
		}
		ep, err := NormalizeEndpoint(in, DefaultLimits)
		if err != nil {
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("rejection %v (%T) is not a FieldError", err, err)
			}
			return
		}
		key, err := IDOf(ep).Key()
		if err != nil {
			t.Fatalf("accepted endpoint has no valid key: %v", err)
		}
		if n := prototest.UnknownBytes(t, ep); n != 0 {
			t.Fatalf("accepted endpoint keeps %d bytes of unknown fields", n)
		}
		val, err := EncodeEndpoint(ep)
		if err != nil {
			t.Fatal(err)
		}
		if len(val) > DefaultMaxEndpointBytes {
			t.Fatalf("accepted endpoint encodes to %d bytes, over the bound of %d", len(val), DefaultMaxEndpointBytes)
		}
		back, err := DecodeEndpoint(key, val)
		if err != nil || !proto.Equal(back, ep) {
			t.Fatalf("codec round trip: %v, %v", back, err)
		}
	})
}
