package client

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/faultproxy"
	"github.com/aethermesh/aether/internal/retry"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
)

// A registrar restart gets a new epoch, so the client's token cannot resume
// there and it gets a FULL_SNAPSHOT; diffing it against the cache must
// still hand OnChange exactly what changed meanwhile (through another
// registrar), and nothing else.
func TestResumeAfterRegistrarRestartDeliversExactlyTheMissedChanges(t *testing.T) {
	etcd := etcdtest.Start(t)
	addrA := freeAddr(t)
	a := startRegistrar(t, etcd, addrA)
	b := startRegistrar(t, etcd, "")
	ca, cb := dial(t, addrA), dial(t, b.GRPCAddr())
	for _, e := range []*registryv1.ServiceEndpoint{ep("web", "10.0.0.1", 80), ep("web", "10.0.0.2", 80), ep("web", "10.0.0.3", 80), ep("db", "10.0.1.1", 5432)} {
		register(t, ca, e)
	}

	rec := &recorder{}
	c := newClient(t, Config{Addrs: []string{addrA}, OnChange: rec.record})
	waitSynced(t, c)
	waitFor(t, "the initial endpoints reported", 5*time.Second, func() bool { return rec.len() == 4 })
	mark := rec.len()
	// B learns A's writes through etcd; it must know them to change them.
	waitFor(t, "B synced with A's writes", 10*time.Second, func() bool { return len(list(t, cb)) == 4 })

	a.stop(t)
	waitFor(t, "client disconnected", 5*time.Second, func() bool { return !c.Connected() })
	register(t, cb, ep("web", "10.0.0.4", 80))
	register(t, cb, ep("db", "10.0.1.2", 5432))
	register(t, cb, ep("web", "10.0.0.2", 8080)) // an update
	unregister(t, cb, "web", "10.0.0.3")
	// A's new incarnation loads its snapshot from etcd.
	waitFor(t, "B's writes persisted", 10*time.Second, func() bool { return b.Registrar().PendingWrites() == 0 })

	startRegistrar(t, etcd, addrA)
	want := list(t, cb)
	waitFor(t, "client resynced with the restarted registrar", 10*time.Second, func() bool {
		return c.Connected() && sameEndpoints(allOf(t, c), want) && quiet(c)
	})
	got := rec.since(mark)
	if exp := sorted("ADDED web 10.0.0.4", "ADDED db 10.0.1.2", "UPDATED web 10.0.0.2", "REMOVED web 10.0.0.3"); !slices.Equal(got, exp) {
		t.Fatalf("OnChange after the restart got\n  %v\nwant exactly\n  %v", got, exp)
	}
	if n := c.stats.fullSnapshots.Load(); n != 2 {
		t.Fatalf("%d full snapshots applied; want 2 (initial, and after the restart)", n)
	}
	if eps := endpointsOf(t, c, "web"); eps[1].Ip != "10.0.0.2" || eps[1].Ports[0].Port != 8080 {
		t.Fatalf("web after restart: %v", eps)
	}
}

