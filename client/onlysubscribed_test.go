package client

import (
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aethermesh/aether/internal/testutil/etcdtest"
)

// registrarStreams is the registrar's open watch streams
// (registrar_connected_agents).
func registrarStreams(t *testing.T, r *testRegistrar) float64 {
	t.Helper()
	return metricValue(t, r.Registrar().MetricsRegistry(), "registrar_connected_agents")
}

// An OnlySubscribed client with no services watches nothing: it is synced
// at once and holds no stream (an empty filter would mean every service);
// its first Subscribe opens a stream for that service alone, and
// unsubscribing the last one closes it, with REMOVED for what it held.
func TestOnlySubscribedWatchesNothingUntilSubscribed(t *testing.T) {
	etcd := etcdtest.Start(t)
	a := startRegistrar(t, etcd, "")
	ca := dial(t, a.GRPCAddr())
	register(t, ca, ep("web", "10.0.0.1", 80))
	register(t, ca, ep("db", "10.0.1.1", 5432))
	reg := prometheus.NewRegistry()
	rec := &recorder{}
	c := newClient(t, Config{Addrs: []string{a.GRPCAddr()}, OnlySubscribed: true, Registerer: reg, OnChange: rec.record})
	waitSynced(t, c) // nothing to fetch: at once, with no registrar stream
	if got := c.Services(); got == nil || len(got) != 0 {
		t.Fatalf("Services of an OnlySubscribed client with none = %#v, want []string{}", got)
	}
	if !c.Connected() {
		t.Fatal("a client with nothing to watch is not synced")
	}
	// A read the RPC answers goes over the same connection: once it is
	// answered, a stream opened at New would be open as well.
	if got := ips(endpointsOf(t, c, "db")); !slices.Equal(got, []string{"db 10.0.1.1"}) {
		t.Fatalf("db read through the RPC = %v", got)
	}
	if n := registrarStreams(t, a); n != 0 {
		t.Fatalf("%v registrar streams with nothing subscribed, want 0", n)
	}

	if err := c.Subscribe("web"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "web cached", 5*time.Second, func() bool { return cached(c, "web") })
	if cached(c, "db") {
		t.Fatal("db cached though only web is subscribed")
	}
	if n := registrarStreams(t, a); n != 1 {
		t.Fatalf("%v registrar streams with web subscribed, want 1", n)
	}
	// OnChange is delivered from its own goroutine, after the cache.
	waitFor(t, "web's change delivered", 5*time.Second, func() bool { return rec.len() == 1 })
	if got := rec.since(0); !slices.Equal(got, []string{"ADDED web 10.0.0.1"}) {
		t.Fatalf("OnChange after Subscribe(web) = %v", got)
	}

	if err := c.Unsubscribe("web"); err != nil {
		t.Fatalf("unsubscribing the last service of an OnlySubscribed client: %v", err)
	}
	waitFor(t, "the stream closing with nothing to watch", 5*time.Second, func() bool { return registrarStreams(t, a) == 0 })
	waitFor(t, "web's removal delivered", 5*time.Second, func() bool { return rec.len() == 2 })
	if got := rec.since(1); !slices.Equal(got, []string{"REMOVED web 10.0.0.1"}) {
		t.Fatalf("OnChange after Unsubscribe(web) = %v", got)
	}
	if !c.Connected() {
		t.Fatal("not synced after the last service left")
	}
	if v := metricValue(t, reg, "agent_registrar_stream_reconnects_total"); v != 0 {
		t.Fatalf("%v reconnects counted; opening and closing a stream on demand is none", v)
	}

	// And again: a new stream, fresh (what it held is gone), for db.
	if err := c.Subscribe("db"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "db cached on a new stream", 5*time.Second, func() bool { return cached(c, "db") })
	if got := c.Services(); !slices.Equal(got, []string{"db"}) {
		t.Fatalf("Services = %v, want [db]", got)
	}
}
