package agent_test

import (
	"bytes"
	"context"
	"encoding/pem"
	"github.com/aethermesh/aether/internal/testutil/logbuf"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/aethermesh/aether/agent"
	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/internal/testutil/regtest"
	"github.com/aethermesh/aether/internal/testutil/wait"
	"github.com/aethermesh/aether/pki"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/server"
)

// countingProxy forwards TCP connections to a registrar and counts them,
// so a test sees how many connections an agent holds; cut closes the ones
// open, as a network failure would.
type countingProxy struct {
	lis    net.Listener
	target string

	mu       sync.Mutex
	accepted int
	open     []net.Conn
}

func startProxy(t *testing.T, target string) *countingProxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &countingProxy{lis: lis, target: target}
	var wg sync.WaitGroup
	t.Cleanup(func() { lis.Close(); p.cut(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			in, err := lis.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			p.mu.Lock()
			p.accepted++
			p.open = append(p.open, in, out)
			p.mu.Unlock()
			wg.Add(2)
			go func() { defer wg.Done(); _, _ = io.Copy(out, in); out.Close() }()
			go func() { defer wg.Done(); _, _ = io.Copy(in, out); in.Close() }()
		}
	}()
	return p
}

func (p *countingProxy) addr() string { return p.lis.Addr().String() }

func (p *countingProxy) connections() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

func (p *countingProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.open {
		c.Close()
	}
	p.open = nil
}

// runAgent runs a until the returned stop is called; stop returns Run's
// result. done is closed when Run returns.
func runAgent(t *testing.T, a *agent.Agent) (stop func() error, done <-chan struct{}) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan struct{})
	var err error
	go func() { defer close(ch); err = a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-ch })
	return func() error { cancel(); <-ch; return err }, ch
}

func callCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func nodeStatus(t *testing.T, c registrarv1.RegistrarClient, name string) *registrarv1.NodeStatus {
	t.Helper()
	resp, err := c.ListNodes(callCtx(t), &registrarv1.ListNodesRequest{})
	if err != nil {
		return nil
	}
	for _, n := range resp.GetNodes() {
		if n.GetNode().GetName() == name {
			return n
		}
	}
	return nil
}

func endpointIPs(t *testing.T, c registrarv1.RegistrarClient) []string {
	t.Helper()
	resp, err := c.ListAllEndpoints(callCtx(t), &registrarv1.ListAllEndpointsRequest{})
	if err != nil {
		return nil
	}
	var out []string
	for _, ep := range resp.GetEndpoints() {
		out = append(out, ep.GetService()+" "+ep.GetIp()+" "+ep.GetState().String())
	}
	return out
}

func webEndpoint() *registryv1.ServiceEndpoint {
	return &registryv1.ServiceEndpoint{
		Service: "web", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: "10.0.0.1",
		Ports: []*registryv1.Port{{Name: "http", Port: 8080}},
	}
}