// A connection cut inside the retention window resumes the stream: exactly
// the missed events of the subscribed services and a bookmark, no snapshot.
func TestResumeWithinWindowDeliversMissedEventsWithoutSnapshot(t *testing.T) {
	etcd := etcdtest.Start(t)
	a := startRegistrar(t, etcd, "")
	ca := dial(t, a.GRPCAddr())
	register(t, ca, ep("web", "10.0.0.1", 80))
	register(t, ca, ep("web", "10.0.0.2", 80))
	register(t, ca, ep("db", "10.0.1.1", 5432))
	proxy, err := faultproxy.Start(a.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })

	rec := &recorder{}
	c := newClient(t, Config{Addrs: []string{proxy.Addr()}, Services: []string{"web"}, OnChange: rec.record})
	waitSynced(t, c)
	waitFor(t, "the initial endpoints reported", 5*time.Second, func() bool { return rec.len() == 2 })
	mark := rec.len()

	proxy.Cut()
	waitFor(t, "client disconnected", 5*time.Second, func() bool { return !c.Connected() })
	register(t, ca, ep("web", "10.0.0.3", 80))
	register(t, ca, ep("web", "10.0.0.1", 81))
	unregister(t, ca, "web", "10.0.0.2")
	register(t, ca, ep("db", "10.0.1.2", 5432)) // not subscribed yet: no event for it
	// Subscribing while disconnected: the stream resumes with the services
	// the cache holds, and db comes as a SERVICES_SNAPSHOT, not as a
	// partial history.
	if err := c.Subscribe("db"); err != nil {
		t.Fatal(err)
	}
	proxy.Heal()

	want := list(t, ca, "web", "db")
	waitFor(t, "client resumed", 10*time.Second, func() bool {
		return c.Connected() && cached(c, "db") && sameEndpoints(allOf(t, c), want) && quiet(c)
	})
	exp := sorted("ADDED web 10.0.0.3", "UPDATED web 10.0.0.1", "REMOVED web 10.0.0.2", "ADDED db 10.0.1.1", "ADDED db 10.0.1.2")
	if got := rec.since(mark); !slices.Equal(got, exp) {
		t.Fatalf("OnChange after the resume got\n  %v\nwant exactly\n  %v", got, exp)
	}
	if n := c.stats.fullSnapshots.Load(); n != 1 {
		t.Fatalf("%d full snapshots; want only the initial one (the resume must not send one)", n)
	}
	if n := c.stats.resumes.Load(); n < 1 {
		t.Fatal("no stream resumed")
	}
	if got := ips(allOf(t, c)); !slices.Equal(got, []string{"db 10.0.1.1", "db 10.0.1.2", "web 10.0.0.1", "web 10.0.0.3"}) {
		t.Fatalf("AllEndpoints = %v", got)
	}
}

