package pki

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"
)

// withNow issues as of now (for expired certificates).
func withNow(now time.Time) IssueOption {
	return func(c *issueConfig) { c.now = func() time.Time { return now } }
}

// tlsServer accepts TLS connections on a real loopback socket, completes
// the handshake, writes one byte and closes.
type tlsServer struct {
	ln      net.Listener
	results chan serverResult
}

type serverResult struct {
	err  error
	peer []*x509.Certificate
}

func startTLSServer(t *testing.T, cfg *tls.Config) *tlsServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &tlsServer{ln: ln, results: make(chan serverResult, 64)}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				tc := tls.Server(c, cfg)
				res := serverResult{err: tc.Handshake()}
				if res.err == nil {
					res.peer = tc.ConnectionState().PeerCertificates
					_, res.err = tc.Write([]byte{1})
				}
				s.results <- res
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	return s
}

// dial handshakes with cfg and reads the server's byte, which surfaces a
// rejected client certificate also under TLS 1.3 (where the client's
// handshake completes before the server has checked it). It returns the
// client's view and the server's result.
func (s *tlsServer) dial(t *testing.T, cfg *tls.Config) (*tls.ConnectionState, serverResult, error) {
	t.Helper()
	d := &net.Dialer{Timeout: 10 * time.Second}
	conn, err := tls.DialWithDialer(d, "tcp", s.ln.Addr().String(), cfg)
	if err == nil {
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		_, err = io.ReadFull(conn, make([]byte, 1))
	}
	var res serverResult
	select {
	case res = <-s.results:
	case <-time.After(10 * time.Second):
		t.Fatal("server did not finish the handshake")
	}
	if err != nil {
		return nil, res, err
	}
	st := conn.ConnectionState()
	return &st, res, nil
}

// servedSerial handshakes and returns the serial of the server's leaf.
func (s *tlsServer) servedSerial(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	st, res, err := s.dial(t, cfg)
	if err != nil {
		t.Fatalf("handshake: %v (server: %v)", err, res.err)
	}
	return st.PeerCertificates[0].SerialNumber.String()
}

func serialOf(t *testing.T, path string) string {
	t.Helper()
	return leafOf(t, path).SerialNumber.String()
}

func clientConfig(t *testing.T, caFile string, iss *Issued) *tls.Config {
	t.Helper()
	var cert, key string
	if iss != nil {
		cert, key = iss.CertFile, iss.KeyFile
	}
	cfg, err := ClientTLSConfig(caFile, cert, key)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ServerName = "localhost"
	return cfg
}

// TestMTLS runs real handshakes over loopback with a server that requires
// client certificates.
func TestMTLS(t *testing.T) {
	t.Parallel()
	dir := newCA(t, td)
	caFile := filepath.Join(dir, CACertFile)
	srv := mustIssue(t, dir, Server, "localhost")
	node := mustIssue(t, dir, Node, "node-a")
	op := mustIssue(t, dir, Operator, "alice")
	otherDir := newCA(t, td)
	stranger := mustIssue(t, otherDir, Node, "node-a")

	cfg, r, err := ServerTLSConfig(srv.CertFile, srv.KeyFile, caFile, true, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if cfg.ClientAuth != tls.RequireAndVerifyClientCert {
		t.Errorf("ClientAuth %v, want RequireAndVerifyClientCert", cfg.ClientAuth)
	}
	s := startTLSServer(t, cfg)

	for _, iss := range []*Issued{node, op} {
		st, res, err := s.dial(t, clientConfig(t, caFile, iss))
		if err != nil {
			t.Fatalf("%s: handshake: %v (server: %v)", iss.URI, err, res.err)
		}
		if got := st.PeerCertificates[0].URIs[0].String(); got != srv.URI {
			t.Errorf("client saw server %s, want %s", got, srv.URI)
		}
		if len(res.peer) == 0 || res.peer[0].URIs[0].String() != iss.URI {
			t.Errorf("server saw client %v, want %s", res.peer, iss.URI)
		}
	}

	// Dialling the IP verifies the IP SAN.
	ipCfg := clientConfig(t, caFile, node)
	ipCfg.ServerName = "127.0.0.1"
	if _, res, err := s.dial(t, ipCfg); err != nil {
		t.Errorf("by IP: %v (server: %v)", err, res.err)
	}

	// No client certificate, or one from another CA: refused.
	for name, c := range map[string]*tls.Config{
		"no certificate":    clientConfig(t, caFile, nil),
		"another CA's node": clientConfig(t, caFile, stranger),
	} {
		_, res, err := s.dial(t, c)
		if err == nil || res.err == nil {
			t.Errorf("%s: client err %v, server err %v; want both to fail", name, err, res.err)
		}
	}

	// The client refuses a server from another CA.
	other := clientConfig(t, filepath.Join(otherDir, CACertFile), nil)
	if _, _, err := s.dial(t, other); err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Errorf("client trusting another CA: %v", err)
	}
}

