package server_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/regtest"
	"github.com/aethermesh/aether/internal/testutil/wait"
	"github.com/aethermesh/aether/pki"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/registry"
	"github.com/aethermesh/aether/server"
)

// The helpers of the process's tests: a registrar on real etcd, dialled
// over real sockets, and a development CA. Copies of the registrar
// package's own test helpers, which an external test package cannot share.

// waitFor waits for a condition; see package wait.
var waitFor = wait.For

var (
	quietLogger = regtest.QuietLogger
	dial        = regtest.Dial
)

func startRegistrar(t testing.TB, endpoints []string, mut ...func(*server.Config)) *server.Server {
	t.Helper()
	o := server.Config{EtcdEndpoints: endpoints, Options: registrar.Options{ClusterName: "c1", Region: "r1"}}
	for _, m := range mut {
		m(&o)
	}
	return regtest.Start(t, o)
}

func ep(svc, ip string, port uint32) *registryv1.ServiceEndpoint {
	return &registryv1.ServiceEndpoint{
		Service: svc, Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: ip,
		Ports: []*registryv1.Port{{Name: "http", Port: port}}, Node: "n1", Zone: "z1",
	}
}

func register(t testing.TB, c registrarv1.RegistrarClient, e *registryv1.ServiceEndpoint) *registrarv1.RegisterEndpointResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.RegisterEndpoint(ctx, &registrarv1.RegisterEndpointRequest{Endpoint: e})
	if err != nil {
		t.Fatalf("register %s %s: %v", e.Service, e.Ip, err)
	}
	return resp
}

func etcdKey(t testing.TB, cli *clientv3.Client, e *registryv1.ServiceEndpoint) (key string, value *registryv1.ServiceEndpoint) {
	t.Helper()
	id := registry.IDOf(e)
	if id.Region == "" {
		id.Region = "r1"
	}
	if id.Cluster == "" {
		id.Cluster = "c1"
	}
	k, err := id.Key()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, k)
	if err != nil || len(resp.Kvs) == 0 {
		return k, nil
	}
	v, err := registry.DecodeEndpoint(k, resp.Kvs[0].Value)
	if err != nil {
		t.Fatalf("value at %s: %v", k, err)
	}
	return k, v
}

// metricValue scrapes one unlabelled sample from the registrar's /metrics
// (0 if it is not there yet).
func metricValue(t testing.TB, httpAddr, name string) float64 {
	t.Helper()
	v, _ := scrapeMetric(t, "http://"+httpAddr+"/metrics", name)
	return v
}

// scrapeMetric reads one unlabelled sample from a Prometheus text page.
func scrapeMetric(t testing.TB, url, name string) (float64, bool) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err != nil {
				t.Fatalf("metric %s: %v", name, err)
			}
			return v, true
		}
	}
	return 0, false
}

// mesh is a development CA with the certificates the security tests use,
// issued with pki into a temporary directory.
type mesh struct {
	dir                string
	ca                 string // ca.pem
	serverCert, srvKey string
	certs              map[string][2]string // "node-a", "operator-alice", ... -> cert, key
}

func newMesh(t *testing.T, td string) *mesh {
	t.Helper()
	dir := t.TempDir()
	if err := pki.InitCA(dir, td); err != nil {
		t.Fatal(err)
	}
	m := &mesh{dir: dir, ca: filepath.Join(dir, pki.CACertFile), certs: map[string][2]string{}}
	srv, err := pki.Issue(dir, pki.Server, "localhost")
	if err != nil {
		t.Fatal(err)
	}
	m.serverCert, m.srvKey = srv.CertFile, srv.KeyFile
	for _, n := range []string{"node-a", "node-b"} {
		m.issue(t, pki.Node, n)
	}
	m.issue(t, pki.Operator, "alice")
	return m
}

func (m *mesh) issue(t *testing.T, kind pki.Kind, name string) {
	t.Helper()
	iss, err := pki.Issue(m.dir, kind, name)
	if err != nil {
		t.Fatal(err)
	}
	m.certs[kind.String()+"-"+name] = [2]string{iss.CertFile, iss.KeyFile}
}

func nodeEP(svc, ip, node string) *registryv1.ServiceEndpoint {
	e := ep(svc, ip, 8080)
	e.Node = node
	return e
}

// startTLSEtcd runs an embedded etcd whose client port serves TLS with a
// pki-issued server certificate and requires client certificates of m's CA.
func startTLSEtcd(t *testing.T, m *mesh) string {
	t.Helper()
	free := func() url.URL {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return url.URL{Scheme: "http", Host: ln.Addr().String()}
	}
	client, peer := free(), free()
	client.Scheme = "https"
	cfg := embed.NewConfig()
	cfg.Name = "tls-etcd"
	cfg.Dir = t.TempDir()
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.ClientTLSInfo = transport.TLSInfo{CertFile: m.serverCert, KeyFile: m.srvKey, TrustedCAFile: m.ca, ClientCertAuth: true}
	cfg.Logger, cfg.LogLevel = "zap", "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(20 * time.Second):
		t.Fatal("TLS etcd did not become ready")
	}
	return client.String()
}
