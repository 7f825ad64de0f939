package cli

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aethermesh/aether/pki"
)

func readLeaf(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(raw)
	if block == nil {
		t.Fatalf("%s: no PEM", path)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func mustRun(t *testing.T, env map[string]string, args ...string) result {
	t.Helper()
	res := runCLI(t, nil, env, args...)
	if res.err != nil {
		t.Fatalf("aether %s: %v\nstdout:\n%s", strings.Join(args, " "), res.err, res.stdout)
	}
	return res
}

func wantContains(t *testing.T, what, got string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(got, w) {
			t.Errorf("%s does not contain %q:\n%s", what, w, got)
		}
	}
}

// TestCertsThreeCommands is the secure local setup of the issue: three
// commands, then a registrar and a node complete a mutual-TLS handshake
// with the files they wrote.
func TestCertsThreeCommands(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "certs")

	res := mustRun(t, nil, "certs", "init", "--trust-domain", "example.org", "--out", dir)
	wantContains(t, "init output", res.stdout,
		`created a CA for trust domain "example.org"`,
		filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem"), filepath.Join(dir, "ca.json"),
		"next: aether certs issue --dir "+dir+" --server HOST")

	res = mustRun(t, nil, "certs", "issue", "--dir", dir, "--server", "localhost,10.0.0.10")
	srvCert, srvKey := filepath.Join(dir, "server-localhost.pem"), filepath.Join(dir, "server-localhost-key.pem")
	wantContains(t, "issue --server output", res.stdout,
		"issued server certificate spiffe://example.org/server/localhost, valid until ",
		srvCert, srvKey,
		"for DNS names [localhost] and IPs [10.0.0.10 127.0.0.1 ::1]",
		"use: aether registrar --trust-domain example.org --tls-cert "+srvCert+" --tls-key "+srvKey+" --tls-client-ca "+filepath.Join(dir, "ca.pem"))

	res = mustRun(t, nil, "certs", "issue", "--dir", dir, "--node", "node-a")
	nodeCert, nodeKey := filepath.Join(dir, "node-node-a.pem"), filepath.Join(dir, "node-node-a-key.pem")
	wantContains(t, "issue --node output", res.stdout,
		"issued node certificate spiffe://example.org/node/node-a",
		"use: aether agent --node node-a --cacert "+filepath.Join(dir, "ca.pem")+" --cert "+nodeCert+" --key "+nodeKey)

	// The files work: a handshake over loopback that requires the client
	// certificate.
	cfg, r, err := pki.ServerTLSConfig(srvCert, srvKey, filepath.Join(dir, "ca.pem"), true, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peer := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			peer <- err.Error()
			return
		}
		defer c.Close()
		tc := c.(*tls.Conn)
		if err := tc.Handshake(); err != nil {
			peer <- err.Error()
			return
		}
		peer <- tc.ConnectionState().PeerCertificates[0].URIs[0].String()
		tc.Write([]byte{1})
	}()
	ccfg, err := pki.ClientTLSConfig(filepath.Join(dir, "ca.pem"), nodeCert, nodeKey)
	if err != nil {
		t.Fatal(err)
	}
	ccfg.ServerName = "127.0.0.1"
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", ln.Addr().String(), ccfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(conn, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	if got := <-peer; got != "spiffe://example.org/node/node-a" {
		t.Errorf("registrar saw %s", got)
	}
}

func TestCertsIssue(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	dir := filepath.Join(base, "ca")
	mustRun(t, map[string]string{"AETHER_TRUST_DOMAIN": "mesh.internal"}, "certs", "init", "--out", dir)

	// Operator, with --dir from the environment and --out elsewhere.
	out := filepath.Join(base, "alice")
	res := mustRun(t, map[string]string{"AETHER_DIR": dir}, "certs", "issue", "--operator", "alice", "--out", out)
	opCert := filepath.Join(out, "operator-alice.pem")
	wantContains(t, "issue --operator output", res.stdout,
		"issued operator certificate spiffe://mesh.internal/operator/alice",
		"use: export AETHER_CACERT="+filepath.Join(dir, "ca.pem")+" AETHER_CERT="+opCert+" AETHER_KEY="+filepath.Join(out, "operator-alice-key.pem")+"  # then aether list")
	c := readLeaf(t, opCert)
	if len(c.URIs) != 1 || c.URIs[0].String() != "spiffe://mesh.internal/operator/alice" {
		t.Errorf("operator URIs %v", c.URIs)
	}
	if st, err := os.Stat(filepath.Join(out, "operator-alice-key.pem")); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("key file: %v, %v", st, err)
	}

	// Refused over an existing certificate; replaced with --force.
	mustRun(t, nil, "certs", "issue", "--dir", dir, "--node", "n1", "--validity", "48h")
	nodeCert := filepath.Join(dir, "node-n1.pem")
	first := readLeaf(t, nodeCert)
	if d := time.Until(first.NotAfter); d > 48*time.Hour || d < 47*time.Hour {
		t.Errorf("--validity 48h: valid for %v more", d)
	}
	res = runCLI(t, nil, nil, "certs", "issue", "--dir", dir, "--node", "n1")
	if res.err == nil || res.err.Error() != nodeCert+" already exists; pass --force to replace it (a running registrar or agent reloads the new files), or remove it" {
		t.Errorf("issue over an existing certificate: %v", res.err)
	}
	mustRun(t, nil, "certs", "issue", "--dir", dir, "--node", "n1", "--force")
	if readLeaf(t, nodeCert).SerialNumber.Cmp(first.SerialNumber) == 0 {
		t.Error("--force kept the old certificate")
	}

	// --no-localhost.
	mustRun(t, nil, "certs", "issue", "--dir", dir, "--server", "10.1.1.1", "--no-localhost")
	if c := readLeaf(t, filepath.Join(dir, "server-10.1.1.1.pem")); len(c.DNSNames) != 0 || len(c.IPAddresses) != 1 {
		t.Errorf("--no-localhost: DNS %v IPs %v", c.DNSNames, c.IPAddresses)
	}

	// A second init is refused, naming the flag, the file and the way on.
	res = runCLI(t, nil, nil, "certs", "init", "--trust-domain", "mesh.internal", "--out", dir)
	if res.err == nil {
		t.Fatal("second init succeeded")
	}
	wantContains(t, "second init error", res.err.Error(),
		"--out "+dir+": a CA already exists there ("+filepath.Join(dir, "ca.pem")+")",
		`"aether certs issue --dir `+dir+` --server HOST"`,
		"remove ca.pem, ca-key.pem and ca.json to start over")
}