// A resume token the registrar refuses (InvalidArgument) is dropped rather
// than retried forever; the stream starts over with a snapshot, diffed
// against the cache.
func TestRefusedResumeTokenFallsBackToSnapshot(t *testing.T) {
	etcd := etcdtest.Start(t)
	a := startRegistrar(t, etcd, "")
	ca := dial(t, a.GRPCAddr())
	register(t, ca, ep("web", "10.0.0.1", 80))
	proxy, err := faultproxy.Start(a.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	rec := &recorder{}
	c := newClient(t, Config{Addrs: []string{proxy.Addr()}, OnChange: rec.record})
	waitSynced(t, c)
	waitFor(t, "initial endpoint reported", 5*time.Second, func() bool { return rec.len() == 1 })

	proxy.Cut()
	waitFor(t, "client disconnected", 5*time.Second, func() bool { return !c.Connected() })
	c.mu.Lock()
	c.st.version = "not a version token"
	c.mu.Unlock()
	register(t, ca, ep("web", "10.0.0.2", 80))
	proxy.Heal()
	waitFor(t, "client resynced", 10*time.Second, func() bool {
		return c.Connected() && len(endpointsOf(t, c, "web")) == 2 && quiet(c)
	})
	if got := rec.since(1); !slices.Equal(got, []string{"ADDED web 10.0.0.2"}) {
		t.Fatalf("OnChange = %v", got)
	}
	if n := c.stats.fullSnapshots.Load(); n != 2 {
		t.Fatalf("%d full snapshots, want 2", n)
	}
}

// With every registrar down, reads keep returning the last data from the
// cache (no RPC), and CacheAge says how stale it is.
func TestStaleCacheServedWhileEveryRegistrarIsDown(t *testing.T) {
	etcd := etcdtest.Start(t)
	addrA := freeAddr(t)
	a := startRegistrar(t, etcd, addrA)
	register(t, dial(t, addrA), ep("web", "10.0.0.1", 80))
	register(t, dial(t, addrA), ep("web", "10.0.0.2", 80))
	reg := prometheus.NewRegistry()
	c := newClient(t, Config{Addrs: []string{addrA}, Services: []string{"web"}, Registerer: reg})
	waitSynced(t, c)
	if !c.Connected() || c.CacheAge() != 0 {
		t.Fatalf("synced client: connected=%v age=%v", c.Connected(), c.CacheAge())
	}

	a.stop(t)
	waitFor(t, "client disconnected", 5*time.Second, func() bool { return !c.Connected() })
	fallbacks := c.stats.fallbacks.Load()
	if got := ips(endpointsOf(t, c, "web")); !slices.Equal(got, []string{"web 10.0.0.1", "web 10.0.0.2"}) {
		t.Fatalf("stale Endpoints = %v", got)
	}
	if got := ips(allOf(t, c)); len(got) != 2 {
		t.Fatalf("stale AllEndpoints = %v", got)
	}
	if c.stats.fallbacks.Load() != fallbacks {
		t.Fatal("a read of a cached service went to the (dead) registrar")
	}
	waitFor(t, "cache age to grow", 5*time.Second, func() bool { return c.CacheAge() > 100*time.Millisecond })
	if v := metricValue(t, reg, "agent_registrar_cache_age_seconds"); v <= 0.1 {
		t.Fatalf("agent_registrar_cache_age_seconds = %v while down", v)
	}
	if v := metricValue(t, reg, "agent_registrar_stream_reconnects_total"); v < 1 {
		t.Fatalf("agent_registrar_stream_reconnects_total = %v while down", v)
	}

	startRegistrar(t, etcd, addrA)
	waitFor(t, "client reconnected", 10*time.Second, c.Connected)
	if age := c.CacheAge(); age != 0 {
		t.Fatalf("CacheAge = %v after reconnecting", age)
	}
	if v := metricValue(t, reg, "agent_registrar_cache_age_seconds"); v != 0 {
		t.Fatalf("agent_registrar_cache_age_seconds = %v after reconnecting", v)
	}
	register(t, dial(t, addrA), ep("web", "10.0.0.3", 80))
	waitFor(t, "fresh data", 5*time.Second, func() bool { return len(endpointsOf(t, c, "web")) == 3 })
}

// Writes made while no registrar is reachable are visible to the agent at
// once, survive the outage, reach etcd once a registrar is back, and are
// never reverted by the snapshot the reconnect brings.
func TestOptimisticWritesWhileDisconnectedReachEtcd(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	addrA := freeAddr(t)
	a := startRegistrar(t, etcd, addrA)
	register(t, dial(t, addrA), ep("web", "10.0.0.1", 80))
	rec := &recorder{}
	c := newClient(t, Config{Addrs: []string{addrA}, Services: []string{"web"}, OnChange: rec.record})
	waitSynced(t, c)
	waitFor(t, "initial endpoint reported", 5*time.Second, func() bool { return rec.len() == 1 })
	mark := rec.len()

	a.stop(t)
	waitFor(t, "client disconnected", 5*time.Second, func() bool { return !c.Connected() })
	if err := c.Register(ep("web", "10.0.0.9", 9090)); err != nil {
		t.Fatal(err)
	}
	// No waiting: the agent reads its own write immediately.
	if got := ips(endpointsOf(t, c, "web")); !slices.Equal(got, []string{"web 10.0.0.1", "web 10.0.0.9"}) {
		t.Fatalf("right after Register: %v", got)
	}
	if err := c.Unregister(id("web", "10.0.0.1")); err != nil {
		t.Fatal(err)
	}
	if got := ips(endpointsOf(t, c, "web")); !slices.Equal(got, []string{"web 10.0.0.9"}) {
		t.Fatalf("right after Unregister: %v", got)
	}
	if n := c.PendingWrites(); n != 2 {
		t.Fatalf("PendingWrites = %d while down, want 2", n)
	}
	waitFor(t, "OnChange for the optimistic writes", 5*time.Second, func() bool { return rec.len() == mark+2 })

	startRegistrar(t, etcd, addrA)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if n := c.PendingWrites(); n != 0 {
		t.Fatalf("PendingWrites = %d after Flush", n)
	}
	keyOf := func(svc, ip string) string {
		k, err := id(svc, ip).Key()
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	waitFor(t, "the writes persisted in etcd", 10*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		added, err1 := cli.Get(ctx, keyOf("web", "10.0.0.9"))
		removed, err2 := cli.Get(ctx, keyOf("web", "10.0.0.1"))
		return err1 == nil && err2 == nil && len(added.Kvs) == 1 && len(removed.Kvs) == 0
	})
	waitFor(t, "stream caught up with the writes", 10*time.Second, func() bool { return c.Connected() && settled(c) && quiet(c) })
	if got := ips(endpointsOf(t, c, "web")); !slices.Equal(got, []string{"web 10.0.0.9"}) {
		t.Fatalf("after reconnecting: %v", got)
	}
	if got, exp := rec.since(mark), sorted("ADDED web 10.0.0.9", "REMOVED web 10.0.0.1"); !slices.Equal(got, exp) {
		t.Fatalf("OnChange got %v, want exactly %v (a snapshot reverted an unacknowledged write?)", got, exp)
	}
	if e := endpointsOf(t, c, "web")[0]; e.CreatedAt == nil || e.Node != "n1" {
		t.Fatalf("cached endpoint is not the registrar's stored copy: %v", e)
	}
}

// Services come and go on the live stream: no reconnect, and the cache and
// OnChange follow.
func TestSubscribeAndUnsubscribeOnTheLiveStream(t *testing.T) {
	etcd := etcdtest.Start(t)
	a := startRegistrar(t, etcd, "")
	ca := dial(t, a.GRPCAddr())
	for _, e := range []*registryv1.ServiceEndpoint{ep("web", "10.0.0.1", 80), ep("web", "10.0.0.2", 80), ep("db", "10.0.1.1", 5432), ep("db", "10.0.1.2", 5432), ep("cache", "10.0.2.1", 6379)} {
		register(t, ca, e)
	}
	reg := prometheus.NewRegistry()
	rec := &recorder{}
	c := newClient(t, Config{Addrs: []string{a.GRPCAddr()}, Services: []string{"web"}, Registerer: reg, OnChange: rec.record})
	waitSynced(t, c)
	if got := ips(allOf(t, c)); !slices.Equal(got, []string{"web 10.0.0.1", "web 10.0.0.2"}) {
		t.Fatalf("AllEndpoints of a web-only client = %v", got)
	}
	waitFor(t, "initial changes", 5*time.Second, func() bool { return rec.len() == 2 })
	mark := rec.len()

	if err := c.Subscribe("db"); err != nil {
		t.Fatal(err)
	}
	if got := c.Services(); !slices.Equal(got, []string{"db", "web"}) {
		t.Fatalf("Services right after Subscribe(db) = %v", got)
	}
	waitFor(t, "db cached", 5*time.Second, func() bool { return cached(c, "db") })
	fallbacks := c.stats.fallbacks.Load()
	if got := ips(endpointsOf(t, c, "db")); !slices.Equal(got, []string{"db 10.0.1.1", "db 10.0.1.2"}) {
		t.Fatalf("db after Subscribe = %v", got)
	}
	register(t, ca, ep("db", "10.0.1.3", 5432))
	waitFor(t, "db events on the live stream", 5*time.Second, func() bool { return len(endpointsOf(t, c, "db")) == 3 })
	if c.stats.fallbacks.Load() != fallbacks {
		t.Fatal("reads of a subscribed service went to the RPC")
	}

	if err := c.Unsubscribe("web"); err != nil {
		t.Fatal(err)
	}
	if cached(c, "web") {
		t.Fatal("web still cached right after Unsubscribe")
	}
	if got := c.Services(); !slices.Equal(got, []string{"db"}) {
		t.Fatalf("Services right after Unsubscribe(web) = %v", got)
	}
	if got := ips(allOf(t, c)); !slices.Equal(got, []string{"db 10.0.1.1", "db 10.0.1.2", "db 10.0.1.3"}) {
		t.Fatalf("AllEndpoints after unsubscribing web = %v", got)
	}
	// A web event after the unsubscription must not reach the cache; the db
	// event after it proves the stream got that far.
	register(t, ca, ep("web", "10.0.0.5", 80))
	register(t, ca, ep("db", "10.0.1.4", 5432))
	waitFor(t, "db event after the web one", 5*time.Second, func() bool { return len(endpointsOf(t, c, "db")) == 4 && quiet(c) })
	exp := sorted("ADDED db 10.0.1.1", "ADDED db 10.0.1.2", "ADDED db 10.0.1.3", "ADDED db 10.0.1.4", "REMOVED web 10.0.0.1", "REMOVED web 10.0.0.2")
	if got := rec.since(mark); !slices.Equal(got, exp) {
		t.Fatalf("OnChange got\n  %v\nwant\n  %v", got, exp)
	}
	// web is now read through the RPC, and is complete.
	if got := ips(endpointsOf(t, c, "web")); !slices.Equal(got, []string{"web 10.0.0.1", "web 10.0.0.2", "web 10.0.0.5"}) {
		t.Fatalf("unsubscribed web read = %v", got)
	}
	if c.stats.fallbacks.Load() != fallbacks+1 {
		t.Fatal("the read of an unsubscribed service did not use the RPC")
	}
	if v := metricValue(t, reg, "agent_registrar_stream_reconnects_total"); v != 0 {
		t.Fatalf("%v reconnects; subscriptions must change on the live stream", v)
	}
	if !c.Connected() {
		t.Fatal("not connected")
	}

	if err := c.Unsubscribe("db"); err == nil {
		t.Fatal("unsubscribing the last service succeeded")
	}
	if err := c.Subscribe("bad/name"); err == nil {
		t.Fatal("subscribing to an invalid name succeeded")
	}
}

// gatedStream holds back every message of a stream until gate closes.
type gatedStream struct {
	grpc.ClientStream
	gate <-chan struct{}
}

func (s *gatedStream) RecvMsg(m any) error {
	select {
	case <-s.gate:
	case <-s.Context().Done():
		return s.Context().Err()
	}
	return s.ClientStream.RecvMsg(m)
}

// Until the first snapshot is applied, reads are answered by the RPC (with
// the agent's own writes overlaid); after it, by the cache. The stream is
// held back by an interceptor, so "before the first snapshot" is certain.
func TestReadsFallBackUntilTheFirstSnapshot(t *testing.T) {
	etcd := etcdtest.Start(t)
	a := startRegistrar(t, etcd, "")
	ca := dial(t, a.GRPCAddr())
	register(t, ca, ep("web", "10.0.0.1", 80))
	register(t, ca, ep("web", "10.0.0.2", 80))
	register(t, ca, ep("db", "10.0.1.1", 5432))

	gate := make(chan struct{})
	hold := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		cs, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil || method != registrarv1.Registrar_Subscribe_FullMethodName {
			return cs, err
		}
		return &gatedStream{ClientStream: cs, gate: gate}, nil
	}
	c := newClient(t, Config{
		Addrs:       []string{a.GRPCAddr()},
		Services:    []string{"web"},
		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithStreamInterceptor(hold)},
	})

	if got := ips(endpointsOf(t, c, "web")); !slices.Equal(got, []string{"web 10.0.0.1", "web 10.0.0.2"}) {
		t.Fatalf("Endpoints before the first snapshot = %v", got)
	}
	if n := c.stats.fallbacks.Load(); n != 1 {
		t.Fatalf("%d fallback reads, want 1", n)
	}
	if err := c.Register(ep("web", "10.0.0.7", 80)); err != nil {
		t.Fatal(err)
	}
	if got := ips(endpointsOf(t, c, "web")); !slices.Equal(got, []string{"web 10.0.0.1", "web 10.0.0.2", "web 10.0.0.7"}) {
		t.Fatalf("fallback read does not show the agent's own write: %v", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := c.WaitSynced(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitSynced with the stream held back = %v", err)
	}
	if c.Connected() || c.CacheAge() <= 0 {
		t.Fatalf("before the first snapshot: connected=%v age=%v", c.Connected(), c.CacheAge())
	}

	close(gate)
	waitSynced(t, c)
	before := c.stats.fallbacks.Load()
	if got := ips(endpointsOf(t, c, "web")); !slices.Equal(got, []string{"web 10.0.0.1", "web 10.0.0.2", "web 10.0.0.7"}) {
		t.Fatalf("Endpoints after the snapshot = %v", got)
	}
	if c.stats.fallbacks.Load() != before {
		t.Fatal("read after the first snapshot went to the RPC")
	}
	if got := ips(endpointsOf(t, c, "db")); !slices.Equal(got, []string{"db 10.0.1.1"}) {
		t.Fatalf("Endpoints of an unsubscribed service = %v", got)
	}
	if c.stats.fallbacks.Load() != before+1 {
		t.Fatal("read of an unsubscribed service did not use the RPC")
	}
}

// A write the registrar rejects for good is dropped, counted, and the cache
// goes back to what the registrar says.
func TestPermanentRejectionDropsTheWriteAndRevertsTheCache(t *testing.T) {
	etcd := etcdtest.Start(t)
	a := startRegistrar(t, etcd, "")
	reg := prometheus.NewRegistry()
	rec := &recorder{}
	// This agent believes it writes for cluster c2; the registrar is c1's
	// and refuses with InvalidArgument.
	c := newClient(t, Config{Addrs: []string{a.GRPCAddr()}, Cluster: "c2", Services: []string{"web"}, Registerer: reg, OnChange: rec.record})
	waitSynced(t, c)
	if err := c.Register(ep("web", "10.0.0.1", 80)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the write dropped", 5*time.Second, func() bool {
		return metricValue(t, reg, "agent_registrar_writes_dropped_total") == 1
	})
	if got := ips(endpointsOf(t, c, "web")); len(got) != 0 {
		t.Fatalf("rejected write still cached: %v", got)
	}
	waitFor(t, "OnChange saw the revert", 5*time.Second, func() bool { return rec.len() == 2 })
	if got := rec.since(0); !slices.Equal(got, sorted("ADDED web 10.0.0.1", "REMOVED web 10.0.0.1")) {
		t.Fatalf("OnChange = %v", got)
	}
	if n := c.PendingWrites(); n != 0 {
		t.Fatalf("PendingWrites = %d", n)
	}
}

