package pki

import (
	"crypto/x509"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aethermesh/aether/authz"
)

const td = "example.org"

// newCA makes a CA for trust domain in a fresh directory.
func newCA(t *testing.T, trustDomain string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "ca")
	if err := InitCA(dir, trustDomain); err != nil {
		t.Fatal(err)
	}
	return dir
}

// mustIssue issues a certificate or fails the test.
func mustIssue(t *testing.T, dir string, kind Kind, name string, opts ...IssueOption) *Issued {
	t.Helper()
	iss, err := Issue(dir, kind, name, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return iss
}

func leafOf(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	certs, err := readCerts(path)
	if err != nil {
		t.Fatal(err)
	}
	return certs[0]
}

func poolOf(t *testing.T, paths ...string) *x509.CertPool {
	t.Helper()
	pool := x509.NewCertPool()
	for _, p := range paths {
		certs, err := readCerts(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range certs {
			pool.AddCert(c)
		}
	}
	return pool
}

func mode(t *testing.T, path string) fs.FileMode {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Mode().Perm()
}

func TestInitCA(t *testing.T) {
	t.Parallel()
	dir := newCA(t, td)

	if m := mode(t, filepath.Join(dir, CAKeyFile)); m != 0o600 {
		t.Errorf("%s mode %v, want 0600", CAKeyFile, m)
	}
	raw, err := os.ReadFile(filepath.Join(dir, CAInfoFile))
	if err != nil {
		t.Fatal(err)
	}
	var info caInfo
	if err := json.Unmarshal(raw, &info); err != nil {
		t.Fatal(err)
	}
	if info.TrustDomain != td {
		t.Errorf("ca.json trust_domain %q, want %q", info.TrustDomain, td)
	}

	ca := leafOf(t, filepath.Join(dir, CACertFile))
	if !ca.IsCA || !ca.BasicConstraintsValid || ca.MaxPathLen != 0 || !ca.MaxPathLenZero {
		t.Errorf("CA constraints: IsCA=%v MaxPathLen=%d zero=%v", ca.IsCA, ca.MaxPathLen, ca.MaxPathLenZero)
	}
	if ca.KeyUsage&x509.KeyUsageCertSign == 0 {
		t.Error("CA cannot sign certificates")
	}
	if got := time.Until(ca.NotAfter); got < CAValidity-time.Hour || got > CAValidity {
		t.Errorf("CA valid for %v more, want about %v", got, CAValidity)
	}
	if len(ca.URIs) != 1 || ca.URIs[0].String() != "spiffe://"+td {
		t.Errorf("CA URIs %v, want [spiffe://%s]", ca.URIs, td)
	}
	if _, err := ca.Verify(x509.VerifyOptions{Roots: poolOf(t, filepath.Join(dir, CACertFile))}); err != nil {
		t.Errorf("CA does not verify against itself: %v", err)
	}
	loaded, err := LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	if loaded.TrustDomain != td {
		t.Errorf("LoadCA trust domain %q", loaded.TrustDomain)
	}

	// A second init is refused and changes nothing.
	before, _ := os.ReadFile(filepath.Join(dir, CAKeyFile))
	err = InitCA(dir, "other.org")
	var exists *ExistsError
	if !errors.As(err, &exists) || !errors.Is(err, fs.ErrExist) {
		t.Fatalf("second InitCA: %v, want *ExistsError", err)
	}
	for _, want := range []string{filepath.Join(dir, CACertFile), "already exists", "remove"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("second InitCA error %q does not mention %q", err, want)
		}
	}
	after, _ := os.ReadFile(filepath.Join(dir, CAKeyFile))
	if string(before) != string(after) {
		t.Error("second InitCA changed the CA key")
	}
}

func TestInitCARefusesPartialCA(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, CAInfoFile), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := InitCA(dir, td)
	if !errors.Is(err, fs.ErrExist) || !strings.Contains(err.Error(), CAInfoFile) {
		t.Fatalf("InitCA over a stray ca.json: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, CAKeyFile)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("refused InitCA wrote a key: %v", err)
	}
}

func TestInitCABadTrustDomain(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"", "Example.org", "exa mple", "a/b", "spiffe://x"} {
		if err := InitCA(filepath.Join(t.TempDir(), "ca"), bad); err == nil {
			t.Errorf("InitCA(%q) succeeded", bad)
		}
	}
}

