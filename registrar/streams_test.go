package registrar_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/server"
)

func TestWatchIsDemandScoped(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	s := startRegistrar(t, etcd.Endpoints())
	c := dial(t, s.GRPCAddr())
	register(t, c, ep("web", "10.0.0.1", 80))
	register(t, c, ep("db", "10.0.0.2", 5432))

	web := watch(t, c, &registrarv1.WatchEndpointsRequest{Services: []string{"web"}})
	both := watch(t, c, &registrarv1.WatchEndpointsRequest{Services: []string{"web", "cache"}})
	all := watch(t, c, &registrarv1.WatchEndpointsRequest{})
	if snap := web.waitSnapshot(t); len(snap) != 1 || snap[0].Service != "web" {
		t.Fatalf("web snapshot = %v", snap)
	}
	if snap := all.waitSnapshot(t); len(snap) != 2 {
		t.Fatalf("unfiltered snapshot has %d endpoints", len(snap))
	}
	both.waitSnapshot(t)

	register(t, c, ep("db", "10.0.0.3", 5432))
	register(t, c, ep("cache", "10.0.0.4", 6379))
	register(t, c, ep("web", "10.0.0.5", 80))
	waitFor(t, "all watchers see the last write", 5*time.Second, func() bool {
		return web.has("ADDED web 10.0.0.5") && both.has("ADDED web 10.0.0.5") && all.has("ADDED web 10.0.0.5")
	})
	if got := strings.Join(web.changes(), ","); got != "ADDED web 10.0.0.5" {
		t.Fatalf("web watcher got %s", got)
	}
	if got := strings.Join(both.changes(), ","); got != "ADDED cache 10.0.0.4,ADDED web 10.0.0.5" {
		t.Fatalf("web+cache watcher got %s", got)
	}
	if n := len(all.changes()); n != 3 {
		t.Fatalf("unfiltered watcher got %d changes", n)
	}
}

func TestResumeInsideAndOutsideWindow(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	s := startRegistrar(t, etcd.Endpoints(), func(o *server.Config) { o.WatchHistory = 8 })
	c := dial(t, s.GRPCAddr())
	register(t, c, ep("web", "10.0.0.1", 80))
	w := watch(t, c, &registrarv1.WatchEndpointsRequest{Services: []string{"web"}})
	w.waitSnapshot(t)
	from := w.lastVersion()
	w.cancel()

	// Missed while disconnected: two web changes and a db change the filter excludes.
	register(t, c, ep("web", "10.0.0.2", 80))
	register(t, c, ep("db", "10.0.0.9", 5432))
	unregister(t, c, "web", "10.0.0.1")

	r := watch(t, c, &registrarv1.WatchEndpointsRequest{Services: []string{"web"}, LastVersion: from})
	waitFor(t, "resume bookmark", 5*time.Second, func() bool {
		evs := r.snapshot()
		return len(evs) > 0 && evs[len(evs)-1].Type == registrarv1.EndpointEvent_PROGRESS
	})
	evs := r.snapshot()
	if got := strings.Join(r.changes(), ","); got != "ADDED web 10.0.0.2,REMOVED web 10.0.0.1" {
		t.Fatalf("resume delivered %s", got)
	}
	for _, ev := range evs {
		if ev.Type == registrarv1.EndpointEvent_FULL_SNAPSHOT {
			t.Fatal("resume inside the window sent a snapshot")
		}
	}
	resumeAt := evs[len(evs)-1].Version
	r.cancel()

	// Push the window past the client's position.
	for i := 10; i < 30; i++ {
		register(t, c, ep("db", fmt.Sprintf("10.0.1.%d", i), 5432))
	}
	old := watch(t, c, &registrarv1.WatchEndpointsRequest{Services: []string{"web"}, LastVersion: resumeAt})
	snap := old.waitSnapshot(t)
	if len(snap) != 1 || snap[0].Ip != "10.0.0.2" {
		t.Fatalf("snapshot after falling out of the window = %v", snap)
	}

	// A token from another incarnation (e.g. before a restart) gets a snapshot too.
	other := watch(t, c, &registrarv1.WatchEndpointsRequest{LastVersion: "0123456789ab:3"})
	if snap := other.waitSnapshot(t); len(snap) != 22 {
		t.Fatalf("foreign-epoch snapshot has %d endpoints, want 22", len(snap))
	}
}