func TestFullJitterBounds(t *testing.T) {
	const base, maxD = 100 * time.Millisecond, 10 * time.Second
	top := func(n int64) int64 { return n - 1 }
	bottom := func(int64) int64 { return 0 }
	for attempt, ceil := range map[int]time.Duration{
		0: 100 * time.Millisecond, 1: 200 * time.Millisecond, 3: 800 * time.Millisecond,
		6: 6400 * time.Millisecond, 7: maxD, 20: maxD, 62: maxD, 63: maxD, 1000: maxD,
	} {
		if got := retry.FullJitter(base, maxD, attempt, top); got != ceil-1 {
			t.Errorf("attempt %d: largest delay %v, want just under %v", attempt, got, ceil)
		}
		if got := retry.FullJitter(base, maxD, attempt, bottom); got != 0 {
			t.Errorf("attempt %d: smallest delay %v, want 0 (full jitter)", attempt, got)
		}
	}
	// With a real source, delays stay in [0, ceil) and use the whole range.
	c := &Client{cfg: Config{BackoffBase: base, BackoffMax: maxD}}
	for _, attempt := range []int{0, 4, 40} {
		ceil := min(maxD, base<<min(attempt, 20))
		var lo, hi time.Duration = ceil, 0
		for range 2000 {
			d := c.backoff(attempt)
			if d < 0 || d >= ceil {
				t.Fatalf("attempt %d: delay %v outside [0, %v)", attempt, d, ceil)
			}
			lo, hi = min(lo, d), max(hi, d)
		}
		if lo > ceil/10 || hi < ceil*9/10 {
			t.Errorf("attempt %d: delays span only [%v, %v] of [0, %v)", attempt, lo, hi, ceil)
		}
	}
	if d := retry.FullJitter(0, maxD, 3, top); d != 0 {
		t.Errorf("zero base: %v", d)
	}
}

