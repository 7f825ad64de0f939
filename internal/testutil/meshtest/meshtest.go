// Package meshtest issues a development CA and certificates with package
// pki, and starts an etcd that serves TLS with them, for the tests of the
// registrar's security and of the process's etcd TLS.
package meshtest

import (
	"errors"
	"net"
	"net/url"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/aethermesh/aether/pki"
)

// Mesh is a development CA with the certificates the security tests use,
// issued with pki into a temporary directory.
type Mesh struct {
	Dir                   string
	CA                    string               // ca.pem
	ServerCert, ServerKey string               // for "localhost"
	Certs                 map[string][2]string // "node-a", "operator-alice", ... -> cert, key
}

// New makes a CA of trust domain td, a server certificate for localhost,
// node certificates node-a and node-b and operator alice.
func New(t testing.TB, td string) *Mesh {
	t.Helper()
	dir := t.TempDir()
	if err := pki.InitCA(dir, td); err != nil {
		t.Fatal(err)
	}
	m := &Mesh{Dir: dir, CA: filepath.Join(dir, pki.CACertFile), Certs: map[string][2]string{}}
	srv, err := pki.Issue(dir, pki.Server, "localhost")
	if err != nil {
		t.Fatal(err)
	}
	m.ServerCert, m.ServerKey = srv.CertFile, srv.KeyFile
	for _, n := range []string{"node-a", "node-b"} {
		m.Issue(t, pki.Node, n)
	}
	m.Issue(t, pki.Operator, "alice")
	return m
}

// Issue adds a certificate of kind for name, filed as "<kind>-<name>".
func (m *Mesh) Issue(t testing.TB, kind pki.Kind, name string) {
	t.Helper()
	iss, err := pki.Issue(m.Dir, kind, name)
	if err != nil {
		t.Fatal(err)
	}
	m.Certs[kind.String()+"-"+name] = [2]string{iss.CertFile, iss.KeyFile}
}

// StartTLSEtcd runs an embedded etcd whose client port serves TLS with m's
// localhost certificate and requires client certificates of m's CA; it
// returns the client URL and stops the etcd when t ends.
func StartTLSEtcd(t testing.TB, m *Mesh) string {
	t.Helper()
	free := func() url.URL {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return url.URL{Scheme: "http", Host: ln.Addr().String()}
	}
	var e *embed.Etcd
	var client url.URL
	// A port picked free can be taken before etcd binds it, by any socket
	// of a test running beside this one: a lost race picks again.
	for attempt := 1; ; attempt++ {
		var peer url.URL
		client, peer = free(), free()
		client.Scheme = "https"
		cfg := embed.NewConfig()
		cfg.Name = "tls-etcd"
		cfg.Dir = t.TempDir()
		cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
		cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
		cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
		cfg.ClientTLSInfo = transport.TLSInfo{CertFile: m.ServerCert, KeyFile: m.ServerKey, TrustedCAFile: m.CA, ClientCertAuth: true}
		cfg.Logger, cfg.LogLevel = "zap", "error"
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
		var err error
		if e, err = embed.StartEtcd(cfg); err == nil {
			break
		}
		if !errors.Is(err, syscall.EADDRINUSE) || attempt == 3 {
			t.Fatal(err)
		}
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(20 * time.Second):
		t.Fatal("TLS etcd did not become ready")
	}
	return client.String()
}
