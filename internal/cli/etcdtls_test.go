package cli

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend/etcd/embedetcd"
	"github.com/aethermesh/aether/pki"
)

// tlsEtcd is an embedded etcd serving TLS that requires client
// certificates of a fresh development CA, with an operator certificate
// to reach it.
type tlsEtcd struct {
	endpoint      string
	ca, cert, key string
	admin         *clientv3.Client
}

func startTLSEtcd(t *testing.T) *tlsEtcd {
	t.Helper()
	dir := t.TempDir()
	if err := pki.InitCA(dir, "example.org"); err != nil {
		t.Fatal(err)
	}
	srv, err := pki.Issue(dir, pki.Server, "localhost")
	if err != nil {
		t.Fatal(err)
	}
	op, err := pki.Issue(dir, pki.Operator, "alice")
	if err != nil {
		t.Fatal(err)
	}
	ca := filepath.Join(dir, pki.CACertFile)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := embedetcd.Start(ctx, embedetcd.Config{
		Dir: t.TempDir(), ClientAddr: "127.0.0.1:0", PeerAddr: "127.0.0.1:0",
		ClientTLS: embedetcd.TLS{CertFile: srv.CertFile, KeyFile: srv.KeyFile, CAFile: ca},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	e := &tlsEtcd{endpoint: s.Endpoints()[0], ca: ca, cert: op.CertFile, key: op.KeyFile}
	tlsCfg, err := pki.ClientTLSConfig(ca, op.CertFile, op.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	e.admin, err = clientv3.New(clientv3.Config{Endpoints: []string{e.endpoint}, TLS: tlsCfg, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.admin.Close() })
	return e
}

func TestMigrateOverTLS(t *testing.T) {
	t.Parallel()
	e := startTLSEtcd(t)
	if !strings.HasPrefix(e.endpoint, "https://") {
		t.Fatalf("endpoint %s is not https", e.endpoint)
	}
	ep := &registryv1.ServiceEndpoint{Service: "pay", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: "10.0.0.1", Region: "eu", Cluster: "c1",
		Ports: []*registryv1.Port{{Name: "http", Port: 80}}}
	b, _ := proto.Marshal(ep)
	if _, err := e.admin.Put(context.Background(), "/aether/services/pay/protocols/http1/endpoints/10.0.0.1", string(b)); err != nil {
		t.Fatal(err)
	}
	base := []string{"migrate", "--from-legacy", "--etcd-endpoints", e.endpoint, "--timeout", "3s"}

	// Without a client certificate etcd refuses the migration.
	if res := runCLI(t, nil, nil, append(base, "--etcd-cacert", e.ca)...); res.err == nil {
		t.Fatalf("migrate without a client certificate succeeded:\n%s", res.stdout)
	}
	// The client-command variables AETHER_CACERT/CERT/KEY are not etcd's:
	// they do not reach etcd (the environment of "aether list" is not
	// mistaken for etcd credentials).
	env := map[string]string{"AETHER_CACERT": e.ca, "AETHER_CERT": e.cert, "AETHER_KEY": e.key}
	if res := runCLI(t, nil, env, base...); res.err == nil {
		t.Fatal("migrate used AETHER_CACERT/AETHER_CERT/AETHER_KEY for etcd")
	}

	env = map[string]string{"AETHER_ETCD_CACERT": e.ca, "AETHER_ETCD_CERT": e.cert, "AETHER_ETCD_KEY": e.key}
	res := runCLI(t, nil, env, base...)
	if res.err != nil || !strings.Contains(res.stdout, "migrated 1 of 1 legacy endpoints") {
		t.Fatalf("migrate over TLS: %v\n%s", res.err, res.stdout)
	}
	if r, _ := e.admin.Get(context.Background(), "/aether/v1/regions/eu/clusters/c1/services/pay/protocols/http1/endpoints/10.0.0.1"); len(r.Kvs) != 1 {
		t.Fatal("v1 key missing after migration over TLS")
	}
}

func TestClusterCheckOverTLS(t *testing.T) {
	t.Parallel()
	e := startTLSEtcd(t)
	res := runCLI(t, nil, nil, "cluster", "check", "--etcd-endpoints", e.endpoint,
		"--etcd-cacert", e.ca, "--etcd-cert", e.cert, "--etcd-key", e.key)
	// One member fails the failover rule, but the member list was read.
	if !strings.Contains(res.stdout, "1 member") {
		t.Fatalf("cluster check over TLS: %v\n%s", res.err, res.stdout)
	}
	res = runCLI(t, nil, nil, "cluster", "check", "--etcd-endpoints", e.endpoint, "--etcd-cacert", e.ca, "--timeout", "2s")
	if res.err == nil || strings.Contains(res.stdout, "1 member") {
		t.Fatalf("cluster check without a client certificate: %v\n%s", res.err, res.stdout)
	}
}

func TestEtcdTLSFlagErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"migrate", "--from-legacy", "--etcd-endpoints", "https://127.0.0.1:1", "--etcd-cert", "c"}, "--etcd-cert and --etcd-key go together"},
		{[]string{"migrate", "--from-legacy", "--etcd-endpoints", "http://127.0.0.1:1", "--etcd-cacert", "ca"}, "use https://127.0.0.1:1"},
		{[]string{"cluster", "check", "--etcd-endpoints", "http://127.0.0.1:1", "--etcd-cacert", "ca"}, "use https://127.0.0.1:1"},
		{[]string{"cluster", "check", "--etcd-endpoints", "https://127.0.0.1:1", "--etcd-key", "k"}, "--etcd-cert and --etcd-key go together"},
		{[]string{"registrar", "--embedded-etcd-client-ca", "ca"}, "--embedded-etcd-client-ca needs --embedded-etcd-cert and --embedded-etcd-key"},
		{[]string{"registrar", "--peer-etcd-cert", "c", "--peer-etcd-key", "k"}, "add --peer-etcd region=https://"},
	} {
		if res := runCLI(t, nil, nil, tc.args...); res.err == nil || !strings.Contains(res.err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, res.err, tc.want)
		}
	}
}
