package registrar_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/server"
)

func TestSyncModeValidate(t *testing.T) {
	t.Parallel()
	for _, m := range []string{"", registrar.SyncWatch, registrar.SyncPoll} {
		if err := (registrar.Options{SyncMode: m}).Validate(); err != nil {
			t.Errorf("SyncMode %q: %v", m, err)
		}
	}
	for _, m := range []string{"push", "Watch", "polling"} {
		err := (registrar.Options{SyncMode: m}).Validate()
		if want := fmt.Sprintf("--sync-mode %q: use watch or poll", m); err == nil || err.Error() != want {
			t.Errorf("SyncMode %q: error %v, want %q", m, err, want)
		}
	}
	if d := registrar.DefaultOptions().SyncMode; d != registrar.SyncWatch {
		t.Errorf("default SyncMode %q, want %q", d, registrar.SyncWatch)
	}
}

// etcdWatchers scrapes etcd's own count of open watchers from its /metrics
// (served on the client URL). The gauge is per process, counting the
// watchers of every etcd this test binary runs, so the test reads it
// relative to a baseline and does not run in parallel with the others.
func etcdWatchers(t testing.TB, etcd *etcdtest.Cluster) float64 {
	t.Helper()
	const name = "etcd_debugging_mvcc_watcher_total"
	v, ok := scrapeMetric(t, etcd.Endpoints()[0]+"/metrics", name)
	if !ok {
		t.Fatalf("etcd's /metrics has no %s", name)
	}
	return v
}

// With --sync-mode poll a replica opens no etcd watch: another replica's
// write reaches its watchers only with its next full re-list, one
// --sync-interval after the previous one.
func TestPollModeLearnsOnlyFromTheRelist(t *testing.T) {
	// Not parallel: see etcdWatchers.
	const interval = time.Second
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	base := etcdWatchers(t, etcd)
	poll := func(o *server.Config) { o.SyncMode = registrar.SyncPoll; o.SyncInterval = interval }
	a := startRegistrar(t, etcd.Endpoints(), poll)
	b := startRegistrar(t, etcd.Endpoints(), poll)
	ca := dial(t, a.GRPCAddr())
	w := watch(t, dial(t, b.GRPCAddr()), &registrarv1.WatchEndpointsRequest{Services: []string{"web"}})
	w.waitSnapshot(t)
	relists := func() float64 { return metricValue(t, b.HTTPAddr(), "registrar_sync_duration_seconds_count") }

	// Register through A right after one of B's re-lists, so the next one
	// is most of an interval away. On a machine so loaded that B re-lists
	// again before the check, the attempt proves nothing and is repeated.
	for attempt := 1; ; attempt++ {
		ip := fmt.Sprintf("10.0.0.%d", attempt)
		n := relists()
		waitFor(t, "one of B's re-lists", 3*interval, func() bool { return relists() > n })
		n = relists()
		register(t, ca, ep("web", ip, 80))
		registered := time.Now()
		waitFor(t, "A's write in etcd", 5*time.Second, func() bool { return countKeys(t, cli) == int64(attempt) })
		time.Sleep(300*time.Millisecond - time.Since(registered))
		seen := w.has("ADDED web " + ip)
		if relists() != n {
			if attempt == 3 {
				t.Fatal("B re-listed within 300ms of the previous re-list in three attempts; the machine is too loaded to tell")
			}
			waitFor(t, "B's watcher sees A's write", 3*interval, func() bool { return w.has("ADDED web " + ip) })
			continue
		}
		if seen {
			t.Fatalf("B's watcher saw A's write %v after it, with no re-list in between: B learned it from something other than the poll", time.Since(registered))
		}
		waitFor(t, "B's watcher sees A's write after its next re-list", 2*interval, func() bool { return w.has("ADDED web " + ip) })
		t.Logf("B saw A's write %v after it (--sync-interval %v)", time.Since(registered).Round(time.Millisecond), interval)
		if relists() == n {
			t.Fatal("B's watcher saw A's write without a re-list")
		}
		break
	}

	// Both have run for more than an interval: neither opened an etcd watch.
	if got := etcdWatchers(t, etcd); got > base {
		t.Fatalf("etcd has %v watchers with two poll-mode registrars, %v before they started", got, base)
	}
	// The check can fail: a registrar in the default mode does watch.
	before := etcdWatchers(t, etcd)
	startRegistrar(t, etcd.Endpoints())
	waitFor(t, "a watch-mode registrar's etcd watch", 5*time.Second, func() bool { return etcdWatchers(t, etcd) > before })

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := server.Start(ctx, server.Config{EtcdEndpoints: etcd.Endpoints(), GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Options: registrar.Options{SyncMode: "push"}}); err == nil || !strings.Contains(err.Error(), "--sync-mode") {
		t.Fatalf("Start with SyncMode push: %v, want an error naming --sync-mode", err)
	}
}
