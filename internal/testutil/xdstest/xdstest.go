// Package xdstest proves an xDS control plane with real clients: real gRPC
// backends on loopback that answer with their own address, grpc-go's own
// xDS client (the xds:/// resolver and the xDS balancers) dialled from a
// per-client bootstrap, traffic counted per backend, and a hand-built
// delta-xDS stream (DeltaProbe). Nothing in it is a mock: whatever a test
// shows through it, a proxyless gRPC application would see.
//
// It is for tests only; nothing outside a _test.go file imports it.
package xdstest

import (
	"fmt"
	"github.com/aethermesh/aether/xds/bootstrap"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/xds"
)

// Locality is where an xDS client says it runs: the node locality of its
// bootstrap, which a control plane reads from the Node of each request to
// rank endpoints (same zone, same region, other regions).
type Locality struct {
	Region, Zone string
}

// Bootstrap is the bootstrap `aether xds bootstrap` prints (package
// xds/bootstrap: a standard gRPC xDS bootstrap, gRFC A27) for one control
// plane at serverAddr (host:port, plaintext), so a client of the tests is
// configured exactly as a user's would be. Node id is what a
// go-control-plane snapshot cache is keyed by (cache.IDHash); the locality
// is sent in every request's Node.
func Bootstrap(serverAddr, nodeID string, locality Locality) []byte {
	b, err := bootstrap.JSON(bootstrap.Config{Server: serverAddr, Node: nodeID, Region: locality.Region, Zone: locality.Zone})
	if err != nil {
		panic(fmt.Sprintf("xdstest.Bootstrap: %v", err)) // a test's own misuse: no node id, or a bad address
	}
	return b
}

// Client dials xds:///target with grpc-go's xDS resolver configured from
// bootstrapJSON, closed on t.Cleanup.
//
// The resolver comes from xds.NewXDSResolverWithConfigForTesting, the one
// exported way in grpc-go (v1.85.0) to give one ClientConn its own
// bootstrap: passed with grpc.WithResolvers it takes precedence over the
// globally registered "xds" resolver, and each Build parses the bootstrap
// and makes a fresh xdsclient pool (internal/xds/resolver
// newBuilderWithConfigForTesting), so clients in parallel tests each have
// their own xDS client, node and control plane. The alternatives are
// process-global: GRPC_XDS_BOOTSTRAP/GRPC_XDS_BOOTSTRAP_CONFIG are read
// into xdsclient.DefaultPool once, and NewXDSResolverWithPoolForTesting
// takes an *xdsclient.Pool, which lives in an internal package no other
// module can name.
//
// The import of google.golang.org/grpc/xds also registers what the
// resolver's service config names: the cds/priority/cluster_impl/
// xds_wrr_locality balancers and the router filter.
func Client(t testing.TB, target string, bootstrapJSON []byte) *grpc.ClientConn {
	t.Helper()
	rb, err := xds.NewXDSResolverWithConfigForTesting(bootstrapJSON)
	if err != nil {
		t.Fatalf("xds resolver from bootstrap: %v", err)
	}
	cc, err := grpc.NewClient("xds:///"+target,
		grpc.WithResolvers(rb),
		// The backends are plaintext; the xDS resources carry no
		// transport_socket, so grpc-go uses these credentials as given.
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial xds:///%s: %v", target, err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}
