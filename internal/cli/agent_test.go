package cli

import (
	"context"
	"encoding/json"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/internal/testutil/regtest"
	"github.com/aethermesh/aether/internal/testutil/wait"
	"github.com/aethermesh/aether/internal/testutil/xdstest"
	"github.com/aethermesh/aether/xds"
)

// TestAgentFlagErrors checks that bad agent flags fail before the agent
// dials any registrar.
func TestAgentFlagErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"missing node", nil, "--node is required: the name this node is registered under"},
		{"bad node", []string{"--node", "-n1"}, `--node "-n1" must start and end with a letter or digit`},
		{"endpoint without port", []string{"--node", "n1", "--endpoint", "web=10.0.0.1"},
			`--endpoint "web=10.0.0.1": address 10.0.0.1: missing port in address (IPv6 addresses go in brackets: [fd00::1]:8080)`},
		{"endpoint port 0", []string{"--node", "n1", "--endpoint", "web=10.0.0.1:0"},
			`--endpoint "web=10.0.0.1:0": port "0" is not a port number (1-65535)`},
		{"endpoint host name", []string{"--node", "n1", "--endpoint", "web=host:80"},
			`--endpoint "web=host:80": ip "host" is not an IPv4 or IPv6 address`},
		{"endpoint bad protocol", []string{"--node", "n1", "--endpoint", "web=10.0.0.1:80/udp"},
			`--endpoint "web=10.0.0.1:80/udp": unknown protocol "udp" (use one of http, h2c, grpc, tcp)`},
		{"second endpoint bad", []string{"--node", "n1", "--endpoint", "web=10.0.0.1:80", "--endpoint", "api=[fd00::1]:9090/grpc", "--endpoint", "db"},
			`--endpoint "db": expected service=ip:port[/protocol], e.g. web=10.0.0.1:8080/http`},
		{"endpoint twice", []string{"--node", "n1", "--endpoint", "web=10.0.0.1:80", "--endpoint", "web=10.0.0.1:8080/http"},
			"endpoint /aether/v1/regions/default/clusters/default/services/web/protocols/http1/endpoints/10.0.0.1 is given twice"},
		{"label without value", []string{"--node", "n1", "--label", "rack"}, `--label "rack": expected key=value`},
		{"label without key", []string{"--node", "n1", "--label", "=r7"}, `--label "=r7": expected key=value`},
		{"bad label key", []string{"--node", "n1", "--label", "rack id=r7"},
			`--label: node.labels: key "rack id" contains " "; allowed are ASCII letters and digits, '.', '_', '-' and '/'`},
		{"address not an ip", []string{"--node", "n1", "--address", "node-a.example"}, `--address: ip "node-a.example" is not an IPv4 or IPv6 address`},
		{"unspecified address", []string{"--node", "n1", "--address", "0.0.0.0"}, `--address: ip "0.0.0.0" is the unspecified address; register the address peers dial`},
		{"bad zone", []string{"--node", "n1", "--zone", "z/1"}, `--zone "z/1" must not contain '/'`},
		{"xds addr without port", []string{"--node", "n1", "--xds-addr", "127.0.0.1"},
			`--xds-addr "127.0.0.1": not a host:port address (missing port in address); use e.g. 127.0.0.1:15010`},
		{"negative xds linger", []string{"--node", "n1", "--xds-linger", "-1s"},
			"--xds-linger -1s: must be positive (a service no proxy asks for stays watched this long)"},
		{"zero xds linger", []string{"--node", "n1", "--xds-linger", "0s"},
			"--xds-linger 0s: must be positive (0 is not a setting here: it would silently mean the default); to run with the default (30s), leave --xds-linger out"},
		{"xds tls without xds addr", []string{"--node", "n1", "--xds-tls-cert", "s.pem", "--xds-tls-key", "k.pem"},
			"--xds-tls-cert, --xds-tls-key and --xds-tls-client-ca secure the xDS port: add --xds-addr or drop them"},
		{"xds tls cert without key", []string{"--node", "n1", "--xds-addr", "127.0.0.1:0", "--xds-tls-cert", "s.pem"},
			"--xds-tls-cert needs --xds-tls-key: give the xDS port's certificate and its private key together (or neither, for plaintext on loopback)"},
		{"xds tls key without cert", []string{"--node", "n1", "--xds-addr", "127.0.0.1:0", "--xds-tls-key", "k.pem"},
			"--xds-tls-key needs --xds-tls-cert: give the xDS port's certificate and its private key together (or neither, for plaintext on loopback)"},
		{"xds client ca without cert", []string{"--node", "n1", "--xds-addr", "127.0.0.1:0", "--xds-tls-client-ca", "ca.pem"},
			"--xds-tls-client-ca needs --xds-tls-cert and --xds-tls-key: client certificates can only be verified over TLS (aether certs issue --server HOST makes a pair)"},
		{"missing endpoints file", []string{"--node", "n1", "--endpoints-file", "/nonexistent/endpoints"},
			"--endpoints-file: open /nonexistent/endpoints: no such file or directory"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newSentinel(t)
			args := append([]string{"agent", "--registrar", s.addr()}, tc.args...)
			res := runCLI(t, nil, nil, args...)
			if res.err == nil || res.err.Error() != tc.want {
				t.Fatalf("error %v\nwant %s", res.err, tc.want)
			}
			if n := s.conns.Load(); n != 0 {
				t.Errorf("%d connection(s) to the registrar; flags must be checked first", n)
			}
			if res.stdout != "" || res.stderr != "" {
				t.Errorf("output on error: stdout %q, stderr %q", res.stdout, res.stderr)
			}
		})
	}

	// An --xds-addr in use fails at start, naming the flag, before any
	// registrar is dialled.
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	s := newSentinel(t)
	res := runCLI(t, nil, nil, "agent", "--node", "n1", "--registrar", s.addr(), "--xds-addr", taken.Addr().String())
	if want := "--xds-addr " + taken.Addr().String() + ": "; res.err == nil || !strings.HasPrefix(res.err.Error(), want) || !strings.Contains(res.err.Error(), "address already in use") {
		t.Errorf("error %v\nwant %s...address already in use", res.err, want)
	}
	if n := s.conns.Load(); n != 0 {
		t.Errorf("%d connection(s) to the registrar; the xDS address must be checked first", n)
	}

	// A registrar address that cannot be completed to host:port fails as
	// early (a bare host gets the registrar's port, see
	// TestRegistrarAddrDefaultPort).
	res = runCLI(t, nil, nil, "agent", "--node", "n1", "--registrar", "127.0.0.1:9443,registrar-b:")
	if want := `--registrar "registrar-b:": give both host and port (e.g. 127.0.0.1:9443)`; res.err == nil || res.err.Error() != want {
		t.Errorf("error %v\nwant %s", res.err, want)
	}
}

