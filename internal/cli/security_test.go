package cli

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/server"
)

// TestCLIAgainstTLSRegistrar sets up a mesh with the three "aether certs"
// commands, starts a registrar with mTLS and authorization, and runs the
// client commands against it with and without --cacert/--cert/--key.
func TestCLIAgainstTLSRegistrar(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	mustRun(t, nil, "certs", "init", "--trust-domain", "example.org", "--out", dir)
	mustRun(t, nil, "certs", "issue", "--dir", dir, "--server", "localhost")
	mustRun(t, nil, "certs", "issue", "--dir", dir, "--node", "node-a")
	mustRun(t, nil, "certs", "issue", "--dir", dir, "--operator", "alice")
	ca := filepath.Join(dir, "ca.pem")
	pem := func(name string) string { return filepath.Join(dir, name+".pem") }

	etcd := etcdtest.Start(t)
	r := startRegistrar(t, etcd, func(o *server.Config) {
		o.TLSCertFile, o.TLSKeyFile, o.TLSClientCAFile = pem("server-localhost"), pem("server-localhost-key"), ca
		o.TrustDomain = "example.org"
	})

	// The node certificate, as flags: its own endpoint goes in...
	node := []string{"--registrar", r.addr(), "--cacert", ca, "--cert", pem("node-node-a"), "--key", pem("node-node-a-key")}
	res := runCLI(t, nil, nil, append([]string{"register", "--service", "web", "--ip", "10.0.0.1", "--port", "8080", "--node", "node-a"}, node...)...)
	if res.err != nil {
		t.Fatalf("register as node-a: %v", res.err)
	}
	// ... another node's is refused, naming the identity and the rule.
	res = runCLI(t, nil, nil, append([]string{"register", "--service", "web", "--ip", "10.0.0.2", "--port", "8080", "--node", "node-b"}, node...)...)
	if res.err == nil || !strings.Contains(res.err.Error(), "refused by the registrar") ||
		!strings.Contains(res.err.Error(), "spiffe://example.org/node/node-a") || !strings.Contains(res.err.Error(), "may only register endpoints of its own node") {
		t.Errorf("register of node-b's endpoint as node-a: %v", res.err)
	}

	// The operator certificate, from the environment as "aether certs
	// issue --operator" suggests: it lists and drains anything.
	opEnv := map[string]string{"AETHER_REGISTRAR": r.addr(), "AETHER_CACERT": ca, "AETHER_CERT": pem("operator-alice"), "AETHER_KEY": pem("operator-alice-key")}
	res = runCLI(t, nil, opEnv, "list")
	if res.err != nil || !strings.Contains(res.stdout, "10.0.0.1") || strings.Contains(res.stdout, "10.0.0.2") {
		t.Fatalf("list as operator: %v\n%s", res.err, res.stdout)
	}
	if res = runCLI(t, nil, opEnv, "drain", "--service", "web", "--ip", "10.0.0.1"); res.err != nil {
		t.Fatalf("drain as operator: %v", res.err)
	}

	// Without TLS flags: a clear message, not "is the registrar running?".
	res = runCLI(t, nil, nil, "list", "--registrar", r.addr())
	if res.err == nil || !strings.Contains(res.err.Error(), "may require TLS") || !strings.Contains(res.err.Error(), "--cacert, --cert and --key") {
		t.Errorf("list without TLS flags: %v", res.err)
	}
	// TLS but no client certificate.
	res = runCLI(t, nil, nil, "list", "--registrar", r.addr(), "--cacert", ca)
	if res.err == nil || !strings.Contains(res.err.Error(), "no client certificate was given") {
		t.Errorf("list without a client certificate: %v", res.err)
	}
	// Half a key pair fails before dialling.
	res = runCLI(t, nil, nil, "list", "--registrar", r.addr(), "--cacert", ca, "--cert", pem("node-node-a"))
	if res.err == nil || res.err.Error() != "--cert needs --key: give the client certificate and its private key together" {
		t.Errorf("--cert without --key: %v", res.err)
	}
	// A missing file is named.
	res = runCLI(t, nil, nil, "list", "--registrar", r.addr(), "--cacert", filepath.Join(dir, "nope.pem"))
	if res.err == nil || !strings.Contains(res.err.Error(), "--cacert/--cert/--key") || !strings.Contains(res.err.Error(), "nope.pem") {
		t.Errorf("missing --cacert file: %v", res.err)
	}
}

func TestAgentTLSFlagErrors(t *testing.T) {
	t.Parallel()
	s := newSentinel(t)
	res := runCLI(t, nil, nil, "agent", "--registrar", s.addr(), "--node", "n1", "--key", "k.pem")
	if res.err == nil || res.err.Error() != "--key needs --cert: give the client certificate and its private key together" {
		t.Errorf("--key without --cert: %v", res.err)
	}
	res = runCLI(t, nil, nil, "agent", "--registrar", s.addr(), "--node", "n1", "--cacert", "/nonexistent/ca.pem")
	if res.err == nil || !strings.Contains(res.err.Error(), "--cacert/--cert/--key") {
		t.Errorf("missing --cacert file: %v", res.err)
	}
	if n := s.conns.Load(); n != 0 {
		t.Errorf("%d connection(s) to the registrar; flags must be checked first", n)
	}
}

// TestAgentOverMTLS runs "aether agent" with a node certificate against an
// mTLS registrar: it announces its node and registers its endpoint, which
// the registrar authorizes as the node's own.
func TestAgentOverMTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	mustRun(t, nil, "certs", "init", "--trust-domain", "example.org", "--out", dir)
	mustRun(t, nil, "certs", "issue", "--dir", dir, "--server", "localhost")
	mustRun(t, nil, "certs", "issue", "--dir", dir, "--node", "node-a")
	mustRun(t, nil, "certs", "issue", "--dir", dir, "--operator", "alice")
	ca := filepath.Join(dir, "ca.pem")
	pem := func(name string) string { return filepath.Join(dir, name+".pem") }
	etcd := etcdtest.Start(t)
	r := startRegistrar(t, etcd, func(o *server.Config) {
		o.TLSCertFile, o.TLSKeyFile, o.TLSClientCAFile = pem("server-localhost"), pem("server-localhost-key"), ca
		o.TrustDomain = "example.org"
	})

	a := startCLI(t, nil, "agent", "--node", "node-a", "--region", testRegion, "--cluster", testCluster,
		"--registrar", r.addr(), "--drain-period", "100ms", "--endpoint", "web=10.0.0.5:8080/http",
		"--cacert", ca, "--cert", pem("node-node-a"), "--key", pem("node-node-a-key"))
	opEnv := map[string]string{"AETHER_REGISTRAR": r.addr(), "AETHER_CACERT": ca, "AETHER_CERT": pem("operator-alice"), "AETHER_KEY": pem("operator-alice-key")}
	waitFor(t, "the agent's endpoint and node", 10*time.Second, func() bool {
		l, n := runCLI(t, nil, opEnv, "list"), runCLI(t, nil, opEnv, "nodes")
		return l.err == nil && strings.Contains(l.stdout, "10.0.0.5") && n.err == nil && strings.Contains(n.stdout, "node-a")
	})
	if err := a.stop(t); err != nil {
		t.Errorf("agent: %v\n%s", err, a.stderr.String())
	}
}