func TestIssue(t *testing.T) {
	t.Parallel()
	dir := newCA(t, td)
	roots := poolOf(t, filepath.Join(dir, CACertFile))
	client := x509.ExtKeyUsageClientAuth
	server := x509.ExtKeyUsageServerAuth

	tests := []struct {
		kind      Kind
		name      string
		opts      []IssueOption
		wantFile  string
		wantURI   string
		wantUsage []x509.ExtKeyUsage
		wantDNS   []string
		wantIPs   []string
		verifyAs  []string // host names and IPs the certificate must be valid for
		rejectAs  []string
		wantID    authz.Identity
	}{
		{
			kind: Node, name: "node-a", wantFile: "node-node-a",
			wantURI: "spiffe://example.org/node/node-a", wantUsage: []x509.ExtKeyUsage{client, server},
			wantID: authz.Identity{Kind: authz.Node, Name: "node-a", URI: "spiffe://example.org/node/node-a"},
		},
		{
			kind: Operator, name: "alice", wantFile: "operator-alice",
			wantURI: "spiffe://example.org/operator/alice", wantUsage: []x509.ExtKeyUsage{client},
			wantID: authz.Identity{Kind: authz.Operator, Name: "alice", URI: "spiffe://example.org/operator/alice"},
		},
		{
			kind: Server, name: "reg.example.com, 10.0.0.5,fd00::5,REG.example.com", wantFile: "server-reg.example.com",
			wantURI: "spiffe://example.org/server/reg.example.com", wantUsage: []x509.ExtKeyUsage{server, client},
			wantDNS:  []string{"reg.example.com", "localhost"},
			wantIPs:  []string{"10.0.0.5", "fd00::5", "127.0.0.1", "::1"},
			verifyAs: []string{"reg.example.com", "10.0.0.5", "fd00::5", "localhost", "127.0.0.1", "::1"},
			rejectAs: []string{"other.example.com", "10.0.0.6"},
			wantID:   authz.Identity{Kind: authz.Server, Name: "reg.example.com", URI: "spiffe://example.org/server/reg.example.com"},
		},
		{
			kind: Server, name: "10.1.2.3", opts: []IssueOption{WithoutLocalhost()}, wantFile: "server-10.1.2.3",
			wantURI: "spiffe://example.org/server/10.1.2.3", wantUsage: []x509.ExtKeyUsage{server, client},
			wantIPs:  []string{"10.1.2.3"},
			verifyAs: []string{"10.1.2.3"},
			rejectAs: []string{"localhost", "127.0.0.1"},
			wantID:   authz.Identity{Kind: authz.Server, Name: "10.1.2.3", URI: "spiffe://example.org/server/10.1.2.3"},
		},
		{
			kind: Server, name: "::1", wantFile: "server---1",
			wantURI: "spiffe://example.org/server/--1", wantUsage: []x509.ExtKeyUsage{server, client},
			wantDNS: []string{"localhost"}, wantIPs: []string{"::1", "127.0.0.1"},
			wantID: authz.Identity{Kind: authz.Server, Name: "--1", URI: "spiffe://example.org/server/--1"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.kind.String()+"/"+tc.name, func(t *testing.T) {
			iss := mustIssue(t, dir, tc.kind, tc.name, tc.opts...)
			if want := filepath.Join(dir, tc.wantFile+".pem"); iss.CertFile != want {
				t.Errorf("CertFile %s, want %s", iss.CertFile, want)
			}
			if want := filepath.Join(dir, tc.wantFile+"-key.pem"); iss.KeyFile != want {
				t.Errorf("KeyFile %s, want %s", iss.KeyFile, want)
			}
			if m := mode(t, iss.KeyFile); m != 0o600 {
				t.Errorf("key mode %v, want 0600", m)
			}
			if iss.URI != tc.wantURI || iss.TrustDomain != td || iss.CAFile != filepath.Join(dir, CACertFile) {
				t.Errorf("Issued %+v", iss)
			}

			c := leafOf(t, iss.CertFile)
			if len(c.URIs) != 1 || c.URIs[0].String() != tc.wantURI {
				t.Errorf("URIs %v, want [%s]", c.URIs, tc.wantURI)
			}
			if !slices.Equal(c.ExtKeyUsage, tc.wantUsage) {
				t.Errorf("ExtKeyUsage %v, want %v", c.ExtKeyUsage, tc.wantUsage)
			}
			if c.KeyUsage != x509.KeyUsageDigitalSignature || c.IsCA {
				t.Errorf("KeyUsage %v IsCA %v", c.KeyUsage, c.IsCA)
			}
			if !slices.Equal(c.DNSNames, tc.wantDNS) {
				t.Errorf("DNSNames %v, want %v", c.DNSNames, tc.wantDNS)
			}
			var ips []string
			for _, ip := range c.IPAddresses {
				ips = append(ips, ip.String())
			}
			if !slices.Equal(ips, tc.wantIPs) {
				t.Errorf("IPs %v, want %v", ips, tc.wantIPs)
			}
			if got := time.Until(c.NotAfter); got < DefaultValidity-time.Hour || got > DefaultValidity {
				t.Errorf("valid for %v more, want about %v", got, DefaultValidity)
			}
			if !c.NotAfter.Equal(iss.NotAfter.Truncate(time.Second)) {
				t.Errorf("NotAfter %v, Issued says %v", c.NotAfter, iss.NotAfter)
			}
			// Chains to the CA for each of its usages.
			for _, u := range tc.wantUsage {
				if _, err := c.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{u}}); err != nil {
					t.Errorf("verify for usage %v: %v", u, err)
				}
			}
			if tc.kind == Operator {
				if _, err := c.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{server}}); err == nil {
					t.Error("operator certificate verifies for server auth")
				}
			}
			for _, h := range tc.verifyAs {
				if _, err := c.Verify(x509.VerifyOptions{Roots: roots, DNSName: h}); err != nil {
					t.Errorf("not valid for %s: %v", h, err)
				}
			}
			for _, h := range tc.rejectAs {
				if _, err := c.Verify(x509.VerifyOptions{Roots: roots, DNSName: h}); err == nil {
					t.Errorf("valid for %s", h)
				}
			}
			// The key belongs to the certificate.
			if _, err := ClientTLSConfig("", iss.CertFile, iss.KeyFile); err != nil {
				t.Error(err)
			}
			// authz reads back what pki wrote.
			id, err := authz.ParseIdentity(c, td, "")
			if err != nil || id != tc.wantID {
				t.Errorf("ParseIdentity = %+v, %v; want %+v", id, err, tc.wantID)
			}
		})
	}
}