// `aether agent --xds-addr` serves xDS from the agent's cache: a real
// grpc-go xds:/// client reaches the service's endpoint through it, and
// the port is closed once the agent has shut down.
func TestAgentServesXDS(t *testing.T) {
	etcd := etcdtest.Start(t)
	r := startRegistrar(t, etcd)
	b := xdstest.StartBackends(t, 1)[0]
	r.register(t, &registryv1.ServiceEndpoint{Service: "web", Protocol: registryv1.Protocol_PROTOCOL_GRPC, Ip: b.Host(),
		Ports: []*registryv1.Port{{Name: "grpc", Port: b.Port()}}})
	xdsAddr := regtest.FreeAddr(t)
	a := startCLI(t, nil, "agent", "--node", "node-a", "--region", testRegion, "--cluster", testCluster, "--zone", "z1",
		"--registrar", r.addr(), "--drain-period", "100ms", "--endpoint", "own=127.0.0.99:1/grpc", "--xds-addr", xdsAddr)
	cc := xdstest.Client(t, "web", xdstest.Bootstrap(xdsAddr, "proxy-1", xdstest.Locality{}))
	xdstest.WaitSpread(t, cc, xdstest.Only(b), 10*time.Second)
	// xDS serves from the cache before the agent has announced its node;
	// stopping it in the middle of that announce ends it with the
	// announce's context error, so stop it once it runs.
	rc := regtest.Dial(t, r.addr())
	wait.For(t, "the agent to announce node-a", 10*time.Second, func() bool {
		resp, _ := rc.ListNodes(t.Context(), &registrarv1.ListNodesRequest{})
		for _, n := range resp.GetNodes() {
			if n.GetNode().GetName() == "node-a" {
				return true
			}
		}
		return false
	})
	if err := a.stop(t); err != nil {
		t.Fatalf("agent: %v\n%s", err, a.stderr.String())
	}
	if c, err := net.Dial("tcp", xdsAddr); err == nil {
		c.Close()
		t.Fatalf("the xDS port %s still accepts after the agent stopped", xdsAddr)
	}
}

