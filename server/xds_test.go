package server_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/internal/testutil/meshtest"
	"github.com/aethermesh/aether/internal/testutil/regtest"
	"github.com/aethermesh/aether/pki"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/server"
)

// fetchClusters opens an ADS stream with creds and asks for cluster
// name: the cluster's name when it is answered, else the error.
func fetchClusters(addr string, creds credentials.TransportCredentials, name string) (string, error) {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return "", err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stream, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
	if err != nil {
		return "", err
	}
	if err := stream.Send(&discoverygrpc.DiscoveryRequest{Node: &corev3.Node{Id: "t"}, TypeUrl: resourcev3.ClusterType, ResourceNames: []string{name}}); err != nil {
		return "", err
	}
	r, err := stream.Recv()
	if err != nil {
		return "", err
	}
	if len(r.GetResources()) != 1 {
		return "", nil
	}
	return name, nil
}

// TestXDSServesWithTheRegistrarsTLS: with mTLS on, --xds-addr serves TLS
// and requires a client certificate of the CA, as --grpc-addr does.
func TestXDSServesWithTheRegistrarsTLS(t *testing.T) {
	t.Parallel()
	m := meshtest.New(t, "example.org")
	etcd := etcdtest.Start(t)
	s := regtest.Start(t, server.Config{
		EtcdEndpoints: etcd.Endpoints(), XDSAddr: "127.0.0.1:0",
		Options:     registrar.Options{ClusterName: "c1", Region: "r1"},
		TLSCertFile: m.ServerCert, TLSKeyFile: m.ServerKey, TLSClientCAFile: m.CA, TrustDomain: "example.org",
	})
	e := &registryv1.ServiceEndpoint{Service: "web", Protocol: registryv1.Protocol_PROTOCOL_GRPC, Ip: "10.0.0.1",
		Ports: []*registryv1.Port{{Name: "grpc", Port: 8080}}}
	if _, _, err := s.Registrar().Register(e); err != nil {
		t.Fatal(err)
	}
	addr := strings.Replace(s.XDSAddr(), "127.0.0.1", "localhost", 1) // the certificate's name

	node := m.Certs["node-node-a"]
	withCert, err := pki.ClientTLSConfig(m.CA, node[0], node[1])
	if err != nil {
		t.Fatal(err)
	}
	if got, err := fetchClusters(addr, credentials.NewTLS(withCert), "web"); err != nil || got != "web" {
		t.Fatalf("a client with a node certificate: %q, %v; want cluster web", got, err)
	}
	noCert, err := pki.ClientTLSConfig(m.CA, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fetchClusters(addr, credentials.NewTLS(noCert), "web"); err == nil {
		t.Error("a TLS client without a certificate was served")
	}
	if _, err := fetchClusters(addr, insecure.NewCredentials(), "web"); err == nil {
		t.Error("a plaintext client was served")
	}
}

// TestXDSAddrInUseNamesTheFlag: a --xds-addr that cannot be bound fails
// the start at once, naming the flag.
func TestXDSAddrInUseNamesTheFlag(t *testing.T) {
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = server.Launch(ctx, server.Config{
		EtcdEndpoints: []string{"http://127.0.0.1:1"}, GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		XDSAddr: busy.Addr().String(), Options: registrar.Options{ClusterName: "c1", Region: "r1", Logger: quietLogger()},
	})
	if err == nil || !strings.Contains(err.Error(), "--xds-addr "+busy.Addr().String()) {
		t.Fatalf("Launch: %v, want an error naming --xds-addr", err)
	}
}