func TestIssueOutDirOverwriteValidity(t *testing.T) {
	t.Parallel()
	dir := newCA(t, td)
	out := filepath.Join(t.TempDir(), "certs")

	first := mustIssue(t, dir, Node, "n1", WithOutDir(out))
	if filepath.Dir(first.CertFile) != out || filepath.Dir(first.KeyFile) != out {
		t.Fatalf("written to %s and %s, want %s", first.CertFile, first.KeyFile, out)
	}
	_, err := Issue(dir, Node, "n1", WithOutDir(out))
	var exists *ExistsError
	if !errors.As(err, &exists) || exists.Path != first.CertFile {
		t.Fatalf("issue over existing: %v, want *ExistsError for %s", err, first.CertFile)
	}
	serial := leafOf(t, first.CertFile).SerialNumber
	second := mustIssue(t, dir, Node, "n1", WithOutDir(out), WithOverwrite())
	if leafOf(t, second.CertFile).SerialNumber.Cmp(serial) == 0 {
		t.Error("WithOverwrite kept the old certificate")
	}
	if m := mode(t, second.KeyFile); m != 0o600 {
		t.Errorf("overwritten key mode %v, want 0600", m)
	}
	if ents, _ := os.ReadDir(out); len(ents) != 2 {
		t.Errorf("%d files in %s after overwrite, want 2 (no temporary files left)", len(ents), out)
	}

	// Validity is cut to the CA's.
	long := mustIssue(t, dir, Operator, "bob", WithValidity(50*365*24*time.Hour))
	ca, err := LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := leafOf(t, long.CertFile).NotAfter; !got.Equal(ca.Cert.NotAfter) {
		t.Errorf("NotAfter %v, want the CA's %v", got, ca.Cert.NotAfter)
	}
	short := mustIssue(t, dir, Operator, "carol", WithValidity(time.Hour))
	if got := time.Until(leafOf(t, short.CertFile).NotAfter); got > time.Hour || got < 59*time.Minute {
		t.Errorf("WithValidity(1h): valid for %v more", got)
	}
}

func TestIssueErrors(t *testing.T) {
	t.Parallel()
	dir := newCA(t, td)
	tests := []struct {
		kind Kind
		name string
		want string
	}{
		{Node, "", "node name must not be empty"},
		{Node, "a/b", `node name "a/b" must not contain '/'`},
		{Node, "-a", "must start and end with a letter or digit"},
		{Operator, "al ice", `operator name "al ice" contains " "`},
		{Server, "", "empty host"},
		{Server, "a,,b", "empty host"},
		{Server, "0.0.0.0", "unspecified address"},
		{Server, "fe80::1%eth0", "has a zone"},
		{Server, "*.example.com", `contains "*"`},
		{Kind(9), "x", "unknown certificate kind"},
	}
	for _, tc := range tests {
		_, err := Issue(dir, tc.kind, tc.name)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Issue(%v, %q) = %v, want error containing %q", tc.kind, tc.name, err, tc.want)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 3 {
		t.Errorf("failed issues left files: %d entries in the CA dir", len(ents))
	}

	_, err := Issue(filepath.Join(t.TempDir(), "nope"), Node, "n1")
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), CAInfoFile) {
		t.Errorf("Issue without a CA: %v", err)
	}

	// A CA whose key does not match its certificate is refused.
	other := newCA(t, td)
	if err := os.Rename(filepath.Join(other, CAKeyFile), filepath.Join(dir, CAKeyFile)); err != nil {
		t.Fatal(err)
	}
	if _, err := Issue(dir, Node, "n1"); err == nil || !strings.Contains(err.Error(), "is not the key of") {
		t.Errorf("Issue with a mismatched CA key: %v", err)
	}
}

// TestIssueExpiredCA checks that an expired CA issues nothing.
func TestIssueExpiredCA(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "ca")
	if err := initCA(dir, td, time.Now().Add(-11*365*24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := Issue(dir, Node, "n1"); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Errorf("Issue from an expired CA: %v", err)
	}
}
