package grpcapi_test

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/registrar/grpcapi"
)

// FuzzRegisterRequest drives the RegisterEndpoint handler with arbitrary
// requests (no sockets: the handler and the state machine only, which is
// where validation lives). It must never panic, and every refusal of a
// request must be INVALID_ARGUMENT, or RESOURCE_EXHAUSTED for the one limit
// a long run can legitimately reach (--max-endpoints-per-node; the queue is
// far larger than a run can fill).
func FuzzRegisterRequest(f *testing.F) {
	for _, ep := range []*registryv1.ServiceEndpoint{
		{Service: "web", Protocol: 1, Ip: "10.0.0.1", Ports: []*registryv1.Port{{Port: 80}}},
		{Service: "web", Protocol: 3, Ip: "fd00::1", Region: "r", Cluster: "c", Node: "n", Zone: "z",
			Ports: []*registryv1.Port{{Name: "a", Port: 1}, {Name: "b", Port: 65535}}, Metadata: map[string]string{"k": "v"}, State: 2},
		{Service: "a/b", Protocol: 9, Ip: "0.0.0.0", Region: "other", Ports: []*registryv1.Port{{Port: 0}}},
	} {
		b, err := proto.Marshal(&registrarv1.RegisterEndpointRequest{Endpoint: ep})
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	r, err := registrar.New(registrar.Options{Region: "r", ClusterName: "c", WriteQueueLimit: 1 << 30, Logger: quietLog()}, nil)
	if err != nil {
		f.Fatal(err)
	}
	svc := grpcapi.NewHandler(r)
	f.Fuzz(func(t *testing.T, data []byte) {
		req := &registrarv1.RegisterEndpointRequest{}
		if err := proto.Unmarshal(data, req); err != nil {
			return
		}
		resp, err := svc.RegisterEndpoint(context.Background(), req)
		if err != nil {
			if c := status.Code(err); c != codes.InvalidArgument && c != codes.ResourceExhausted {
				t.Fatalf("refusal %v, want INVALID_ARGUMENT", err)
			}
			return
		}
		if resp.GetEndpoint().GetRegion() != "r" || resp.GetEndpoint().GetCluster() != "c" {
			t.Fatalf("accepted an endpoint of another origin: %v", resp.GetEndpoint())
		}
	})
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
