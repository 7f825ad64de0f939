package server_test

import (
	"context"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/aethermesh/aether/internal/testutil/meshtest"
	"github.com/aethermesh/aether/pki"
	"github.com/aethermesh/aether/server"
)

func TestSecurityOptionsValidate(t *testing.T) {
	t.Parallel()
	cases := []struct {
		o    server.Config
		want string
	}{
		{server.Config{TLSCertFile: "c"}, "--tls-cert needs --tls-key"},
		{server.Config{TLSKeyFile: "k"}, "--tls-key needs --tls-cert"},
		{server.Config{TLSClientCAFile: "ca"}, "--tls-client-ca needs --tls-cert and --tls-key"},
		{server.Config{TLSCertFile: "c", TLSKeyFile: "k", TLSClientCAFile: "ca"}, "--tls-client-ca needs --trust-domain"},
		{server.Config{TLSCertFile: "c", TLSKeyFile: "k", TrustDomain: "example.org"}, "--trust-domain is only used with --tls-client-ca"},
		{server.Config{TLSCertFile: "c", TLSKeyFile: "k", TLSClientCAFile: "ca", TrustDomain: "Example.org"}, "--trust-domain: trust domain \"Example.org\" must be lowercase"},
		{server.Config{TLSCertFile: "c", TLSKeyFile: "k", TLSClientCAFile: "ca", TrustDomain: "example.org", OperatorPrefix: "spiffe://example.org/node/"}, "--operator-prefix"},
		{server.Config{EtcdCert: "c"}, "--etcd-cert and --etcd-key go together"},
		{server.Config{EtcdCACert: "ca"}, "add --etcd-endpoints https://"},
		{server.Config{EtcdCACert: "ca", EtcdEndpoints: []string{"http://e:2379"}}, "use https://e:2379"},
	}
	for _, c := range cases {
		err := c.o.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want %q", c.o, err, c.want)
		}
	}
	ok := server.Config{TLSCertFile: "c", TLSKeyFile: "k", TLSClientCAFile: "ca", TrustDomain: "example.org", EtcdEndpoints: []string{"https://e:2379"}, EtcdCACert: "ca"}
	if err := ok.Validate(); err != nil {
		t.Errorf("valid options: %v", err)
	}
}

func TestRegistrarTalksTLSToEtcd(t *testing.T) {
	t.Parallel()
	m := meshtest.New(t, "example.org")
	m.Issue(t, pki.Server, "registrar-1")
	endpoint := meshtest.StartTLSEtcd(t, m)

	// etcd really requires a client certificate.
	noCert, _ := pki.ClientTLSConfig(m.CA, "", "")
	bare, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, TLS: noCert, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer bare.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	if _, err := bare.Get(ctx, "x"); err == nil {
		t.Fatal("etcd answered a client without a certificate")
	}
	cancel()

	pair := m.Certs["server-registrar-1"]
	srv := startRegistrar(t, []string{endpoint}, func(o *server.Config) {
		o.EtcdCACert, o.EtcdCert, o.EtcdKey = m.CA, pair[0], pair[1]
	})
	e := nodeEP("web", "10.0.0.1", "node-a")
	register(t, dial(t, srv.GRPCAddr()), e)
	waitFor(t, "write persisted", 5*time.Second, func() bool { return srv.Registrar().PendingWrites() == 0 })

	good, _ := pki.ClientTLSConfig(m.CA, pair[0], pair[1])
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, TLS: good, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, v := etcdKey(t, cli, e); v == nil || v.Node != "node-a" {
		t.Fatalf("etcd over TLS: endpoint is %v", v)
	}
}