func TestSlowConsumerIsCutOffAndResumes(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	s := startRegistrar(t, etcd.Endpoints(), func(o *server.Config) {
		o.WatchBuffer = 256
		o.MaxEndpointsPerNode = 1 << 20 // many endpoints, all of node n1
	})
	// A small fixed window (no BDP growth) so an unread stream backs up fast.
	slow := dial(t, s.GRPCAddr(), grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	c := dial(t, s.GRPCAddr())

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := slow.WatchEndpoints(ctx, &registrarv1.WatchEndpointsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil || first.Type != registrarv1.EndpointEvent_FULL_SNAPSHOT {
		t.Fatalf("first message %v, %v", first, err)
	}
	// A fast watcher on the same registrar must not be held back.
	fast := watch(t, c, &registrarv1.WatchEndpointsRequest{})
	fast.waitSnapshot(t)

	big := strings.Repeat("x", 250)
	const n = 2000
	for i := 0; i < n; i++ {
		e := ep("web", fmt.Sprintf("10.2.%d.%d", i/250, i%250+1), 80)
		e.Metadata = map[string]string{"a": big, "b": big, "c": big, "d": big}
		register(t, c, e)
	}
	waitFor(t, "fast watcher gets every event", 10*time.Second, func() bool {
		if done, err := fast.ended(); done {
			t.Fatalf("fast watcher ended: %v after %d changes", err, len(fast.changes()))
		}
		return len(fast.changes()) == n
	})

	// The stuck stream is cut off while its client still reads nothing: a
	// Send blocked on flow control must not keep it (and its goroutine)
	// alive until the client wakes up.
	waitFor(t, "eviction of the stuck stream", 10*time.Second, func() bool {
		return metricValue(t, s.HTTPAddr(), "registrar_watch_evictions_total") == 1 &&
			metricValue(t, s.HTTPAddr(), "registrar_connected_agents") == 1
	})

	// Now drain the slow stream: it ends with RESOURCE_EXHAUSTED naming a
	// resume version, after a prefix of the events in order.
	var got int
	var lastSeq uint64
	var last string
	for {
		ev, err := stream.Recv()
		if err != nil {
			if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "last_version") {
				t.Fatalf("slow stream ended with %v, want RESOURCE_EXHAUSTED naming last_version", err)
			}
			break
		}
		if ev.Sequence <= lastSeq {
			t.Fatalf("out of order: %d after %d", ev.Sequence, lastSeq)
		}
		lastSeq, last = ev.Sequence, ev.Version
		got++
	}
	if got >= n {
		t.Fatalf("slow stream received all %d events; it was never cut off", got)
	}
	// Resuming from the last event it received delivers exactly the rest.
	r := watch(t, c, &registrarv1.WatchEndpointsRequest{LastVersion: last})
	waitFor(t, "resumed stream catches up", 10*time.Second, func() bool { return len(r.changes()) == n-got })
	for _, ev := range r.snapshot() {
		if ev.Type == registrarv1.EndpointEvent_FULL_SNAPSHOT {
			t.Fatal("resume after eviction sent a snapshot")
		}
	}
	if v := metricValue(t, s.HTTPAddr(), "registrar_watch_evictions_total"); v != 1 {
		t.Fatalf("evictions metric = %v, want 1", v)
	}
}

func TestIdleStreamsGetBookmarks(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	s := startRegistrar(t, etcd.Endpoints(), func(o *server.Config) { o.ProgressInterval = 50 * time.Millisecond })
	c := dial(t, s.GRPCAddr())
	register(t, c, ep("web", "10.0.0.1", 80))
	w := watch(t, c, &registrarv1.WatchEndpointsRequest{Services: []string{"db"}})
	w.waitSnapshot(t)
	register(t, c, ep("web", "10.0.0.2", 80)) // not for this watcher: it stays idle
	var bm *registrarv1.EndpointEvent
	waitFor(t, "bookmark", 5*time.Second, func() bool {
		for _, ev := range w.snapshot() {
			if ev.Type == registrarv1.EndpointEvent_PROGRESS && ev.Sequence >= 2 {
				bm = ev
				return true
			}
		}
		return false
	})
	// The bookmark is a resume token that skips what the filter excludes.
	register(t, c, ep("db", "10.0.0.3", 5432))
	r := watch(t, c, &registrarv1.WatchEndpointsRequest{Services: []string{"db"}, LastVersion: bm.Version})
	waitFor(t, "resume from bookmark", 5*time.Second, func() bool { return r.has("ADDED db 10.0.0.3") })
	if len(r.changes()) != 1 {
		t.Fatalf("resume from bookmark got %v", r.changes())
	}
}

func TestLargeSnapshotIsChunked(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	s := startRegistrar(t, etcd.Endpoints(), func(o *server.Config) { o.MaxEndpointsPerNode = 1 << 20 }) // 2500 endpoints of node n1
	c := dial(t, s.GRPCAddr())
	for i := 0; i < 2500; i++ {
		register(t, c, ep("web", fmt.Sprintf("10.1.%d.%d", i/250, i%250+1), 80))
	}
	w := watch(t, c, &registrarv1.WatchEndpointsRequest{})
	if got := len(w.waitSnapshot(t)); got != 2500 {
		t.Fatalf("snapshot has %d endpoints, want 2500", got)
	}
	var msgs int
	for _, ev := range w.snapshot() {
		if ev.Type == registrarv1.EndpointEvent_FULL_SNAPSHOT {
			msgs++
		}
	}
	if msgs != 3 {
		t.Fatalf("snapshot came in %d messages, want 3 chunks", msgs)
	}
}
