package server_test

import (
	"context"
	"crypto/tls"
	"github.com/aethermesh/aether/internal/testutil/meshtest"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/pki"
	"github.com/aethermesh/aether/server"
)

// etcdRefuses reports whether an etcd client with tlsCfg (nil: plaintext)
// fails to read from endpoint.
func etcdRefuses(t *testing.T, endpoint string, tlsCfg *tls.Config) bool {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, TLS: tlsCfg, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return true
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err = cli.Get(ctx, "x")
	return err != nil
}

// The embedded etcd serves TLS on its client and peer links and requires
// client certificates; the registrar reaches it with its own certificate,
// and clients without TLS or without a certificate are refused.
func TestEmbeddedEtcdTLS(t *testing.T) {
	t.Parallel()
	m := meshtest.New(t, "example.org")
	srv := startRegistrar(t, nil, func(o *server.Config) {
		o.DataDir = t.TempDir()
		o.EmbeddedEtcdAddr, o.EmbeddedEtcdPeerAddr = "127.0.0.1:0", "127.0.0.1:0"
		o.EmbeddedEtcdCert, o.EmbeddedEtcdKey, o.EmbeddedEtcdClientCA = m.ServerCert, m.ServerKey, m.CA
		o.EmbeddedEtcdPeerCert, o.EmbeddedEtcdPeerKey, o.EmbeddedEtcdPeerCA = m.ServerCert, m.ServerKey, m.CA
	})
	eps := srv.EtcdEndpoints()
	if len(eps) != 1 || !strings.HasPrefix(eps[0], "https://") {
		t.Fatalf("embedded etcd endpoints %v, want one https:// URL", eps)
	}
	endpoint := eps[0]

	e := nodeEP("web", "10.0.0.1", "node-a")
	register(t, dial(t, srv.GRPCAddr()), e)
	waitFor(t, "write persisted", 5*time.Second, func() bool { return srv.Registrar().PendingWrites() == 0 })

	op := m.Certs["operator-alice"]
	good, err := pki.ClientTLSConfig(m.CA, op[0], op[1])
	if err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, TLS: good, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, v := etcdKey(t, cli, e); v == nil || v.Node != "node-a" {
		t.Fatalf("embedded etcd over TLS: endpoint is %v", v)
	}

	noCert, _ := pki.ClientTLSConfig(m.CA, "", "")
	other := meshtest.New(t, "example.org")
	foreign, _ := pki.ClientTLSConfig(m.CA, other.ServerCert, other.ServerKey)
	// A refusal takes etcdRefuses its whole timeout (the client retries
	// the failing handshake until then), so the three are tried at once.
	var wg sync.WaitGroup
	for _, c := range []struct {
		endpoint string
		tls      *tls.Config
		what     string
	}{
		{"http://" + strings.TrimPrefix(endpoint, "https://"), nil, "a plaintext client"},
		{endpoint, noCert, "a TLS client without a certificate"},
		{endpoint, foreign, "a client certificate of another CA"},
	} {
		wg.Go(func() {
			if !etcdRefuses(t, c.endpoint, c.tls) {
				t.Errorf("embedded etcd answered %s", c.what)
			}
		})
	}
	wg.Wait()
}

// Without a client CA the embedded etcd serves TLS to anyone, and the
// registrar trusts the certificate it serves without a CA flag.
func TestEmbeddedEtcdTLSWithoutClientCA(t *testing.T) {
	t.Parallel()
	m := meshtest.New(t, "example.org")
	srv := startRegistrar(t, nil, func(o *server.Config) {
		o.DataDir = t.TempDir()
		o.EmbeddedEtcdAddr, o.EmbeddedEtcdPeerAddr = "127.0.0.1:0", "127.0.0.1:0"
		o.EmbeddedEtcdCert, o.EmbeddedEtcdKey = m.ServerCert, m.ServerKey
	})
	register(t, dial(t, srv.GRPCAddr()), nodeEP("web", "10.0.0.1", "node-a"))
	waitFor(t, "write persisted", 5*time.Second, func() bool { return srv.Registrar().PendingWrites() == 0 })
	endpoint := srv.EtcdEndpoints()[0]
	noCert, _ := pki.ClientTLSConfig(m.CA, "", "")
	if etcdRefuses(t, endpoint, noCert) {
		t.Error("embedded etcd without a client CA refused a TLS client without a certificate")
	}
	if !etcdRefuses(t, "http://"+strings.TrimPrefix(endpoint, "https://"), nil) {
		t.Error("embedded etcd answered a plaintext client")
	}
}

