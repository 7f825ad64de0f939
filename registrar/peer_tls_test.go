package registrar_test

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/internal/testutil/meshtest"
	"github.com/aethermesh/aether/internal/testutil/regtest"
	"github.com/aethermesh/aether/pki"
	"github.com/aethermesh/aether/server"
)

// With mTLS on, replicas dial each other with their own server
// certificates, peer-watch delivers as in plaintext, and no other
// identity (a node, an operator) may open the stream.
func TestPeerWatchOverMTLSOnlyRegistrarsMayOpenIt(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	m := meshtest.New(t, "example.org")
	start := func() *server.Server {
		addr := regtest.FreeAddr(t)
		_, port, _ := net.SplitHostPort(addr)
		s, _ := startSecure(t, etcd, m, peerWatchOn, func(o *server.Config) {
			o.GRPCAddr = addr
			// The test server certificate names localhost.
			o.PeerAdvertiseAddr = net.JoinHostPort("localhost", port)
		})
		return s
	}
	a, b := start(), start()
	connected(t, a, 1)
	connected(t, b, 1)
	ca := tlsClient(t, a.GRPCAddr(), m.CA, m, "operator-alice")
	cb := tlsClient(t, b.GRPCAddr(), m.CA, m, "node-node-a")
	ref := reference(t, cb)
	took := deliveredWithin(t, a, ca, ref, "10.0.4.1", peerBound, etcd.Client(t))
	t.Logf("over mTLS, A's write reached B's watcher within %v", took)

	for _, who := range []string{"node-node-a", "operator-alice"} {
		pair := m.Certs[who]
		cfg, err := pki.ClientTLSConfig(m.CA, pair[0], pair[1])
		if err != nil {
			t.Fatal(err)
		}
		cc, err := grpc.NewClient(a.GRPCAddr(), grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		stream, err := registrarv1.NewRegistrarPeersClient(cc).PeerWatch(context.Background(), &registrarv1.PeerWatchRequest{Epoch: who})
		if err == nil {
			_, err = stream.Recv()
		}
		if status.Code(err) != codes.PermissionDenied {
			t.Fatalf("%s opened the peer-watch stream: %v, want PERMISSION_DENIED", who, err)
		}
	}
	// A replica's own certificate (a server identity) may.
	srvCfg, err := pki.ClientTLSConfig(m.CA, m.ServerCert, m.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient(a.GRPCAddr(), grpc.WithTransportCredentials(credentials.NewTLS(srvCfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := registrarv1.NewRegistrarPeersClient(cc).PeerWatch(ctx, &registrarv1.PeerWatchRequest{Epoch: "test"})
	if err == nil {
		_, err = stream.Recv()
	}
	if err != nil {
		t.Fatalf("a registrar identity could not open the peer-watch stream: %v", err)
	}
}