// `aether agent --xds-addr` with --xds-tls-cert, --xds-tls-key and
// --xds-tls-client-ca serves xDS over mutual TLS: a real grpc-go client
// configured by `aether xds bootstrap --ca --cert --key` reaches the
// service through it; and the agent's --http-addr serves /xds/status, so
// `aether xds status` shows that client SYNCED on every type, as it does
// against a registrar.
func TestAgentServesXDSOverMutualTLSAndItsStatus(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, nil, "certs", "init", "--trust-domain", "example.org", "--out", dir)
	mustRun(t, nil, "certs", "issue", "--dir", dir, "--server", "localhost")
	mustRun(t, nil, "certs", "issue", "--dir", dir, "--node", "proxy-1")
	file := func(name string) string { return filepath.Join(dir, name) }

	etcd := etcdtest.Start(t)
	r := startRegistrar(t, etcd)
	b := xdstest.StartBackends(t, 1)[0]
	r.register(t, &registryv1.ServiceEndpoint{Service: "web", Protocol: registryv1.Protocol_PROTOCOL_GRPC, Ip: b.Host(),
		Ports: []*registryv1.Port{{Name: "grpc", Port: b.Port()}}})
	xdsAddr, httpAddr := regtest.FreeAddr(t), regtest.FreeAddr(t)
	a := startCLI(t, nil, "agent", "--node", "node-a", "--region", testRegion, "--cluster", testCluster, "--zone", "z1",
		"--registrar", r.addr(), "--drain-period", "100ms", "--xds-addr", xdsAddr, "--http-addr", httpAddr,
		"--xds-tls-cert", file("server-localhost.pem"), "--xds-tls-key", file("server-localhost-key.pem"),
		"--xds-tls-client-ca", file("ca.pem"))

	_, port, _ := net.SplitHostPort(xdsAddr)
	boot := mustRun(t, nil, "xds", "bootstrap", "--server", net.JoinHostPort("localhost", port), // the certificate's name
		"--node", "proxy-1", "--region", testRegion, "--zone", "z1",
		"--ca", file("ca.pem"), "--cert", file("node-proxy-1.pem"), "--key", file("node-proxy-1-key.pem"))
	cc := xdstest.Client(t, "web", []byte(boot.stdout))
	xdstest.WaitSpread(t, cc, xdstest.Only(b), 10*time.Second)

	var res result
	wait.ForState(t, "the agent's xDS client SYNCED on CDS, EDS, LDS and RDS", 10*time.Second, func() (bool, string) {
		res = runCLI(t, nil, nil, "xds", "status", "--http-addr", httpAddr)
		return res.err == nil && strings.Count(res.stdout, "SYNCED") == 4, res.stdout + errString(res.err)
	})
	t.Logf("aether xds status against the agent:\n%s", res.stdout)
	lines := strings.Split(strings.TrimSpace(res.stdout), "\n")
	if len(lines) != 2 || !strings.HasPrefix(strings.Join(strings.Fields(lines[1]), " "), "proxy-1 eu/z1 sotw SYNCED ") {
		t.Fatalf("table:\n%s", res.stdout)
	}
	res = runCLI(t, nil, nil, "xds", "status", "--http-addr", httpAddr, "-o", "json")
	var doc xds.StatusDocument
	if err := json.Unmarshal([]byte(res.stdout), &doc); res.err != nil || err != nil {
		t.Fatalf("-o json: %v, %v\n%s", res.err, err, res.stdout)
	}
	if len(doc.Clients) != 1 || doc.Clients[0].Node != "proxy-1" || doc.Clients[0].Types[resourcev3.ClusterType].State != xds.Synced {
		t.Fatalf("-o json: %+v", doc)
	}

	// A plaintext xDS client is refused: the bootstrap without --ca.
	plain := xdstest.Client(t, "web", xdstest.Bootstrap(net.JoinHostPort("localhost", port), "proxy-plain", xdstest.Locality{}))
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	if _, err := testgrpc.NewTestServiceClient(plain).UnaryCall(ctx, &testgrpc.SimpleRequest{}); err == nil {
		t.Fatal("a plaintext xDS client got a config from the mutual-TLS port")
	}

	rc := regtest.Dial(t, r.addr())
	wait.For(t, "the agent to announce node-a", 10*time.Second, func() bool {
		resp, _ := rc.ListNodes(t.Context(), &registrarv1.ListNodesRequest{})
		for _, n := range resp.GetNodes() {
			if n.GetNode().GetName() == "node-a" {
				return true
			}
		}
		return false
	})
	if err := a.stop(t); err != nil {
		t.Fatalf("agent: %v\n%s", err, a.stderr.String())
	}
	if !strings.Contains(a.stderr.String(), "tls=true mtls=true") {
		t.Errorf("the agent's log does not say it serves xDS over mutual TLS:\n%s", a.stderr.String())
	}
}