// The agent's node calls (announce, heartbeats, leave) and its endpoint
// writes and watch share one connection per registrar: with one registrar,
// one TCP connection carries the agent's whole life, from the announce
// through heartbeats to the drain, deregistration and leave at shutdown.
func TestAgentHoldsOneConnectionPerRegistrar(t *testing.T) {
	etcd := etcdtest.Start(t)
	srv := regtest.Start(t, server.Config{EtcdEndpoints: etcd.Endpoints(), Options: registrar.Options{NodeTTL: 3 * time.Second}})
	proxy := startProxy(t, srv.GRPCAddr())
	direct := regtest.Dial(t, srv.GRPCAddr())

	a, err := agent.New(agent.Config{
		Node: "node-a", Zone: "z1", Registrars: []string{proxy.addr()},
		Endpoints:   []*registryv1.ServiceEndpoint{webEndpoint()},
		DrainPeriod: 100 * time.Millisecond,
		Logger:      regtest.QuietLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	stop, _ := runAgent(t, a)

	wait.For(t, "node announced and endpoint registered", 10*time.Second, func() bool {
		return nodeStatus(t, direct, "node-a") != nil && strings.Join(endpointIPs(t, direct), ",") == "web 10.0.0.1 STATE_SERVING"
	})
	// A heartbeat renews the record: its age falls back after growing.
	var oldest float64
	wait.For(t, "a heartbeat after the announce", 10*time.Second, func() bool {
		n := nodeStatus(t, direct, "node-a")
		if n == nil {
			return false
		}
		age := n.GetLastHeartbeatAgeSeconds()
		oldest = max(oldest, age)
		return oldest > 0.5 && age < oldest-0.3
	})
	if n := proxy.connections(); n != 1 {
		t.Fatalf("the agent opened %d connections to its one registrar, want 1", n)
	}

	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := nodeStatus(t, direct, "node-a"); n != nil {
		t.Errorf("node record still there after the agent left: %v", n)
	}
	if eps := endpointIPs(t, direct); len(eps) != 0 {
		t.Errorf("endpoints after shutdown: %v", eps)
	}
	if n := proxy.connections(); n != 1 {
		t.Errorf("the agent opened %d connections by the end of its shutdown, want 1", n)
	}
}

// A registrar's UNAUTHENTICATED is retried by the agent's node calls as
// by its client's endpoint writes (client.Permanent decides for both):
// certificates are re-read from their files, so an identity refused now
// (here a certificate of a trust domain the registrar does not accept) is
// replaced by the renewed one on the next connection. The agent keeps
// running through the refusals and comes up once its certificate is
// renewed, instead of exiting on the first one.
func TestAgentRetriesUnauthenticatedLikeItsWrites(t *testing.T) {
	etcd := etcdtest.Start(t)
	dir := t.TempDir()
	ours, foreign := filepath.Join(dir, "example.org"), filepath.Join(dir, "other.org")
	for d, td := range map[string]string{ours: "example.org", foreign: "other.org"} {
		if err := pki.InitCA(d, td); err != nil {
			t.Fatal(err)
		}
	}
	srvCert, err := pki.Issue(ours, pki.Server, "localhost")
	if err != nil {
		t.Fatal(err)
	}
	good, err := pki.Issue(ours, pki.Node, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	bad, err := pki.Issue(foreign, pki.Node, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	operator, err := pki.Issue(ours, pki.Operator, "alice")
	if err != nil {
		t.Fatal(err)
	}
	ca := filepath.Join(ours, pki.CACertFile)
	// The registrar trusts both CAs, so the foreign certificate passes the
	// handshake and its trust domain is refused: UNAUTHENTICATED.
	bundle := filepath.Join(dir, "bundle.pem")
	copyFiles(t, bundle, ca, filepath.Join(foreign, pki.CACertFile))
	srv := regtest.Start(t, server.Config{
		EtcdEndpoints:   etcd.Endpoints(),
		TLSCertFile:     srvCert.CertFile,
		TLSKeyFile:      srvCert.KeyFile,
		TLSClientCAFile: bundle,
		TrustDomain:     "example.org",
		Options: registrar.Options{
			NodeTTL: 3 * time.Second,
		},
	})
	proxy := startProxy(t, srv.GRPCAddr())
	opCfg, err := pki.ClientTLSConfig(ca, operator.CertFile, operator.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	direct := regtest.Dial(t, srv.GRPCAddr(), grpc.WithTransportCredentials(credentials.NewTLS(opCfg)))

	certFile, keyFile := filepath.Join(dir, "agent.pem"), filepath.Join(dir, "agent-key.pem")
	copyFiles(t, certFile, bad.CertFile)
	copyFiles(t, keyFile, bad.KeyFile)
	creds, rl, err := pki.ClientCredentials(ca, certFile, keyFile, 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rl.Close() })
	logs := &logbuf.Buffer{}
	a, err := agent.New(agent.Config{
		Node: "node-a", Zone: "z1", Registrars: []string{proxy.addr()},
		Endpoints:   []*registryv1.ServiceEndpoint{webEndpoint()},
		DrainPeriod: 100 * time.Millisecond,
		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(creds)},
		Logger:      slog.New(slog.NewTextHandler(logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	stop, done := runAgent(t, a)

	refusals := func(msg string) int {
		n := 0
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, msg) && strings.Contains(line, "Unauthenticated") {
				n++
			}
		}
		return n
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent logs:\n%s", logs)
		}
	})
	// Its endpoints wait for the announce (the node is announced first),
	// so the announce is what is refused, again and again.
	wait.For(t, "announces refused as UNAUTHENTICATED, and retried", 20*time.Second, func() bool {
		select {
		case <-done:
			t.Fatalf("the agent stopped on a refused identity:\n%s", logs)
		default:
		}
		return refusals("announce failed; retrying") >= 3
	})
	if n := nodeStatus(t, direct, "node-a"); n != nil {
		t.Fatalf("node announced with a refused identity: %v", n)
	}

	// Renew the certificate in place; once the reloader has read it, the
	// next connection presents it.
	copyFiles(t, keyFile, good.KeyFile)
	copyFiles(t, certFile, good.CertFile)
	goodDER := firstDER(t, good.CertFile)
	wait.For(t, "the renewed certificate loaded", 10*time.Second, func() bool {
		c := rl.Certificate()
		return c != nil && len(c.Certificate) > 0 && bytes.Equal(c.Certificate[0], goodDER)
	})
	proxy.cut()
	wait.For(t, "node announced and endpoint registered with the renewed certificate", 20*time.Second, func() bool {
		return nodeStatus(t, direct, "node-a") != nil && strings.Join(endpointIPs(t, direct), ",") == "web 10.0.0.1 STATE_SERVING"
	})
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := nodeStatus(t, direct, "node-a"); n != nil {
		t.Errorf("node record still there after the agent left: %v", n)
	}
}

// firstDER is the first certificate of a PEM file.
func firstDER(t *testing.T, file string) []byte {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(data)
	if b == nil {
		t.Fatalf("%s: no PEM block", file)
	}
	return b.Bytes
}

// copyFiles writes to dst the concatenation of srcs.
func copyFiles(t *testing.T, dst string, srcs ...string) {
	t.Helper()
	var b []byte
	for _, s := range srcs {
		data, err := os.ReadFile(s)
		if err != nil {
			t.Fatal(err)
		}
		b = append(b, data...)
	}
	if err := os.WriteFile(dst, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
