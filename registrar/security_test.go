package registrar_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"github.com/aethermesh/aether/internal/testutil/logbuf"
	"github.com/aethermesh/aether/internal/testutil/meshtest"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/pki"
	"github.com/aethermesh/aether/server"
)

// startSecure starts a registrar over etcd with mTLS and authz on.
func startSecure(t *testing.T, etcd *etcdtest.Cluster, m *meshtest.Mesh, mut ...func(*server.Config)) (*server.Server, *logbuf.Buffer) {
	t.Helper()
	logs := &logbuf.Buffer{}
	return startRegistrar(t, etcd.Endpoints(), append([]func(*server.Config){func(o *server.Config) {
		o.TLSCertFile, o.TLSKeyFile, o.TLSClientCAFile = m.ServerCert, m.ServerKey, m.CA
		o.TrustDomain = "example.org"
		o.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}}, mut...)...), logs
}

// tlsClient dials addr over TLS, trusting caFile, presenting who's
// certificate ("" for none).
func tlsClient(t *testing.T, addr, caFile string, m *meshtest.Mesh, who string) registrarv1.RegistrarClient {
	t.Helper()
	var cert, key string
	if who != "" {
		pair, ok := m.Certs[who]
		if !ok {
			t.Fatalf("no certificate %q", who)
		}
		cert, key = pair[0], pair[1]
	}
	cfg, err := pki.ClientTLSConfig(caFile, cert, key)
	if err != nil {
		t.Fatal(err)
	}
	return dial(t, addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
}

func callCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func nodeEP(svc, ip, node string) *registryv1.ServiceEndpoint {
	e := ep(svc, ip, 8080)
	e.Node = node
	return e
}

// wantCode fails unless err has code c and its message holds every want.
func wantCode(t *testing.T, what string, err error, c codes.Code, want ...string) {
	t.Helper()
	st := status.Convert(err)
	if err == nil || st.Code() != c {
		t.Fatalf("%s: got %v, want %s", what, err, c)
	}
	for _, w := range want {
		if !strings.Contains(st.Message(), w) {
			t.Errorf("%s: message %q does not contain %q", what, st.Message(), w)
		}
	}
}

// httpsMetric scrapes one sample line (name with labels) over TLS.
func httpsMetric(t *testing.T, addr, caFile, sample string) string {
	t.Helper()
	cfg, err := pki.ClientTLSConfig(caFile, "", "")
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 5 * time.Second}
	resp, err := c.Get("https://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if rest, ok := strings.CutPrefix(line, sample+" "); ok {
			return rest
		}
	}
	return "0"
}

func TestMTLSRequiresClientCertificate(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	m := meshtest.New(t, "example.org")
	srv, _ := startSecure(t, etcd, m)

	// TLS without a client certificate: the handshake fails.
	_, err := tlsClient(t, srv.GRPCAddr(), m.CA, m, "").ListAllEndpoints(callCtx(t), &registrarv1.ListAllEndpointsRequest{})
	// (The client sees the server's alert, "certificate required", or
	// just the closed connection, depending on timing.)
	wantCode(t, "no client certificate", err, codes.Unavailable)

	// Plaintext: no TLS at all.
	_, err = dial(t, srv.GRPCAddr()).ListAllEndpoints(callCtx(t), &registrarv1.ListAllEndpointsRequest{})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("plaintext client: %v, want UNAVAILABLE", err)
	}

	// A certificate of another CA (same trust domain name): unknown
	// authority, the handshake fails.
	other := meshtest.New(t, "example.org")
	m.Certs["node-a-other-ca"] = other.Certs["node-node-a"]
	_, err = tlsClient(t, srv.GRPCAddr(), m.CA, m, "node-a-other-ca").RegisterEndpoint(callCtx(t), &registrarv1.RegisterEndpointRequest{Endpoint: nodeEP("web", "10.0.0.1", "node-a")})
	wantCode(t, "certificate of another CA", err, codes.Unavailable)

	// A good certificate works, over the same TLS.
	if _, err := tlsClient(t, srv.GRPCAddr(), m.CA, m, "node-node-a").ListAllEndpoints(callCtx(t), &registrarv1.ListAllEndpointsRequest{}); err != nil {
		t.Fatalf("node certificate: %v", err)
	}
	if n := countKeys(t, etcd.Client(t)); n != 0 {
		t.Errorf("etcd holds %d keys after refused calls", n)
	}
}

