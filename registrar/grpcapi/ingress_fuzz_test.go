package grpcapi

import (
	"github.com/aethermesh/aether/internal/testutil/prototest"
	"testing"

	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
)

// FuzzIngressDecode drives the server codec's request decoding with
// arbitrary bytes, as every request meets it. It must never panic; a
// request that decodes carries no unknown field; one that does not has a
// description, and the description blames a field only when the protobuf
// library refuses the bytes too (diagnose never accuses a valid message).
func FuzzIngressDecode(f *testing.F) {
	targets := []func() proto.Message{
		func() proto.Message { return &registrarv1.RegisterEndpointRequest{} },
		func() proto.Message { return &registrarv1.AnnounceNodeRequest{} },
		func() proto.Message { return &registrarv1.SubscribeRequest{} },
		func() proto.Message { return &registrarv1.DrainEndpointRequest{} },
	}
	ep := &registryv1.ServiceEndpoint{Service: "web", Protocol: 1, Ip: "10.0.0.1", Ports: []*registryv1.Port{{Name: "a", Port: 80}},
		Metadata: map[string]string{"k": "v"}}
	for i, m := range []proto.Message{
		&registrarv1.RegisterEndpointRequest{Endpoint: ep, WaitPersisted: true},
		&registrarv1.AnnounceNodeRequest{Node: &registryv1.Node{Name: "n", Labels: map[string]string{"k": "v"}, Health: &registryv1.HealthSummary{Message: "ok"}}},
		&registrarv1.SubscribeRequest{Request: &registrarv1.SubscribeRequest_Start{Start: &registrarv1.WatchEndpointsRequest{Services: []string{"web"}}}},
		&registrarv1.DrainEndpointRequest{Service: "web", Ip: "10.0.0.1"},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(uint8(i), b)
		f.Add(uint8(i), protowire.AppendBytes(protowire.AppendTag(b, 999, protowire.BytesType), []byte("newer")))
		f.Add(uint8(i), b[:len(b)/2])
	}
	f.Add(uint8(0), []byte("\x0a\x04\x0a\x02\xff\xfe")) // endpoint.service not UTF-8
	codec := wireCodec{encoding.GetCodecV2(grpcproto.Name)}
	f.Fuzz(func(t *testing.T, which uint8, b []byte) {
		m := targets[int(which)%len(targets)]()
		dt := &decodeTarget{Message: m}
		if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, dt); err != nil {
			t.Fatalf("the codec returned %v for a decodeTarget; gRPC would make it INTERNAL", err)
		}
		libErr := proto.Unmarshal(b, m.ProtoReflect().Type().New().Interface())
		if dt.err == nil {
			if libErr != nil {
				t.Fatalf("accepted bytes the protobuf library refuses: %v", libErr)
			}
			if n := prototest.UnknownBytes(t, m); n != 0 {
				t.Fatalf("decoded request keeps %d bytes of unknown fields", n)
			}
			if where := diagnose(b, m.ProtoReflect().Descriptor(), "", 0, 0); where != "" {
				t.Fatalf("diagnose blames %q in a message that decodes", where)
			}
			return
		}
		if libErr == nil {
			t.Fatalf("refused (%v) bytes the protobuf library accepts", dt.err)
		}
		if dt.err.Error() == "" {
			t.Fatal("a refusal without a description")
		}
	})
}