// TestOptionalClientCert checks VerifyClientCertIfGiven: no certificate
// gets through (the registrar answers UNAUTHENTICATED per call), a bad one
// does not.
func TestOptionalClientCert(t *testing.T) {
	t.Parallel()
	dir := newCA(t, td)
	caFile := filepath.Join(dir, CACertFile)
	srv := mustIssue(t, dir, Server, "localhost")
	stranger := mustIssue(t, newCA(t, td), Node, "n")

	cfg, r, err := ServerTLSConfig(srv.CertFile, srv.KeyFile, caFile, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if cfg.ClientAuth != tls.VerifyClientCertIfGiven {
		t.Errorf("ClientAuth %v", cfg.ClientAuth)
	}
	s := startTLSServer(t, cfg)
	if _, res, err := s.dial(t, clientConfig(t, caFile, nil)); err != nil || len(res.peer) != 0 {
		t.Errorf("no certificate: %v, server saw %d certificates", err, len(res.peer))
	}
	if _, res, err := s.dial(t, clientConfig(t, caFile, stranger)); err == nil || res.err == nil {
		t.Errorf("stranger: client %v, server %v; want refused", err, res.err)
	}

	// Without a client CA, no certificates are asked for.
	plain, r2, err := ServerTLSConfig(srv.CertFile, srv.KeyFile, "", false, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if plain.ClientAuth != tls.NoClientCert || plain.GetConfigForClient != nil {
		t.Errorf("plain TLS: ClientAuth %v", plain.ClientAuth)
	}
}

func TestServerTLSConfigErrors(t *testing.T) {
	t.Parallel()
	dir := newCA(t, td)
	srv := mustIssue(t, dir, Server, "localhost")
	garbage := filepath.Join(t.TempDir(), "garbage.pem")
	os.WriteFile(garbage, []byte("not pem"), 0o644)
	tests := []struct {
		name          string
		cert, key, ca string
		require       bool
		want          string
	}{
		{"no key", srv.CertFile, "", "", false, "certificate file and its key"},
		{"require without CA", srv.CertFile, srv.KeyFile, "", true, "needs a client CA file"},
		{"missing cert", filepath.Join(dir, "nope.pem"), srv.KeyFile, "", false, "no such file"},
		{"key of another", srv.CertFile, filepath.Join(dir, CAKeyFile), "", false, "private key does not match public key"},
		{"bad CA", srv.CertFile, srv.KeyFile, garbage, true, "no PEM certificate found"},
	}
	for _, tc := range tests {
		_, r, err := ServerTLSConfig(tc.cert, tc.key, tc.ca, tc.require, time.Second)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want error containing %q", tc.name, err, tc.want)
		}
		if r != nil {
			t.Errorf("%s: got a Reloader with an error", tc.name)
		}
	}
}

// reloads collects OnReload reports.
type reloads chan error

func (c reloads) next(t *testing.T) error {
	t.Helper()
	select {
	case err := <-c:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("no reload reported")
		return nil
	}
}

// loaded waits for a successful reload. Issue writes the key and then the
// certificate, so a poll in between may first report a mismatched pair.
func (c reloads) loaded(t *testing.T) {
	t.Helper()
	for {
		err := c.next(t)
		if err == nil {
			return
		}
		if !strings.Contains(err.Error(), "private key does not match public key") {
			t.Fatalf("reload: %v", err)
		}
	}
}

// TestReloadServerCertificate replaces the server's certificate files
// while it runs and checks the next handshake presents the new certificate,
// and that bad replacements keep the previous one.
func TestReloadServerCertificate(t *testing.T) {
	t.Parallel()
	dir := newCA(t, td)
	caFile := filepath.Join(dir, CACertFile)
	srv := mustIssue(t, dir, Server, "localhost")

	got := make(reloads, 16)
	cfg, r, err := ServerTLSConfig(srv.CertFile, srv.KeyFile, caFile, true, 10*time.Millisecond, OnReload(func(err error) { got <- err }))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	s := startTLSServer(t, cfg)
	client := clientConfig(t, caFile, mustIssue(t, dir, Node, "node-a"))

	first := s.servedSerial(t, client)
	if first != serialOf(t, srv.CertFile) {
		t.Fatalf("served %s, want the file's %s", first, serialOf(t, srv.CertFile))
	}

	// A new certificate, written in place by rename: picked up by polling.
	mustIssue(t, dir, Server, "localhost", WithOverwrite())
	got.loaded(t)
	second := s.servedSerial(t, client)
	if second == first || second != serialOf(t, srv.CertFile) {
		t.Fatalf("after reload served %s; old %s, file %s", second, first, serialOf(t, srv.CertFile))
	}

	// Bad replacements: each is reported once and the previous pair stays.
	goodCert, _ := os.ReadFile(srv.CertFile)
	goodKey, _ := os.ReadFile(srv.KeyFile)
	otherKey, _ := os.ReadFile(filepath.Join(dir, CAKeyFile))
	expired := mustIssue(t, dir, Server, "expired", withNow(time.Now().Add(-2*DefaultValidity)))
	expiredCert, _ := os.ReadFile(expired.CertFile)
	expiredKey, _ := os.ReadFile(expired.KeyFile)
	bad := []struct {
		name      string
		cert, key []byte
		want      string
	}{
		{"garbage", []byte("-----BEGIN CERTIFICATE-----\nnope\n"), goodKey, "failed to find any PEM data"},
		{"empty", []byte{}, goodKey, "failed to find any PEM data"},
		{"mismatched key", goodCert, otherKey, "private key does not match public key"},
		{"expired", expiredCert, expiredKey, "expired at"},
	}
	for _, b := range bad {
		if err := writeFile(srv.KeyFile, b.key, 0o600, true); err != nil {
			t.Fatal(err)
		}
		if err := writeFile(srv.CertFile, b.cert, 0o644, true); err != nil {
			t.Fatal(err)
		}
		// A poll may fall between the two writes and report that state
		// first; wait for the report of the final one.
		err := got.next(t)
		for err == nil || !strings.Contains(err.Error(), b.want) {
			err = got.next(t)
		}
		if !strings.Contains(err.Error(), "still serving the previous certificate") {
			t.Errorf("%s: reported %q, want %q and that the previous one is kept", b.name, err, b.want)
		}
		if err := r.Reload(); err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("%s: Reload() = %v, want the same error again", b.name, err)
		}
		if got := s.servedSerial(t, client); got != second {
			t.Errorf("%s: served %s after a bad replacement, want the previous %s", b.name, got, second)
		}
	}
	select {
	case err := <-got:
		t.Errorf("an unchanged bad file was reported again: %v", err)
	case <-time.After(50 * time.Millisecond):
	}

	// Fixing the files loads them.
	third := mustIssue(t, dir, Server, "localhost", WithOverwrite())
	got.loaded(t)
	thirdSerial := serialOf(t, third.CertFile)
	if got := s.servedSerial(t, client); got != thirdSerial {
		t.Errorf("after the fix served %s, want %s", got, thirdSerial)
	}
	if err := r.Reload(); err != nil {
		t.Errorf("Reload with good files: %v", err)
	}

	// After Close the files are no longer polled.
	r.Close()
	r.Close()
	mustIssue(t, dir, Server, "localhost", WithOverwrite())
	time.Sleep(50 * time.Millisecond)
	if got := s.servedSerial(t, client); got != thirdSerial {
		t.Errorf("served %s after Close, want %s: the files were still polled", got, thirdSerial)
	}
}