func TestMTLSForeignTrustDomainRejected(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	m := meshtest.New(t, "example.org")
	foreign := meshtest.New(t, "other.org")

	// The client CA bundle trusts both CAs, so the foreign certificate
	// passes the handshake; its trust domain is what must reject it.
	bundle := filepath.Join(t.TempDir(), "bundle.pem")
	a, _ := os.ReadFile(m.CA)
	b, _ := os.ReadFile(foreign.CA)
	if err := os.WriteFile(bundle, append(a, b...), 0o600); err != nil {
		t.Fatal(err)
	}
	srv, logs := startSecure(t, etcd, m, func(o *server.Config) { o.TLSClientCAFile = bundle })
	m.Certs["foreign-node-a"] = foreign.Certs["node-node-a"]
	c := tlsClient(t, srv.GRPCAddr(), m.CA, m, "foreign-node-a")

	_, err := c.RegisterEndpoint(callCtx(t), &registrarv1.RegisterEndpointRequest{Endpoint: nodeEP("web", "10.0.0.1", "node-a")})
	wantCode(t, "foreign register", err, codes.Unauthenticated, `trust domain "other.org"`, `trusts only "example.org"`)
	_, err = c.ListAllEndpoints(callCtx(t), &registrarv1.ListAllEndpointsRequest{})
	wantCode(t, "foreign list", err, codes.Unauthenticated, "other.org")
	stream, err := c.WatchEndpoints(callCtx(t), &registrarv1.WatchEndpointsRequest{})
	if err == nil {
		_, err = stream.Recv()
	}
	wantCode(t, "foreign watch", err, codes.Unauthenticated, "other.org")

	if got := httpsMetric(t, srv.HTTPAddr(), m.CA, `registrar_authz_denied_total{rule="authenticated"}`); got != "3" {
		t.Errorf("denied{authenticated} = %s, want 3", got)
	}
	wantLogLine(t, logs.String(), "level=WARN", `msg="request denied"`, "method=RegisterEndpoint", "identity=unauthenticated", "rule=authenticated", "other.org")
	if n := countKeys(t, etcd.Client(t)); n != 0 {
		t.Errorf("etcd holds %d keys after refused calls", n)
	}
}