// Region A's replicator mirrors into region B's etcd, which serves TLS and
// requires client certificates, with --peer-etcd-cacert/-cert/-key.
func TestReplicationToTLSPeerEtcd(t *testing.T) {
	t.Parallel()
	m := meshtest.New(t, "example.org")
	m.Issue(t, pki.Server, "registrar-a")
	peerEndpoint := meshtest.StartTLSEtcd(t, m)
	pair := m.Certs["server-registrar-a"]
	for _, spec := range []string{peerEndpoint, strings.TrimPrefix(peerEndpoint, "https://")} {
		t.Run(spec, func(t *testing.T) {
			t.Parallel()
			a := startRegistrar(t, etcdtest.Start(t).Endpoints(), func(o *server.Config) {
				o.Region = "ra"
				o.PeerEtcd = []string{"rb=" + spec}
				o.ReplicationLeaseTTL = 3 * time.Second
				o.PeerEtcdCACert, o.PeerEtcdCert, o.PeerEtcdKey = m.CA, pair[0], pair[1]
			})
			e := nodeEP("web", "10.0.0.1", "node-a")
			e.Region = "ra"
			register(t, dial(t, a.GRPCAddr()), e)

			good, _ := pki.ClientTLSConfig(m.CA, pair[0], pair[1])
			cli, err := clientv3.New(clientv3.Config{Endpoints: []string{peerEndpoint}, TLS: good, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
			if err != nil {
				t.Fatal(err)
			}
			defer cli.Close()
			waitFor(t, "A's endpoint mirrored into B's TLS etcd", 15*time.Second, func() bool {
				_, v := etcdKey(t, cli, e)
				return v != nil && v.Node == "node-a"
			})
		})
	}
}

func TestEtcdTLSOptionsValidate(t *testing.T) {
	t.Parallel()
	cases := []struct {
		o    server.Config
		want string
	}{
		{server.Config{EmbeddedEtcdCert: "c"}, "--embedded-etcd-cert and --embedded-etcd-key go together"},
		{server.Config{EmbeddedEtcdKey: "k"}, "--embedded-etcd-cert and --embedded-etcd-key go together"},
		{server.Config{EmbeddedEtcdClientCA: "ca"}, "--embedded-etcd-client-ca needs --embedded-etcd-cert and --embedded-etcd-key"},
		{server.Config{EmbeddedEtcdPeerCert: "c"}, "--embedded-etcd-peer-cert and --embedded-etcd-peer-key go together"},
		{server.Config{EmbeddedEtcdPeerCA: "ca"}, "--embedded-etcd-peer-ca needs --embedded-etcd-peer-cert and --embedded-etcd-peer-key"},
		{server.Config{EmbeddedEtcdCert: "c", EmbeddedEtcdKey: "k", EtcdEndpoints: []string{"http://e:2379"}}, "does not run with --etcd-endpoints"},
		{server.Config{PeerEtcdCert: "c"}, "--peer-etcd-cert and --peer-etcd-key go together"},
		{server.Config{PeerEtcdCACert: "ca"}, "add --peer-etcd region=https://"},
		{server.Config{PeerEtcdCACert: "ca", PeerEtcd: []string{"rb=https://a:2379,http://b:2379"}}, "use https://b:2379"},
	}
	for _, c := range cases {
		err := c.o.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want %q", c.o, err, c.want)
		}
	}
	for _, ok := range []server.Config{
		{EmbeddedEtcdCert: "c", EmbeddedEtcdKey: "k", EmbeddedEtcdClientCA: "ca", EmbeddedEtcdPeerCert: "c", EmbeddedEtcdPeerKey: "k", EmbeddedEtcdPeerCA: "ca"},
		{PeerEtcd: []string{"rb=https://a:2379,b:2379"}, PeerEtcdCACert: "ca", PeerEtcdCert: "c", PeerEtcdKey: "k"},
	} {
		if err := ok.Validate(); err != nil {
			t.Errorf("valid options %+v: %v", ok, err)
		}
	}
}