// TestReloadClientCA changes the server's client CA bundle while it runs:
// a client of a second CA is refused, admitted once its CA is added, and
// refused again once it is removed, with no restart and no resumption
// around the check.
func TestReloadClientCA(t *testing.T) {
	t.Parallel()
	dir1, dir2 := newCA(t, td), newCA(t, td)
	ca1, _ := os.ReadFile(filepath.Join(dir1, CACertFile))
	ca2, _ := os.ReadFile(filepath.Join(dir2, CACertFile))
	bundle := filepath.Join(t.TempDir(), "client-ca.pem")
	if err := os.WriteFile(bundle, ca1, 0o644); err != nil {
		t.Fatal(err)
	}
	srv := mustIssue(t, dir1, Server, "localhost")
	cfg, r, err := ServerTLSConfig(srv.CertFile, srv.KeyFile, bundle, true, 0) // reload by hand
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	s := startTLSServer(t, cfg)

	client := clientConfig(t, filepath.Join(dir1, CACertFile), mustIssue(t, dir2, Node, "node-b"))
	client.ClientSessionCache = tls.NewLRUClientSessionCache(8)
	if _, _, err := s.dial(t, client); err == nil {
		t.Fatal("client of CA 2 admitted before CA 2 was trusted")
	}

	if err := writeFile(bundle, append(append([]byte{}, ca1...), ca2...), 0o644, true); err != nil {
		t.Fatal(err)
	}
	if err := r.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, res, err := s.dial(t, client); err != nil {
		t.Fatalf("client of CA 2 refused after CA 2 was added: %v (server: %v)", err, res.err)
	}
	// The client now holds a session ticket, so the refusal below is of a
	// resumption attempt too.
	if st, res, err := s.dial(t, client); err != nil || !st.DidResume {
		t.Fatalf("second handshake: err %v (server: %v), resumed %v; want a resumed session", err, res.err, st != nil && st.DidResume)
	}

	if err := writeFile(bundle, ca1, 0o644, true); err != nil {
		t.Fatal(err)
	}
	if err := r.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.dial(t, client); err == nil {
		t.Fatal("client of CA 2 admitted after CA 2 was removed")
	}

	// A broken bundle keeps the pool.
	if err := writeFile(bundle, []byte("garbage"), 0o644, true); err != nil {
		t.Fatal(err)
	}
	if err := r.Reload(); err == nil || !strings.Contains(err.Error(), "still using the previous CA pool") {
		t.Fatalf("broken bundle: %v", err)
	}
	good := clientConfig(t, filepath.Join(dir1, CACertFile), mustIssue(t, dir1, Node, "node-a"))
	if _, res, err := s.dial(t, good); err != nil {
		t.Fatalf("client of CA 1 refused after a broken bundle: %v (server: %v)", err, res.err)
	}
}