func TestNodeAuthorization(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	m := meshtest.New(t, "example.org")
	srv, logs := startSecure(t, etcd, m)
	nodeA := tlsClient(t, srv.GRPCAddr(), m.CA, m, "node-node-a")
	op := tlsClient(t, srv.GRPCAddr(), m.CA, m, "operator-alice")
	const idA = "spiffe://example.org/node/node-a"

	// Own node: register, drain, unregister; announce and heartbeat.
	own := nodeEP("web", "10.0.0.1", "node-a")
	register(t, nodeA, own)
	if _, err := nodeA.DrainEndpoint(callCtx(t), &registrarv1.DrainEndpointRequest{Service: "web", Protocol: own.Protocol, Ip: own.Ip}); err != nil {
		t.Fatalf("drain own: %v", err)
	}
	unregister(t, nodeA, "web", "10.0.0.1")
	if _, err := nodeA.AnnounceNode(callCtx(t), &registrarv1.AnnounceNodeRequest{Node: &registryv1.Node{Name: "node-a"}}); err != nil {
		t.Fatalf("announce own: %v", err)
	}
	if _, err := nodeA.Heartbeat(callCtx(t), &registrarv1.HeartbeatRequest{Node: "node-a"}); err != nil {
		t.Fatalf("heartbeat own: %v", err)
	}
	register(t, nodeA, nodeEP("api", "10.0.0.1", "node-a"))

	// node-b's endpoint and record, written by an operator.
	theirs := nodeEP("web", "10.0.0.2", "node-b")
	register(t, op, theirs)
	if _, err := op.AnnounceNode(callCtx(t), &registrarv1.AnnounceNodeRequest{Node: &registryv1.Node{Name: "node-b"}}); err != nil {
		t.Fatalf("operator announce node-b: %v", err)
	}

	// Everything node-a may not do to node-b.
	_, err := nodeA.RegisterEndpoint(callCtx(t), &registrarv1.RegisterEndpointRequest{Endpoint: nodeEP("web", "10.0.0.9", "node-b")})
	wantCode(t, "register with node=node-b", err, codes.PermissionDenied, idA, "may only register endpoints of its own node", `node is "node-b"`)
	_, err = nodeA.RegisterEndpoint(callCtx(t), &registrarv1.RegisterEndpointRequest{Endpoint: nodeEP("web", "10.0.0.2", "node-a")})
	wantCode(t, "re-register over node-b's endpoint", err, codes.PermissionDenied, idA, `node is "node-b"`)
	_, err = nodeA.UnregisterEndpoint(callCtx(t), &registrarv1.UnregisterEndpointRequest{Service: "web", Protocol: theirs.Protocol, Ip: theirs.Ip})
	wantCode(t, "unregister node-b's endpoint", err, codes.PermissionDenied, idA, "may only unregister endpoints of its own node")
	_, err = nodeA.DrainEndpoint(callCtx(t), &registrarv1.DrainEndpointRequest{Service: "web", Protocol: theirs.Protocol, Ip: theirs.Ip})
	wantCode(t, "drain node-b's endpoint", err, codes.PermissionDenied, idA, "may only drain endpoints of its own node")
	_, err = nodeA.AnnounceNode(callCtx(t), &registrarv1.AnnounceNodeRequest{Node: &registryv1.Node{Name: "node-b"}})
	wantCode(t, "announce node-b", err, codes.PermissionDenied, idA, "may only announce, heartbeat and leave as itself")
	_, err = nodeA.Heartbeat(callCtx(t), &registrarv1.HeartbeatRequest{Node: "node-b"})
	wantCode(t, "heartbeat node-b", err, codes.PermissionDenied, idA, `for node "node-b"`)
	_, err = nodeA.LeaveNode(callCtx(t), &registrarv1.LeaveNodeRequest{Node: "node-b"})
	wantCode(t, "leave node-b", err, codes.PermissionDenied, idA)

	// Reads are open to any authenticated identity.
	list, err := nodeA.ListAllEndpoints(callCtx(t), &registrarv1.ListAllEndpointsRequest{})
	if err != nil {
		t.Fatalf("node list: %v", err)
	}
	if _, err := nodeA.ListNodes(callCtx(t), &registrarv1.ListNodesRequest{}); err != nil {
		t.Fatalf("node ListNodes: %v", err)
	}

	// Nothing was written: the snapshot and etcd hold node-b's endpoint
	// as the operator wrote it, and no spoofed key.
	if len(list.Endpoints) != 2 {
		t.Errorf("snapshot holds %d endpoints, want 2 (node-a's api, node-b's web): %v", len(list.Endpoints), list.Endpoints)
	}
	for _, e := range list.Endpoints {
		if e.Ip == "10.0.0.2" && (e.Node != "node-b" || e.State == registryv1.State_STATE_DRAINING) {
			t.Errorf("node-b's endpoint changed in the snapshot: %v", e)
		}
	}
	waitFor(t, "writes persisted", 5*time.Second, func() bool { return srv.Registrar().PendingWrites() == 0 })
	if _, v := etcdKey(t, cli, theirs); v == nil || v.Node != "node-b" || v.State == registryv1.State_STATE_DRAINING {
		t.Errorf("etcd: node-b's endpoint is %v", v)
	}
	if k, v := etcdKey(t, cli, nodeEP("web", "10.0.0.9", "node-b")); v != nil {
		t.Errorf("etcd holds the spoofed key %s: %v", k, v)
	}
	nodes, _ := op.ListNodes(callCtx(t), &registrarv1.ListNodesRequest{})
	if len(nodes.GetNodes()) != 2 {
		t.Errorf("nodes after node-a's refused leave of node-b: %v", nodes.GetNodes())
	}

	if got := httpsMetric(t, srv.HTTPAddr(), m.CA, `registrar_authz_denied_total{rule="own-node-endpoints"}`); got != "4" {
		t.Errorf("denied{own-node-endpoints} = %s, want 4", got)
	}
	if got := httpsMetric(t, srv.HTTPAddr(), m.CA, `registrar_authz_denied_total{rule="own-node-record"}`); got != "3" {
		t.Errorf("denied{own-node-record} = %s, want 3", got)
	}
	wantLogLine(t, logs.String(), "level=WARN", `msg="request denied"`, "method=DrainEndpoint", "identity="+idA, "rule=own-node-endpoints")

	// An operator may do all of it.
	if _, err := op.DrainEndpoint(callCtx(t), &registrarv1.DrainEndpointRequest{Service: "web", Protocol: theirs.Protocol, Ip: theirs.Ip}); err != nil {
		t.Fatalf("operator drain: %v", err)
	}
	register(t, op, nodeEP("web", "10.0.0.2", "node-a")) // hand the key to node-a
	if _, err := op.Heartbeat(callCtx(t), &registrarv1.HeartbeatRequest{Node: "node-b"}); err != nil {
		t.Fatalf("operator heartbeat: %v", err)
	}
	if _, err := op.LeaveNode(callCtx(t), &registrarv1.LeaveNodeRequest{Node: "node-b"}); err != nil {
		t.Fatalf("operator leave: %v", err)
	}
	// ... but for removing a live node's endpoint, which that node's agent
	// would register again: the node itself removes it (its identity is
	// the owner).
	_, err = op.UnregisterEndpoint(callCtx(t), &registrarv1.UnregisterEndpointRequest{Service: "api", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: "10.0.0.1"})
	wantCode(t, "operator unregister of live node-a's endpoint", err, codes.FailedPrecondition, `belongs to live node "node-a"`)
	unregister(t, nodeA, "api", "10.0.0.1")
	// ... and node-a now owns 10.0.0.2 and may remove it.
	unregister(t, nodeA, "web", "10.0.0.2")
	waitFor(t, "writes persisted", 5*time.Second, func() bool { return srv.Registrar().PendingWrites() == 0 })
	if n := countKeys(t, cli); n != 1 { // node-a's record
		t.Errorf("etcd holds %d keys at the end, want 1 (node-a's record)", n)
	}
}

