package authz_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/authz"
	"github.com/aethermesh/aether/pki"
)

const td = "example.org"

// whoami answers ListNodes with the caller's identity and AnnounceNode with
// the policy's decision, the way the registrar will use this package.
type whoami struct {
	registrarv1.UnimplementedRegistrarServer
}

func (whoami) ListNodes(ctx context.Context, _ *registrarv1.ListNodesRequest) (*registrarv1.ListNodesResponse, error) {
	id, err := authz.FromContext(ctx, td, "")
	if err != nil {
		return nil, err
	}
	if err := (authz.Policy{}).AuthorizeRead(id); err != nil {
		return nil, err
	}
	return &registrarv1.ListNodesResponse{Nodes: []*registrarv1.NodeStatus{{Node: &registryv1.Node{
		Name: id.Kind.String() + " " + id.Name + " " + id.URI,
	}}}}, nil
}

func (whoami) AnnounceNode(ctx context.Context, req *registrarv1.AnnounceNodeRequest) (*registrarv1.AnnounceNodeResponse, error) {
	id, err := authz.FromContext(ctx, td, "")
	if err != nil {
		return nil, err
	}
	if err := (authz.Policy{}).AuthorizeNodeWrite(id, authz.OpAnnounce, req.GetNode().GetName()); err != nil {
		return nil, err
	}
	return &registrarv1.AnnounceNodeResponse{Node: req.GetNode()}, nil
}

// serve runs whoami on a real loopback socket with creds and returns its
// address.
func serve(t *testing.T, creds credentials.TransportCredentials) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(grpc.Creds(creds))
	registrarv1.RegisterRegistrarServer(s, whoami{})
	go s.Serve(ln)
	t.Cleanup(s.Stop)
	return ln.Addr().String()
}

func dial(t *testing.T, addr string, creds credentials.TransportCredentials) registrarv1.RegistrarClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return registrarv1.NewRegistrarClient(cc)
}

func clientCreds(t *testing.T, caFile string, iss *pki.Issued) credentials.TransportCredentials {
	t.Helper()
	var cert, key string
	if iss != nil {
		cert, key = iss.CertFile, iss.KeyFile
	}
	cfg, err := pki.ClientTLSConfig(caFile, cert, key)
	if err != nil {
		t.Fatal(err)
	}
	return credentials.NewTLS(cfg)
}

func whoIs(t *testing.T, c registrarv1.RegistrarClient) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.ListNodes(ctx, &registrarv1.ListNodesRequest{})
	if err != nil {
		return "", err
	}
	return resp.GetNodes()[0].GetNode().GetName(), nil
}

// TestFromContextOverTLS runs a gRPC server over real TLS sockets with
// pki-issued certificates. Client certificates are optional at the TLS
// level (as a registrar that also serves unauthenticated health checks
// would run), so missing ones reach FromContext.
func TestFromContextOverTLS(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	dir, otherDir := filepath.Join(base, "ca"), filepath.Join(base, "other-ca")
	if err := pki.InitCA(dir, td); err != nil {
		t.Fatal(err)
	}
	if err := pki.InitCA(otherDir, "other.org"); err != nil {
		t.Fatal(err)
	}
	issue := func(dir string, kind pki.Kind, name string) *pki.Issued {
		iss, err := pki.Issue(dir, kind, name)
		if err != nil {
			t.Fatal(err)
		}
		return iss
	}
	srv := issue(dir, pki.Server, "localhost")
	node := issue(dir, pki.Node, "node-a")
	op := issue(dir, pki.Operator, "alice")
	foreign := issue(otherDir, pki.Node, "node-a")

	// The server trusts both CAs, so the other trust domain's certificate
	// passes TLS and must be refused by name.
	caFile := filepath.Join(dir, pki.CACertFile)
	bundle := filepath.Join(base, "client-ca.pem")
	a, _ := os.ReadFile(caFile)
	b, _ := os.ReadFile(filepath.Join(otherDir, pki.CACertFile))
	if err := os.WriteFile(bundle, append(a, b...), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, r, err := pki.ServerTLSConfig(srv.CertFile, srv.KeyFile, bundle, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	addr := serve(t, credentials.NewTLS(cfg))

	nodeClient := dial(t, addr, clientCreds(t, caFile, node))
	if got, err := whoIs(t, nodeClient); err != nil || got != "node node-a spiffe://example.org/node/node-a" {
		t.Errorf("node certificate: %q, %v", got, err)
	}
	if got, err := whoIs(t, dial(t, addr, clientCreds(t, caFile, op))); err != nil || got != "operator alice spiffe://example.org/operator/alice" {
		t.Errorf("operator certificate: %q, %v", got, err)
	}

	// The reloading client credentials authenticate the same way.
	rc, cr, err := pki.ClientCredentials(caFile, node.CertFile, node.KeyFile, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer cr.Close()
	if got, err := whoIs(t, dial(t, addr, rc)); err != nil || got != "node node-a spiffe://example.org/node/node-a" {
		t.Errorf("node via ClientCredentials: %q, %v", got, err)
	}

	// Refusals arrive with their code and a message naming the rule.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = nodeClient.AnnounceNode(ctx, &registrarv1.AnnounceNodeRequest{Node: &registryv1.Node{Name: "node-b"}})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `node "node-a" (spiffe://example.org/node/node-a) may only announce, heartbeat and leave as itself`) {
		t.Errorf("announcing another node: %v", err)
	}
	if _, err := nodeClient.AnnounceNode(ctx, &registrarv1.AnnounceNodeRequest{Node: &registryv1.Node{Name: "node-a"}}); err != nil {
		t.Errorf("announcing itself: %v", err)
	}

	for _, tc := range []struct {
		name  string
		creds credentials.TransportCredentials
		want  []string
	}{
		{"no client certificate", clientCreds(t, caFile, nil), []string{"no client certificate from 127.0.0.1:", `trust domain "example.org"`}},
		{"other trust domain", clientCreds(t, caFile, foreign), []string{`trust domain "other.org"`, `trusts only "example.org"`}},
	} {
		_, err := whoIs(t, dial(t, addr, tc.creds))
		if status.Code(err) != codes.Unauthenticated {
			t.Errorf("%s: %v, want UNAUTHENTICATED", tc.name, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(status.Convert(err).Message(), w) {
				t.Errorf("%s: %q does not contain %q", tc.name, status.Convert(err).Message(), w)
			}
		}
	}
}

// TestFromContextInsecure checks that a plaintext connection is
// UNAUTHENTICATED.
func TestFromContextInsecure(t *testing.T) {
	t.Parallel()
	addr := serve(t, insecure.NewCredentials())
	_, err := whoIs(t, dial(t, addr, insecure.NewCredentials()))
	if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "is not TLS") {
		t.Errorf("plaintext: %v, want UNAUTHENTICATED ... is not TLS", err)
	}
}
