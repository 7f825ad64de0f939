package edge

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// selfSigned returns a server certificate for 127.0.0.1 and a pool that
// trusts it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "edge-test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pool
}

// Over TLS, gRPC and HTTP (both HTTP/1.1 and HTTP/2) share the port through
// one TLS server, as in etcd's secure path.
func TestTLSClientPort(t *testing.T) {
	cert, pool := selfSigned(t)
	s := startServer(t, "", func(c *Config) {
		c.ListenClientURLs = []url.URL{{Scheme: "https", Host: "127.0.0.1:0"}}
		c.ClientTLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	})
	c, err := clientv3.New(clientv3.Config{
		Endpoints: s.ClientURLs(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		TLS: &tls.Config{RootCAs: pool},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := testCtx(t)
	wch := c.Watch(ctx, "k")
	if _, err := c.Put(ctx, "k", "v"); err != nil {
		t.Fatalf("put over TLS: %v", err)
	}
	if wr := recvWatch(t, wch); len(wr.Events) != 1 {
		t.Fatalf("watch over TLS: %+v", wr)
	}
	for _, h2 := range []bool{false, true} {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: h2}
		if !h2 {
			tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
		}
		resp, err := (&http.Client{Transport: tr}).Get(s.ClientURLs()[0] + "/health")
		if err != nil {
			t.Fatalf("https /health (h2=%v): %v", h2, err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || (resp.ProtoMajor == 2) != h2 {
			t.Fatalf("https /health (h2=%v): %d over %s", h2, resp.StatusCode, resp.Proto)
		}
		tr.CloseIdleConnections()
	}
}

// A unix socket client URL, with a stale socket file from an earlier run.
func TestUnixSocketClientURL(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "edge.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	// Leave the file behind as a crashed process would.
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	s := startServer(t, "", func(c *Config) {
		c.ListenClientURLs = []url.URL{{Scheme: "unix", Host: sock}}
	})
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{"unix://" + sock}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Put(testCtx(t), "k", "v"); err != nil {
		t.Fatalf("put over a unix socket: %v", err)
	}
	_ = s
}