func TestConfigAndLocalValidation(t *testing.T) {
	for name, cfg := range map[string]Config{
		"no addrs":     {},
		"empty addr":   {Addrs: []string{""}},
		"bad service":  {Addrs: []string{"x:1"}, Services: []string{"a/b"}},
		"bad region":   {Addrs: []string{"x:1"}, Region: "../r"},
		"bad backoff":  {Addrs: []string{"x:1"}, BackoffBase: time.Second, BackoffMax: time.Millisecond},
		"neg backoff":  {Addrs: []string{"x:1"}, BackoffBase: -1},
		"bad node":     {Addrs: []string{"x:1"}, Node: "a b"},
		"bad registry": {Addrs: []string{"x:1"}, Registerer: dupRegistry(t)},
	} {
		if c, err := New(cfg); err == nil {
			c.Close()
			t.Errorf("%s: New accepted %+v", name, cfg)
		}
	}

	// A client that watches all services; nothing listens at its address.
	c := newClient(t, Config{Addrs: []string{freeAddr(t)}})
	if err := c.Subscribe("web"); !errors.Is(err, ErrWatchingAll) {
		t.Errorf("Subscribe on an all-services client = %v", err)
	}
	if err := c.Unsubscribe("web"); !errors.Is(err, ErrWatchingAll) {
		t.Errorf("Unsubscribe on an all-services client = %v", err)
	}
	bad := ep("web", "10.0.0.1", 0)
	if err := c.Register(bad); err == nil {
		t.Error("Register accepted port 0")
	}
	other := ep("web", "10.0.0.1", 80)
	other.Region = "r9"
	if err := c.Register(other); err == nil {
		t.Error("Register accepted another region")
	}
	if err := c.Unregister(id("web", "not-an-ip")); err == nil {
		t.Error("Unregister accepted a bad IP")
	}
	if n := c.PendingWrites(); n != 0 {
		t.Errorf("rejected writes were queued: %d", n)
	}
	// A valid write to an unreachable registrar stays pending, and Close
	// says so.
	if err := c.Drain(id("web", "::ffff:10.0.0.1")); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err == nil {
		t.Error("Close with an unacknowledged write returned nil")
	}
	if err := c.Register(ep("web", "10.0.0.2", 80)); !errors.Is(err, ErrClosed) {
		t.Errorf("Register after Close = %v", err)
	}
}

