package agent_test

// The agent's xDS: what it watches when it has no endpoints of its own
// (only what its proxies ask for), and its xDS port over mutual TLS to a
// real grpc-go xDS client.

import (
	"bytes"
	"context"
	"crypto/tls"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/aethermesh/aether/agent"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/internal/testutil/meshtest"
	"github.com/aethermesh/aether/internal/testutil/regtest"
	"github.com/aethermesh/aether/internal/testutil/wait"
	"github.com/aethermesh/aether/internal/testutil/xdstest"
	"github.com/aethermesh/aether/pki"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/server"
	"github.com/aethermesh/aether/xds/bootstrap"
)

// watchStreams is the registrar's registrar_connected_agents: its open
// watch streams (Subscribe and WatchEndpoints), whoever holds them.
func watchStreams(t *testing.T, s *server.Server) float64 {
	t.Helper()
	mfs, err := s.Registrar().MetricsRegistry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "registrar_connected_agents" {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatal("the registrar exports no registrar_connected_agents")
	return 0
}

// An agent with no endpoints of its own watches nothing, and holds no
// registrar stream (an empty filter would mean every service); a proxy
// asking for xds:///web brings web, and only web, into its cache; when
// the proxy goes, web leaves after the linger and the stream closes.
func TestAgentWithoutEndpointsWatchesOnlyWhatProxiesAsk(t *testing.T) {
	etcd := etcdtest.Start(t)
	s := regtest.Start(t, server.Config{EtcdEndpoints: etcd.Endpoints(),
		Options: registrar.Options{NodeTTL: 5 * time.Second, Logger: regtest.QuietLogger()}})
	reg := regtest.Dial(t, s.GRPCAddr())
	web, api := startIPBackend(t, "127.0.0.41"), startIPBackend(t, "127.0.0.42")
	regtest.Register(t, reg, web.endpoint("web"))
	regtest.Register(t, reg, api.endpoint("api"))

	a, err := agent.New(agent.Config{
		Node: "node-idle", Zone: "z1", Registrars: []string{s.GRPCAddr()},
		DrainPeriod: 100 * time.Millisecond, XDSAddr: "127.0.0.1:0", XDSLinger: xdsLinger,
		Logger: regtest.QuietLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	runAgent(t, a)
	// The agent's client is made (and, were it to watch, opens its stream)
	// before Run announces the node: once the node is listed, a stream
	// the agent holds would be open.
	wait.For(t, "the agent's node record", firstBound, func() bool { return nodeStatus(t, reg, "node-idle") != nil })
	if got := a.Watched(); got == nil || len(got) != 0 {
		t.Fatalf("an agent with no endpoints and no proxy watches %#v, want nothing ([]string{})", got)
	}
	if n := watchStreams(t, s); n != 0 {
		t.Fatalf("the registrar has %v watch streams open with only an idle agent, want 0", n)
	}

	// A wildcard CDS watch on the agent is answered with what its cache
	// holds and names no service: it brings nothing in.
	probe := xdstest.DeltaProbe(t, a.XDSAddr(), xdstest.Node("probe", xdstest.Locality{Region: "default", Zone: "z1"}))
	probe.Subscribe(resourcev3.ClusterType)

	cc := xdstest.Client(t, "web", xdstest.Bootstrap(a.XDSAddr(), "proxy-1", xdstest.Locality{Region: "default", Zone: "z1"}))
	start := time.Now()
	xdstest.WaitSpread(t, cc, only(web), firstBound)
	t.Logf("first RPCs to web through an agent that watched nothing after %v", time.Since(start).Round(time.Millisecond))
	if got := a.Watched(); !slices.Equal(got, []string{"web"}) {
		t.Fatalf("watched while a proxy asks for web: %v, want [web]", got)
	}
	if n := watchStreams(t, s); n != 1 {
		t.Fatalf("the registrar has %v watch streams open, want the agent's one", n)
	}
	for _, ok := probe.Held(resourcev3.ClusterType)["web"]; !ok; _, ok = probe.Held(resourcev3.ClusterType)["web"] {
		probe.NextOf(resourcev3.ClusterType, changeBound)
	}
	// api is registered on the same registrar: in the cache it would be
	// in the wildcard's answer, with web (one snapshot brings both).
	if held := probe.Held(resourcev3.ClusterType); len(held) != 1 {
		t.Fatalf("the agent's cache holds clusters %v, want web only", slices.Sorted(maps.Keys(held)))
	}

	cc.Close()
	wait.For(t, "web leaving the subscription once no proxy asks", xdsLinger+changeBound, func() bool { return len(a.Watched()) == 0 })
	wait.For(t, "the agent's registrar stream closing with nothing to watch", changeBound, func() bool { return watchStreams(t, s) == 0 })

	// And back: a proxy asking again opens a fresh stream for web.
	again := xdstest.Client(t, "web", xdstest.Bootstrap(a.XDSAddr(), "proxy-2", xdstest.Locality{Region: "default", Zone: "z1"}))
	xdstest.WaitSpread(t, again, only(web), firstBound)
	if got := a.Watched(); !slices.Equal(got, []string{"web"}) {
		t.Fatalf("watched after a proxy asked again: %v, want [web]", got)
	}
}

// adsClusters opens an ADS stream to addr with creds and asks for the
// cluster name; it returns the names of the clusters answered, or the
// error.
func adsClusters(addr string, creds credentials.TransportCredentials, name string) ([]string, error) {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stream, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
	if err != nil {
		return nil, err
	}
	if err := stream.Send(&discoverygrpc.DiscoveryRequest{Node: &corev3.Node{Id: "t"}, TypeUrl: resourcev3.ClusterType, ResourceNames: []string{name}}); err != nil {
		return nil, err
	}
	r, err := stream.Recv()
	if err != nil {
		return nil, err
	}
	var names []string
	for range r.GetResources() {
		names = append(names, name)
	}
	return names, nil
}

// The agent's xDS port over mutual TLS: grpc-go's xDS client, with a
// bootstrap from `aether xds bootstrap` naming the CA and a node
// certificate, gets its config over TLS and reaches the backend; clients
// without a certificate, or in plaintext, are refused at the handshake.
func TestAgentXDSServesMutualTLS(t *testing.T) {
	m := meshtest.New(t, "example.org")
	etcd := etcdtest.Start(t)
	addr := regtest.FreeAddr(t)
	startRegistrar(t, etcd, addr)
	reg := regtest.Dial(t, addr)
	web := startIPBackend(t, "127.0.0.51")
	regtest.Register(t, reg, web.endpoint("web"))

	tlsCfg, rl, err := pki.ServerTLSConfig(m.ServerCert, m.ServerKey, m.CA, true, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rl.Close() })
	a, err := agent.New(agent.Config{
		Node: "node-tls", Zone: "z1", Registrars: []string{addr},
		DrainPeriod: 100 * time.Millisecond, XDSAddr: "127.0.0.1:0", XDSLinger: xdsLinger, XDSTLS: tlsCfg,
		Logger: regtest.QuietLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	runAgent(t, a)
	// The server certificate is for "localhost": the name the client
	// dials is the one it verifies.
	_, port, _ := net.SplitHostPort(a.XDSAddr())
	xdsAddr := net.JoinHostPort("localhost", port)

	node := m.Certs["node-node-a"]
	b, err := bootstrap.JSON(bootstrap.Config{Server: xdsAddr, Node: "proxy-tls", Zone: "z1", Region: "default",
		CAFile: m.CA, CertFile: node[0], KeyFile: node[1]})
	if err != nil {
		t.Fatal(err)
	}
	cc := xdstest.Client(t, "web", b)
	start := time.Now()
	xdstest.WaitSpread(t, cc, only(web), firstBound)
	t.Logf("first RPCs through the agent's xDS over mutual TLS after %v", time.Since(start).Round(time.Millisecond))

	noCert, err := pki.ClientTLSConfig(m.CA, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := adsClusters(xdsAddr, credentials.NewTLS(noCert), "web"); err == nil {
		t.Errorf("a TLS client without a certificate was served %v", got)
	}
	if got, err := adsClusters(xdsAddr, insecure.NewCredentials(), "web"); err == nil {
		t.Errorf("a plaintext client was served %v", got)
	}
	withCert, err := pki.ClientTLSConfig(m.CA, node[0], node[1])
	if err != nil {
		t.Fatal(err)
	}
	if got, err := adsClusters(xdsAddr, credentials.NewTLS(withCert), "web"); err != nil || !slices.Equal(got, []string{"web"}) {
		t.Fatalf("a client with a node certificate: %v, %v; want cluster web", got, err)
	}
}

// syncBuffer is a log sink the agent's goroutines may write while the
// test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A plaintext xDS port off loopback is served with a warning, as the
// registrar warns of its plaintext ports; on loopback, or with TLS, it is
// not.
func TestAgentWarnsOfPlaintextXDSOffLoopback(t *testing.T) {
	m := meshtest.New(t, "example.org")
	tlsCfg, rl, err := pki.ServerTLSConfig(m.ServerCert, m.ServerKey, "", false, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rl.Close() })
	for _, tc := range []struct {
		name, addr string
		tls        *tls.Config
		warn       bool
	}{
		{"loopback plaintext", "127.0.0.1:0", nil, false},
		{"every interface plaintext", "0.0.0.0:0", nil, true},
		{"every interface TLS", "0.0.0.0:0", tlsCfg, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs syncBuffer
			a, err := agent.New(agent.Config{
				Node: "n1", Registrars: []string{regtest.FreeAddr(t)}, XDSAddr: tc.addr, XDSTLS: tc.tls,
				Logger: slog.New(slog.NewTextHandler(&logs, nil)),
			})
			if err != nil {
				t.Fatal(err)
			}
			// The warning is New's (where the port is bound); a Run that
			// is over at once releases the port and the client.
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			_ = a.Run(ctx)
			if got := strings.Contains(logs.String(), "PLAINTEXT xDS on a non-loopback address"); got != tc.warn {
				t.Fatalf("warned %v, want %v; logs:\n%s", got, tc.warn, logs.String())
			}
		})
	}
}
