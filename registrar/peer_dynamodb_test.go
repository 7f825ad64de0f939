package registrar_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"google.golang.org/protobuf/proto"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	dynamostore "github.com/aethermesh/aether/backend/dynamodb"
	"github.com/aethermesh/aether/internal/faultproxy"
	"github.com/aethermesh/aether/internal/testutil/dynalite"
	"github.com/aethermesh/aether/internal/testutil/regtest"
	"github.com/aethermesh/aether/registry"
	"github.com/aethermesh/aether/server"
)

// Peer-watch on DynamoDB (dynalite), which has no change feed: without
// peer-watch a replica learns another's write only at its next poll
// (--sync-interval, 5 s by default). The poll here is that default, and
// the write-behind batch peerBatch, so the table does not hold a write
// yet when B's watcher sees it: peer-watch delivered it.
//
// The stated bound: dynamoPeerBound, 250 ms, a twentieth of the poll
// interval (the figures logged are a few ms on an idle machine).
const (
	dynamoPoll      = 5 * time.Second
	dynamoPeerBound = 250 * time.Millisecond
)

// dynamoTable is a fresh table on a dynalite of the test's own.
type dynamoTable struct {
	endpoint, table string
	store           *dynamostore.Store // a reader of the table, for checks
}

func newDynamoTable(t *testing.T) *dynamoTable {
	t.Helper()
	// The registrar's client takes the SDK's chain: credentials from the
	// environment (dynalite wants requests signed, by anyone).
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	d := dynalite.Start(t)
	cli := ddb.New(ddb.Options{
		Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("test", "test", ""),
		BaseEndpoint: aws.String(d.Endpoint), Retryer: dynamostore.NewRetryer(),
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := dynamostore.CreateTable(ctx, cli, "aether", 4); err != nil {
		t.Fatalf("create table: %v", err)
	}
	st, err := dynamostore.Open(ctx, cli, "aether", dynamostore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return &dynamoTable{endpoint: d.Endpoint, table: "aether", store: st}
}

// on configures a registrar on the table, through endpoint if given (a
// proxy in front of dynalite), with peer-watch as the etcd tests have it
// and the poll at dynamoPoll.
func (d *dynamoTable) on(endpoint string) func(*server.Config) {
	if endpoint == "" {
		endpoint = d.endpoint
	}
	return func(o *server.Config) {
		peerWatchOn(o)
		o.EtcdEndpoints = nil
		o.Backend, o.DynamoDBTable, o.DynamoDBRegion, o.DynamoDBEndpoint = server.BackendDynamoDB, d.table, "us-east-1", endpoint
		o.SyncInterval = dynamoPoll
	}
}

// held reports whether the table holds e (a consistent read).
func (d *dynamoTable) held(t *testing.T) func(*registryv1.ServiceEndpoint) (string, bool) {
	return func(e *registryv1.ServiceEndpoint) (string, bool) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// As the registrar stores it: in its region and cluster.
		e = proto.Clone(e).(*registryv1.ServiceEndpoint)
		e.Region, e.Cluster = "r1", "c1"
		got, _, _, err := d.store.GetEndpoint(ctx, registry.IDOf(e))
		if err != nil {
			t.Fatalf("reading %s from the table: %v", e.GetIp(), err)
		}
		k, _ := registry.IDOf(e).Key()
		return k, got != nil
	}
}

func (d *dynamoTable) start(t *testing.T, mut ...func(*server.Config)) *server.Server {
	t.Helper()
	return startAt(t, "127.0.0.1:0", append([]func(*server.Config){d.on("")}, mut...)...)
}

// Two replicas on one table: A's writes reach B's watcher within the
// bound, long before the poll and before A's flush; the table's later
// report of them (B's poll) changes nothing; churn keeps B's streams
// within every guarantee.
func TestPeerWatchDynamoDBDeliversLongBeforeThePoll(t *testing.T) {
	d := newDynamoTable(t)
	a, b := d.start(t), d.start(t)
	connected(t, a, 1)
	connected(t, b, 1)
	ca, cb := dial(t, a.GRPCAddr()), dial(t, b.GRPCAddr())
	ref := reference(t, cb)
	streams := filteredStreams(t, cb, "b-")

	var worst time.Duration
	for _, ip := range []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"} {
		worst = max(worst, deliveredBefore(t, a, ca, ref, ip, dynamoPeerBound, d.held(t)))
	}
	t.Logf("on DynamoDB, A's writes reached B's watcher within %v (bound %v, poll every %v, batch interval %v)", worst, dynamoPeerBound, dynamoPoll, peerBatch)

	// The poll's report of the same writes, once the table holds them,
	// changes nothing: no second event, no removal.
	ips := []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"}
	waitFor(t, "A's writes persisted", 30*time.Second, func() bool {
		for _, ip := range ips {
			if _, ok := d.held(t)(ep("web", ip, 80)); !ok {
				return false
			}
		}
		return true
	})
	n0 := syncs(t, b)
	waitFor(t, "B polls the table twice more", 30*time.Second, func() bool { return syncs(t, b) >= n0+2 })
	for _, ip := range ips {
		if n := added(ref, ip); n != 1 || removed(ref, ip) {
			t.Fatalf("B's reference saw %s ADDED %d times (removed: %v), want once and kept", ip, n, removed(ref, ip))
		}
	}
	var acks ackLog
	runWriters(t, ca, 0, 3, 40, "", &acks)
	waitFor(t, "A's churn persisted", 30*time.Second, func() bool { return a.Registrar().PendingWrites() == 0 })
	waitFor(t, "B lists what A lists", 30*time.Second, func() bool { return sameListing(t, ca, cb) })
	checkGuarantees(t, cb, ref, nil, nil, streams...)
}

// The control: peer-watch off, B learns A's write at its poll, after far
// more than the bound, so the bound above is peer-watch's doing.
func TestPeerWatchDynamoDBOffWaitsForThePoll(t *testing.T) {
	d := newDynamoTable(t)
	off := func(o *server.Config) { o.PeerWatch = false }
	a, b := d.start(t, off), d.start(t, off)
	ca, cb := dial(t, a.GRPCAddr()), dial(t, b.GRPCAddr())
	ref := reference(t, cb)
	start := time.Now()
	register(t, ca, ep("web", "10.0.5.1", 80))
	waitFor(t, "B sees A's write through its poll", 30*time.Second, func() bool { return added(ref, "10.0.5.1") > 0 })
	if took := time.Since(start); took < dynamoPeerBound {
		t.Fatalf("without peer-watch B saw A's write after %v, within peer-watch's bound %v: the bound proves nothing", took, dynamoPeerBound)
	} else {
		t.Logf("without peer-watch on DynamoDB: %v (poll every %v)", took, dynamoPoll)
	}
}

// A peer-watch stream cut (B partitioned from A's gRPC address) while A
// writes: B converges through the table's poll; healed, B reconnects and
// peer-watch delivers again. B's streams keep every guarantee.
func TestPeerWatchDynamoDBStreamCutConvergesThroughThePoll(t *testing.T) {
	d := newDynamoTable(t)
	addr := regtest.FreeAddr(t)
	px, err := faultproxy.Start(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	a := startAt(t, addr, d.on(""), func(o *server.Config) { o.PeerAdvertiseAddr = px.Addr() })
	b := d.start(t)
	connected(t, b, 1)
	ca, cb := dial(t, a.GRPCAddr()), dial(t, b.GRPCAddr())
	ref := reference(t, cb)
	streams := filteredStreams(t, cb, "b-")
	deliveredBefore(t, a, ca, ref, "10.0.1.1", dynamoPeerBound, d.held(t))

	px.Cut()
	connected(t, b, 0)
	var acks ackLog
	runWriters(t, ca, 0, 2, 30, "", &acks)
	register(t, ca, ep("web", "10.0.1.2", 80))
	unregister(t, ca, "web", "10.0.1.1")
	waitFor(t, "B converges through the poll while the stream is cut", 30*time.Second, func() bool { return sameListing(t, ca, cb) })
	waitFor(t, "B's reference gets the writes made during the cut", 10*time.Second, func() bool {
		return removed(ref, "10.0.1.1") && added(ref, "10.0.1.2") == 1
	})

	px.Heal()
	connected(t, b, 1)
	deliveredBefore(t, a, ca, ref, "10.0.1.3", dynamoPeerBound, d.held(t))
	waitFor(t, "B lists what A lists", 30*time.Second, func() bool { return sameListing(t, ca, cb) })
	checkGuarantees(t, cb, ref, nil, nil, streams...)
}

// A replica stopped and restarted (a new incarnation at the same address)
// and a replica restarted after missing peer events both converge: B
// connects to the new A; the new B loads the gap from the table.
func TestPeerWatchDynamoDBReplicaRestartsConverge(t *testing.T) {
	d := newDynamoTable(t)
	a, b := d.start(t), d.start(t)
	connected(t, b, 1)
	ca, cb := dial(t, a.GRPCAddr()), dial(t, b.GRPCAddr())
	ref := reference(t, cb)
	streams := filteredStreams(t, cb, "b-")
	deliveredBefore(t, a, ca, ref, "10.0.2.1", dynamoPeerBound, d.held(t))

	addr := a.GRPCAddr()
	closeServer(t, a)
	a = startAt(t, addr, d.on(""))
	connected(t, b, 1)
	ca = dial(t, a.GRPCAddr())
	deliveredBefore(t, a, ca, ref, "10.0.2.2", dynamoPeerBound, d.held(t))
	var acks ackLog
	runWriters(t, ca, 0, 2, 30, "", &acks)
	waitFor(t, "B lists what the new A lists", 30*time.Second, func() bool { return sameListing(t, ca, cb) })
	checkGuarantees(t, cb, ref, nil, nil, streams...)

	closeServer(t, b)
	register(t, ca, ep("web", "10.0.2.3", 80))
	unregister(t, ca, "web", "10.0.2.1")
	b = d.start(t)
	cb = dial(t, b.GRPCAddr())
	connected(t, b, 1)
	ref2 := reference(t, cb)
	deliveredBefore(t, a, ca, ref2, "10.0.2.4", dynamoPeerBound, d.held(t))
	waitFor(t, "the restarted B lists what A lists", 30*time.Second, func() bool { return sameListing(t, ca, cb) })
	checkGuarantees(t, cb, ref2, nil, nil)
}

// syncs is how many backend listings s has reconciled (its polls, here).
func syncs(t *testing.T, s *server.Server) uint64 {
	t.Helper()
	mfs, err := s.Registrar().MetricsRegistry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "registrar_sync_duration_seconds" && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	t.Fatal("no metric registrar_sync_duration_seconds")
	return 0
}

// tableGate forwards to dynalite, or, while down, answers 503 as an
// unreachable endpoint's load balancer would: A cut off from the table.
type tableGate struct {
	proxy *httputil.ReverseProxy
	down  atomic.Bool
}

func (g *tableGate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if g.down.Load() {
		http.Error(w, "service unavailable (the test's partition)", http.StatusServiceUnavailable)
		return
	}
	g.proxy.ServeHTTP(w, r)
}

// A replica cut off from the table, then stopped with a write never
// persisted: B showed the write at once through peer-watch, and its poll
// removes it once the write's grace has passed; the table never held it.
func TestPeerWatchDynamoDBUnconfirmedWriteRemovedByThePoll(t *testing.T) {
	d := newDynamoTable(t)
	u, err := url.Parse(d.endpoint)
	if err != nil {
		t.Fatal(err)
	}
	gate := &tableGate{proxy: httputil.NewSingleHostReverseProxy(u)}
	front := httptest.NewServer(gate)
	t.Cleanup(front.Close)
	a := startAt(t, "127.0.0.1:0", d.on(front.URL))
	b := d.start(t)
	connected(t, b, 1)
	ca, cb := dial(t, a.GRPCAddr()), dial(t, b.GRPCAddr())
	ref := reference(t, cb)
	streams := filteredStreams(t, cb, "b-")

	gate.down.Store(true)
	applied := time.Now()
	deliveredBefore(t, a, ca, ref, "10.0.3.1", dynamoPeerBound, d.held(t))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_ = a.Close(ctx) // its last flush cannot land
	cancel()
	if k, ok := d.held(t)(ep("web", "10.0.3.1", 80)); ok {
		t.Fatalf("the write reached the table (%s) though A was cut off", k)
	}
	waitFor(t, "B's poll removes the unconfirmed peer write", 60*time.Second, func() bool { return removed(ref, "10.0.3.1") })
	if took := time.Since(applied); took < 3*peerBatch {
		t.Fatalf("B removed the unconfirmed write after %v, before its grace", took)
	}
	if len(listAllEndpoints(t, cb).Endpoints) != 0 {
		t.Fatal("B still lists the unconfirmed write")
	}
	checkGuarantees(t, cb, ref, nil, nil, streams...)
}