// TestClientCredentials checks the reloading gRPC client credentials over
// real sockets: the client certificate and the root pool are both taken
// from the files at each handshake.
func TestClientCredentials(t *testing.T) {
	t.Parallel()
	dir1, dir2 := newCA(t, td), newCA(t, td)
	srv := mustIssue(t, dir1, Server, "localhost")
	cfg, r, err := ServerTLSConfig(srv.CertFile, srv.KeyFile, filepath.Join(dir1, CACertFile), true, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	cfg.NextProtos = []string{"h2"} // as gRPC's server credentials would; set after the call, still seen
	s := startTLSServer(t, cfg)

	// The client trusts CA 2 only, so far.
	roots := filepath.Join(t.TempDir(), "roots.pem")
	ca2, _ := os.ReadFile(filepath.Join(dir2, CACertFile))
	if err := os.WriteFile(roots, ca2, 0o644); err != nil {
		t.Fatal(err)
	}
	node := mustIssue(t, dir1, Node, "node-a")
	creds, cr, err := ClientCredentials(roots, node.CertFile, node.KeyFile, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cr.Close()
	if info := creds.Info(); info.SecurityProtocol != "tls" {
		t.Errorf("Info %+v", info)
	}
	if _, _, err := creds.ServerHandshake(nil); err == nil {
		t.Error("ServerHandshake of client credentials succeeded")
	}

	handshake := func(authority string) (credentials.TLSInfo, serverResult, error) {
		t.Helper()
		raw, err := net.Dial("tcp", s.ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn, auth, err := creds.Clone().ClientHandshake(ctx, authority, raw)
		if err == nil {
			_, err = io.ReadFull(conn, make([]byte, 1))
		}
		res := <-s.results
		if err != nil {
			return credentials.TLSInfo{}, res, err
		}
		return auth.(credentials.TLSInfo), res, nil
	}

	if _, _, err := handshake("127.0.0.1:1"); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Fatalf("with the wrong roots: %v", err)
	}
	if err := writeFile(roots, append(ca2, mustRead(t, filepath.Join(dir1, CACertFile))...), 0o644, true); err != nil {
		t.Fatal(err)
	}
	if err := cr.Reload(); err != nil {
		t.Fatal(err)
	}
	for _, authority := range []string{"127.0.0.1:9443", "localhost:9443", "[::1]:9443"} {
		info, res, err := handshake(authority)
		if err != nil {
			t.Fatalf("%s: %v (server: %v)", authority, err, res.err)
		}
		if info.State.NegotiatedProtocol != "h2" {
			t.Errorf("%s: ALPN %q", authority, info.State.NegotiatedProtocol)
		}
		if got := res.peer[0].SerialNumber.String(); got != serialOf(t, node.CertFile) {
			t.Errorf("%s: server saw client serial %s", authority, got)
		}
	}
	if _, _, err := handshake("reg.example.com:9443"); err == nil || !strings.Contains(err.Error(), "reg.example.com") {
		t.Errorf("a name the server certificate lacks: %v", err)
	}

	// A new client certificate is presented once reloaded.
	mustIssue(t, dir1, Node, "node-a", WithOverwrite())
	if err := cr.Reload(); err != nil {
		t.Fatal(err)
	}
	_, res, err := handshake("localhost:9443")
	if err != nil {
		t.Fatal(err)
	}
	if got := res.peer[0].SerialNumber.String(); got != serialOf(t, node.CertFile) {
		t.Errorf("server saw client serial %s after reload, want %s", got, serialOf(t, node.CertFile))
	}
}

func TestNewReloaderErrors(t *testing.T) {
	t.Parallel()
	if _, err := NewReloader("a.pem", "", "", 0); err == nil || !strings.Contains(err.Error(), "needs its key") {
		t.Errorf("cert without key: %v", err)
	}
	if _, err := NewReloader("", "", "", 0); err == nil || !strings.Contains(err.Error(), "nothing to load") {
		t.Errorf("nothing: %v", err)
	}
	if _, err := ClientTLSConfig("", "a.pem", ""); err == nil {
		t.Error("ClientTLSConfig with a certificate and no key succeeded")
	}
	if _, err := ClientTLSConfig(filepath.Join(t.TempDir(), "nope.pem"), "", ""); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing CA file: %v", err)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