// dupRegistry returns a registry that already holds the client's metrics.
func dupRegistry(t *testing.T) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	c := newClient(t, Config{Addrs: []string{freeAddr(t)}, Registerer: reg})
	_ = c
	return reg
}

// Intents for one endpoint coalesce: the latest wins, and Drain composes
// with a Register the registrar may not have yet.
func TestWritesCoalescePerEndpoint(t *testing.T) {
	s := newState([]string{"web"}, false)
	e := ep("web", "10.0.0.1", 80)
	e.Region, e.Cluster = "r1", "c1"
	i := id("web", "10.0.0.1")
	s.intend(i, opRegister, e)
	s.intend(i, opDrain, nil)
	w := s.writes[i]
	if len(s.queue) != 1 || w.op != opRegister || w.ep.State != registryv1.State_STATE_DRAINING || e.State == registryv1.State_STATE_DRAINING {
		t.Fatalf("register+drain: queue=%v op=%v ep=%v", s.queue, w.op, w.ep)
	}
	s.intend(i, opUnregister, nil)
	s.intend(i, opDrain, nil)
	if len(s.queue) != 1 || w.op != opUnregister {
		t.Fatalf("unregister+drain: queue=%v op=%v", s.queue, w.op)
	}
	w.state = writeInflight
	s.queue = nil
	gen := w.gen
	s.intend(i, opRegister, e)
	if len(s.queue) != 0 || w.gen == gen || w.state != writeInflight {
		t.Fatalf("an intent during flight must wait for the RPC: queue=%v gen=%d state=%v", s.queue, w.gen, w.state)
	}
}
