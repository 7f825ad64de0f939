package server_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	dynamostore "github.com/aethermesh/aether/backend/dynamodb"
	"github.com/aethermesh/aether/internal/testutil/dynalite"
	"github.com/aethermesh/aether/internal/testutil/regtest"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/server"
)

// dynamoConfig is a registrar on the table at endpoint, syncing by the
// poll every 200 ms. The credentials come from the environment, as the
// SDK's chain reads them (dynalite wants requests signed, by anyone).
func dynamoConfig(t *testing.T, endpoint, table string) server.Config {
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	return server.Config{
		Backend: server.BackendDynamoDB, DynamoDBTable: table, DynamoDBRegion: "us-east-1", DynamoDBEndpoint: endpoint,
		Options: registrar.Options{ClusterName: "c1", Region: "r1", SyncInterval: 200 * time.Millisecond},
	}
}

func createTable(t *testing.T, endpoint, table string) {
	cli := ddb.New(ddb.Options{
		Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("test", "test", ""),
		BaseEndpoint: aws.String(endpoint), Retryer: dynamostore.NewRetryer(),
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := dynamostore.CreateTable(ctx, cli, table, 4); err != nil {
		t.Fatalf("create table: %v", err)
	}
}

// TestDynamoDBBackendTwoReplicas: two registrars on one DynamoDB table
// (dynalite) pick the poll, having no change feed; an endpoint and a node
// registered on one reach the other through the table, and a restarted
// replica loads them.
func TestDynamoDBBackendTwoReplicas(t *testing.T) {
	d := dynalite.Start(t)
	createTable(t, d.Endpoint, "aether")
	cfg := dynamoConfig(t, d.Endpoint, "aether")
	a, b := regtest.Start(t, cfg), regtest.Start(t, cfg)
	if mode := b.Registrar().Options().SyncMode; mode != registrar.SyncPoll {
		t.Fatalf("sync mode on DynamoDB = %q, want %q", mode, registrar.SyncPoll)
	}
	ca := dial(t, a.GRPCAddr())
	register(t, ca, ep("web", "10.0.0.1", 80))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := ca.AnnounceNode(ctx, &registrarv1.AnnounceNodeRequest{Node: &registryv1.Node{Name: "n1"}}); err != nil {
		t.Fatalf("AnnounceNode on DynamoDB: %v", err)
	}
	for name, s := range map[string]*server.Server{"b": b} {
		waitFor(t, "replica "+name+" to learn the endpoint by polling", 20*time.Second, func() bool {
			eps, _, err := s.Registrar().List([]string{"web"})
			return err == nil && len(eps) == 1 && eps[0].GetIp() == "10.0.0.1"
		})
		waitFor(t, "replica "+name+" to learn the node", 20*time.Second, func() bool {
			return len(s.Registrar().ListNodes(ctx)) == 1
		})
	}
	waitFor(t, "a's write to persist", 10*time.Second, func() bool { return a.Registrar().PendingWrites() == 0 })
	c := regtest.Start(t, cfg)
	if eps, _, err := c.Registrar().List([]string{"web"}); err != nil || len(eps) != 1 {
		t.Fatalf("a replica started later lists %v (%v), want the endpoint", eps, err)
	}
}

// TestDynamoDBMissingTableFailsStart: a registrar pointed at a table that
// does not exist fails its start, and says how to make it.
func TestDynamoDBMissingTableFailsStart(t *testing.T) {
	d := dynalite.Start(t)
	cfg := dynamoConfig(t, d.Endpoint, "nope")
	cfg.GRPCAddr, cfg.HTTPAddr, cfg.Logger = "127.0.0.1:0", "127.0.0.1:0", quietLogger()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := server.Serve(ctx, cfg)
	if err == nil || !strings.Contains(err.Error(), "aether dynamodb create-table --dynamodb-table nope") {
		t.Fatalf("Serve on a missing table: %v, want a start failure naming create-table", err)
	}
}

// TestDynamoDBFlagsChecked: the etcd-only options are refused with
// --backend dynamodb, and the DynamoDB ones without it.
func TestDynamoDBFlagsChecked(t *testing.T) {
	for _, tc := range []struct {
		cfg  server.Config
		want string
	}{
		{server.Config{Backend: server.BackendDynamoDB}, "needs --dynamodb-table"},
		{server.Config{Backend: server.BackendDynamoDB, DynamoDBTable: "t", EtcdEndpoints: []string{"http://x:2379"}}, "drop --etcd-endpoints"},
		{server.Config{Backend: server.BackendDynamoDB, DynamoDBTable: "t", PeerEtcd: []string{"r2=http://x:2379"}}, "--peer-etcd"},
		{server.Config{DynamoDBTable: "t"}, "need --backend dynamodb"},
		{server.Config{Backend: "consul"}, `--backend "consul"`},
	} {
		tc.cfg.Options = registrar.Options{ClusterName: "c1", Region: "r1"}
		if err := tc.cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want %q", tc.cfg, err, tc.want)
		}
	}
}

// outageProxy forwards to dynalite, or, while down, answers every request
// 503 as an unreachable DynamoDB endpoint's load balancer would.
type outageProxy struct {
	proxy *httputil.ReverseProxy
	down  atomic.Bool
	shed  atomic.Int64
}

func (p *outageProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if p.down.Load() {
		p.shed.Add(1)
		http.Error(w, "service unavailable (the test's outage)", http.StatusServiceUnavailable)
		return
	}
	p.proxy.ServeHTTP(w, r)
}

// TestDynamoDBOutageQueuesWrites: while the table is unreachable a
// registrar still acknowledges registrations and serves them from its
// snapshot, its write-behind holding them; once the table is back they
// land, nothing lost.
func TestDynamoDBOutageQueuesWrites(t *testing.T) {
	d := dynalite.Start(t)
	createTable(t, d.Endpoint, "aether")
	u, _ := url.Parse(d.Endpoint)
	px := &outageProxy{proxy: httputil.NewSingleHostReverseProxy(u)}
	front := httptest.NewServer(px)
	t.Cleanup(front.Close)
	a := regtest.Start(t, dynamoConfig(t, front.URL, "aether"))
	c := dial(t, a.GRPCAddr())
	register(t, c, ep("web", "10.0.0.1", 80))
	waitFor(t, "the first write to persist", 10*time.Second, func() bool { return a.Registrar().PendingWrites() == 0 })

	px.down.Store(true)
	for i := 2; i <= 4; i++ {
		register(t, c, ep("web", fmt.Sprintf("10.0.0.%d", i), 80))
	}
	if eps, _, err := a.Registrar().List([]string{"web"}); err != nil || len(eps) != 4 {
		t.Fatalf("during the outage the registrar lists %d endpoints (%v), want all 4 from its snapshot", len(eps), err)
	}
	waitFor(t, "the write-behind to try the table", 10*time.Second, func() bool { return px.shed.Load() > 0 })
	if a.Registrar().PendingWrites() == 0 {
		t.Fatalf("writes acknowledged during the outage are not pending")
	}

	px.down.Store(false)
	waitFor(t, "the queued writes to land after the outage", 30*time.Second, func() bool { return a.Registrar().PendingWrites() == 0 })
	fresh := regtest.Start(t, dynamoConfig(t, d.Endpoint, "aether"))
	if eps, _, err := fresh.Registrar().List([]string{"web"}); err != nil || len(eps) != 4 {
		t.Fatalf("after the outage the table holds %d endpoints (%v), want 4", len(eps), err)
	}
	t.Logf("%d requests refused during the outage", px.shed.Load())
}

// TestDynamoDBNodeLapseSweepsItsEndpoints: a node's lease on DynamoDB is
// kept alive by heartbeats through either replica; once they stop, both
// replicas drop the node after its TTL, by the same rule, and its
// endpoints are swept (not an endpoint without a node).
func TestDynamoDBNodeLapseSweepsItsEndpoints(t *testing.T) {
	d := dynalite.Start(t)
	createTable(t, d.Endpoint, "aether")
	cfg := dynamoConfig(t, d.Endpoint, "aether")
	ttl := 2 * time.Second
	cfg.NodeTTL = ttl
	a, b := regtest.Start(t, cfg), regtest.Start(t, cfg)
	ca, cb := dial(t, a.GRPCAddr()), dial(t, b.GRPCAddr())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := ca.AnnounceNode(ctx, &registrarv1.AnnounceNodeRequest{Node: &registryv1.Node{Name: "n1"}}); err != nil {
		t.Fatalf("announce: %v", err)
	}
	register(t, ca, nodeEP("web", "10.0.0.1", "n1"))
	register(t, ca, nodeEP("web", "10.0.0.2", ""))
	webOn := func(s *server.Server) []string {
		eps, _, _ := s.Registrar().List([]string{"web"})
		var ips []string
		for _, e := range eps {
			ips = append(ips, e.GetIp())
		}
		return ips
	}
	waitFor(t, "B to know the node and both endpoints", 10*time.Second, func() bool {
		_, err := cb.Heartbeat(ctx, &registrarv1.HeartbeatRequest{Node: "n1"})
		return err == nil && len(webOn(b)) == 2
	})
	var last time.Time
	for end := time.Now().Add(2 * ttl); time.Now().Before(end); time.Sleep(ttl / 4) { // the heartbeat cadence under test
		if _, err := cb.Heartbeat(ctx, &registrarv1.HeartbeatRequest{Node: "n1"}); err != nil {
			t.Fatalf("heartbeat through B: %v", err)
		}
		last = time.Now()
	}
	for name, s := range map[string]*server.Server{"a": a, "b": b} {
		if got := webOn(s); len(got) != 2 {
			t.Fatalf("replica %s lost the node's endpoint while heartbeats kept coming: %v", name, got)
		}
	}
	for name, s := range map[string]*server.Server{"a": a, "b": b} {
		waitFor(t, "replica "+name+" to sweep the lapsed node's endpoint", 15*time.Second, func() bool {
			got := webOn(s)
			return len(got) == 1 && got[0] == "10.0.0.2"
		})
	}
	if since := time.Since(last); since < ttl {
		t.Fatalf("endpoint swept %v after the last heartbeat, before the %v TTL", since, ttl)
	}
	if _, err := cb.Heartbeat(ctx, &registrarv1.HeartbeatRequest{Node: "n1"}); err == nil {
		t.Fatalf("a heartbeat after the lapse was accepted")
	}
}