// wantLogLine fails unless one line of logs holds every part.
func wantLogLine(t *testing.T, logs string, parts ...string) {
	t.Helper()
	for _, line := range strings.Split(logs, "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			return
		}
	}
	t.Errorf("no log line with %q in:\n%s", parts, logs)
}

func TestTLSCertReloadWithoutRestart(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	m := meshtest.New(t, "example.org")
	srv, _ := startSecure(t, etcd, m, func(o *server.Config) { o.TLSReloadInterval = 50 * time.Millisecond })

	serial := func() string {
		t.Helper()
		pair := m.Certs["node-node-a"]
		cfg, err := pki.ClientTLSConfig(m.CA, pair[0], pair[1])
		if err != nil {
			t.Fatal(err)
		}
		cfg.NextProtos = []string{"h2"}
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", srv.GRPCAddr(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	before := serial()
	iss, err := pki.Issue(m.Dir, pki.Server, "localhost", pki.WithOverwrite())
	if err != nil {
		t.Fatal(err)
	}
	want := leafSerial(t, iss.CertFile)
	if want == before {
		t.Fatal("the new certificate has the old serial")
	}
	waitFor(t, "a new connection to see the new certificate", 5*time.Second, func() bool { return serial() == want })
	// And the API works over it.
	if _, err := tlsClient(t, srv.GRPCAddr(), m.CA, m, "node-node-a").ListAllEndpoints(callCtx(t), &registrarv1.ListAllEndpointsRequest{}); err != nil {
		t.Fatal(err)
	}
}

func leafSerial(t *testing.T, file string) string {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(file, strings.TrimSuffix(file, ".pem")+"-key.pem")
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return c.SerialNumber.String()
}

func TestPlaintextWarnsAndAllowsAll(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	logs := &logbuf.Buffer{}
	srv := startRegistrar(t, etcd.Endpoints(), func(o *server.Config) {
		o.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	if !strings.Contains(logs.String(), "level=WARN msg=\"PLAINTEXT: no --tls-cert/--tls-key") {
		t.Errorf("no plaintext WARN at start:\n%s", logs.String())
	}
	// Development mode: no authz, any client writes any node's endpoint.
	c := dial(t, srv.GRPCAddr())
	register(t, c, nodeEP("web", "10.0.0.2", "node-b"))
	register(t, c, nodeEP("web", "10.0.0.2", "node-a"))
}