func TestCertsErrors(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "ca")
	mustRun(t, nil, "certs", "init", "--trust-domain", "example.org", "--out", dir)
	empty := t.TempDir()
	issue := func(extra ...string) []string { return append([]string{"certs", "issue", "--dir", dir}, extra...) }

	tests := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"init without trust domain", nil, []string{"certs", "init", "--out", empty}, "--trust-domain is required (e.g. --trust-domain example.org)"},
		{"init uppercase trust domain", nil, []string{"certs", "init", "--trust-domain", "Example.org", "--out", empty}, `--trust-domain: trust domain "Example.org" must be lowercase`},
		{"init bad trust domain", nil, []string{"certs", "init", "--trust-domain", "a/b", "--out", empty}, `--trust-domain: trust domain "a/b" contains "/"`},
		{"init empty out", nil, []string{"certs", "init", "--trust-domain", "example.org", "--out", ""}, "--out must not be empty"},
		{"init positional", nil, []string{"certs", "init", "x"}, `unknown command "x" for "aether certs init"`},
		{"issue nothing", nil, issue(), "give one of --node NAME, --operator NAME or --server HOST[,HOST...]"},
		{"issue two", nil, issue("--node", "a", "--server", "b"), "--node and --server are both set; give exactly one of --node, --operator or --server"},
		{"issue three", nil, issue("--node", "a", "--operator", "b", "--server", "c"), "--node and --operator and --server are all set"},
		{"issue node from env", map[string]string{"AETHER_NODE": "node-a"}, issue("--server", "localhost"), "--node and --server are both set; give exactly one of --node, --operator or --server (the environment variables AETHER_NODE, AETHER_OPERATOR and AETHER_SERVER set them too)"},
		{"issue bad node", nil, issue("--node", "a b"), `--node: node name "a b" contains " "`},
		{"issue empty node", nil, issue("--node", ""), "--node: node name must not be empty"},
		{"issue bad operator", nil, issue("--operator", "a/b"), `--operator: operator name "a/b" must not contain '/'`},
		{"issue empty server host", nil, issue("--server", "a,,b"), `--server: server host list "a,,b" has an empty host`},
		{"issue unspecified server", nil, issue("--server", "::"), `--server: server host "::" is the unspecified address`},
		{"issue no-localhost for a node", nil, issue("--node", "a", "--no-localhost"), "--no-localhost applies only to --server; drop it with --node"},
		{"issue zero validity", nil, issue("--node", "a", "--validity", "0s"), "--validity 0s: must be positive"},
		{"issue bad validity", nil, issue("--node", "a", "--validity", "1y"), `invalid argument "1y" for "--validity" flag`},
		{"issue empty dir", nil, []string{"certs", "issue", "--dir", "", "--node", "a"}, "--dir must not be empty"},
		{"issue empty out", nil, issue("--node", "a", "--out", ""), "--out must not be empty (leave it out to write into --dir)"},
		{"issue without CA", nil, []string{"certs", "issue", "--dir", empty, "--node", "a"},
			"--dir " + empty + ": no CA there (" + filepath.Join(empty, "ca.json") + ` does not exist); create one with "aether certs init --trust-domain DOMAIN --out ` + empty + `", or point --dir at an existing one`},
		{"issue unknown flag", nil, issue("--bogus"), "unknown flag: --bogus (see 'aether certs issue --help')"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res := runCLI(t, nil, tc.env, tc.args...)
			if res.err == nil || !strings.Contains(res.err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", res.err, tc.want)
			}
			if res.stdout != "" {
				t.Errorf("wrote to stdout on error:\n%s", res.stdout)
			}
		})
	}
	// None of the failures wrote anything.
	if ents, _ := os.ReadDir(empty); len(ents) != 0 {
		t.Errorf("failed commands wrote %d files into %s", len(ents), empty)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 3 {
		t.Errorf("failed issues wrote into the CA dir: %d entries", len(ents))
	}
}

func TestCertsHelp(t *testing.T) {
	t.Parallel()
	res := mustRun(t, nil, "certs", "issue", "--help")
	wantContains(t, "help", res.stdout, "--node", "--operator", "--server", "[$AETHER_DIR]", "[$AETHER_FORCE]")
	res = mustRun(t, nil, "certs", "--help")
	wantContains(t, "help", res.stdout, "init", "issue", "spiffe://<trust-domain>/node/<name>")
}

func TestShellQuote(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"certs/ca.pem": "certs/ca.pem",
		"my certs/x":   "'my certs/x'",
		"it's":         `'it'\''s'`,
		"":             "''",
	} {
		if got := shellQuote(in); got != want {
			t.Errorf("shellQuote(%q) = %s, want %s", in, got, want)
		}
	}
}
