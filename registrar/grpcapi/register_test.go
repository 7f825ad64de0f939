package grpcapi_test

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	etcdstore "github.com/aethermesh/aether/backend/etcd"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/registrar/grpcapi"
)

// RegisterGRPC on a server of the caller's, without wireCodec, streams
// events plainly.
func TestRegisterGRPCOnAPlainServer(t *testing.T) {
	etcd := etcdtest.Start(t)
	r, err := registrar.New(registrar.Options{ClusterName: "c1", Region: "r1", Logger: slog.New(slog.DiscardHandler)}, etcdstore.New(etcd.Client(t), etcdstore.Options{}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(context.Background()) })
	srv := grpc.NewServer()
	grpcapi.RegisterGRPC(srv, r)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	c := registrarv1.NewRegistrarClient(cc)
	st, err := c.WatchEndpoints(ctx, &registrarv1.WatchEndpointsRequest{Services: []string{"web"}})
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := st.Recv(); err != nil || ev.Type != registrarv1.EndpointEvent_FULL_SNAPSHOT {
		t.Fatalf("first message %v, %v; want the snapshot", ev, err)
	}
	ep := &registryv1.ServiceEndpoint{Service: "web", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: "10.0.0.9",
		Ports: []*registryv1.Port{{Name: "http", Port: 80}}}
	if _, err := c.RegisterEndpoint(ctx, &registrarv1.RegisterEndpointRequest{Endpoint: ep}); err != nil {
		t.Fatal(err)
	}
	ev, err := st.Recv()
	if err != nil || ev.Type != registrarv1.EndpointEvent_ENDPOINT_ADDED || ev.GetEndpoint().GetIp() != "10.0.0.9" {
		t.Fatalf("event %v, %v; want the registration", ev, err)
	}
}
