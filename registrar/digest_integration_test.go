package registrar_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	etcdstore "github.com/aethermesh/aether/backend/etcd"
	"github.com/aethermesh/aether/internal/faultproxy"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/registry"
	"github.com/aethermesh/aether/server"
)

// The backstop re-list every --sync-interval asks etcd for keys and mod
// revisions only, and fetches just the values the snapshot does not hold
// at their listed revision (digest.go). These tests run it in poll mode,
// where it is the only way the registrar learns of other writers, against
// a real etcd, and count what it fetched.

const (
	digestRegistrySize = 300
	fetchedMetric      = "registrar_sync_values_fetched_total"
	syncsMetric        = "registrar_sync_duration_seconds_count" // one per successful listing
)

// digestEP is another cluster's endpoint i (no node, so never swept).
func digestEP(i int, mut ...func(*registryv1.ServiceEndpoint)) *registryv1.ServiceEndpoint {
	ep := &registryv1.ServiceEndpoint{
		Service: fmt.Sprintf("svc%d", i%10), Protocol: registryv1.Protocol_PROTOCOL_HTTP1,
		Ip:    fmt.Sprintf("10.%d.%d.%d", i/65536, i/256%256, i%256),
		Ports: []*registryv1.Port{{Name: "http", Port: 80}}, Region: "r1", Cluster: "c2",
		State: registryv1.State_STATE_SERVING, Weight: 1,
	}
	for _, m := range mut {
		m(ep)
	}
	return ep
}

// digestBackend is the registry as another writer sees it: a store over
// its own etcd client, and what it last wrote.
type digestBackend struct {
	t     *testing.T
	store *etcdstore.Store
	want  map[registry.EndpointID]*registryv1.ServiceEndpoint
}

func newDigestBackend(t *testing.T, etcd *etcdtest.Cluster) *digestBackend {
	return &digestBackend{t: t, store: etcdstore.New(etcd.Client(t), etcdstore.Options{}), want: map[registry.EndpointID]*registryv1.ServiceEndpoint{}}
}

// apply writes puts and deletes (an ID with a nil endpoint), in
// transactions of at most etcd's 128 operations.
func (b *digestBackend) apply(muts ...etcdstore.Mutation) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := b.store.Apply(ctx, muts); err != nil {
		b.t.Fatal(err)
	}
	for _, m := range muts {
		if m.Endpoint == nil {
			delete(b.want, m.ID)
		} else {
			b.want[m.ID] = m.Endpoint
		}
	}
}

func putEP(ep *registryv1.ServiceEndpoint) etcdstore.Mutation {
	return etcdstore.Mutation{ID: registry.IDOf(ep), Endpoint: ep}
}

// diff says how the registrar's snapshot differs from what was written
// ("" when it does not).
func (b *digestBackend) diff(r *registrar.Registrar) string {
	b.t.Helper()
	eps, _, err := r.List(nil)
	if err != nil {
		b.t.Fatal(err)
	}
	var out []string
	seen := map[registry.EndpointID]bool{}
	for _, ep := range eps {
		id := registry.IDOf(ep)
		seen[id] = true
		if w := b.want[id]; w == nil {
			out = append(out, "extra "+id.String())
		} else if !registry.SameAttributes(ep, w) {
			out = append(out, fmt.Sprintf("%s is %v/w%d, want %v/w%d", id, ep.State, ep.Weight, w.State, w.Weight))
		}
	}
	for id := range b.want {
		if !seen[id] {
			out = append(out, "missing "+id.String())
		}
	}
	sort.Strings(out)
	if len(out) > 5 {
		out = append(out[:5], fmt.Sprintf("... %d differences in all", len(out)))
	}
	return strings.Join(out, "; ")
}

// startPolling preloads the registry and starts a poll-mode registrar
// over endpoints with a short sync interval, and checks that its start-up
// listing read every value.
func startPolling(t *testing.T, b *digestBackend, endpoints []string) (*server.Server, *recorder) {
	t.Helper()
	var muts []etcdstore.Mutation
	for i := 0; i < digestRegistrySize; i++ {
		muts = append(muts, putEP(digestEP(i)))
	}
	b.apply(muts...)
	s := startRegistrar(t, endpoints, func(o *server.Config) {
		o.SyncMode = registrar.SyncPoll
		o.SyncInterval = 100 * time.Millisecond
		o.SyncDebounce = 10 * time.Millisecond
	})
	if got := metricValue(t, s.HTTPAddr(), fetchedMetric); got != digestRegistrySize {
		t.Fatalf("%s after start-up = %v, want %d: the start-up listing reads every value", fetchedMetric, got, digestRegistrySize)
	}
	w := watch(t, dial(t, s.GRPCAddr()), &registrarv1.WatchEndpointsRequest{})
	if got := len(w.waitSnapshot(t)); got != digestRegistrySize {
		t.Fatalf("snapshot of %d endpoints, want %d", got, digestRegistrySize)
	}
	return s, w
}

// waitBackstops waits for n more backstop listings to complete.
func waitBackstops(t *testing.T, s *server.Server, n int) {
	t.Helper()
	from := metricValue(t, s.HTTPAddr(), syncsMetric)
	waitFor(t, fmt.Sprintf("%d backstop listings", n), 10*time.Second, func() bool {
		return metricValue(t, s.HTTPAddr(), syncsMetric) >= from+float64(n)
	})
}

// wantFetched checks the fetched-values counter, and that it stays put
// over a few more backstops with nothing changing.
func wantFetched(t *testing.T, s *server.Server, want float64, what string) {
	t.Helper()
	if got := metricValue(t, s.HTTPAddr(), fetchedMetric); got != want {
		t.Fatalf("%s: %s = %v, want %v", what, fetchedMetric, got, want)
	}
	waitBackstops(t, s, 3)
	if got := metricValue(t, s.HTTPAddr(), fetchedMetric); got != want {
		t.Fatalf("%s, then three backstops with nothing changed: %s = %v, want it to stay %v", what, fetchedMetric, got, want)
	}
}

func TestBackstopDigestPollFetchesOnlyChangedValues(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	b := newDigestBackend(t, etcd)
	s, w := startPolling(t, b, etcd.Endpoints())

	// Nothing changes: the keys-only backstops fetch nothing.
	waitBackstops(t, s, 2)
	wantFetched(t, s, digestRegistrySize, "with nothing changed since start-up")

	// Behind its back, in one transaction: an update, a delete and an add.
	updated := digestEP(7, func(ep *registryv1.ServiceEndpoint) { ep.State = registryv1.State_STATE_DRAINING; ep.Weight = 5 })
	deleted := digestEP(8)
	added := digestEP(digestRegistrySize)
	b.apply(putEP(updated), etcdstore.Mutation{ID: registry.IDOf(deleted)}, putEP(added))

	waitFor(t, "the registrar converges on the changes", 10*time.Second, func() bool { return b.diff(s.Registrar()) == "" })
	want := []string{
		"ADDED " + added.Service + " " + added.Ip,
		"REMOVED " + deleted.Service + " " + deleted.Ip,
		"UPDATED " + updated.Service + " " + updated.Ip,
	}
	waitFor(t, "the watcher sees the three changes", 5*time.Second, func() bool { return len(w.changes()) >= len(want) })
	got := w.changes()
	sort.Strings(got)
	if !slices.Equal(got, want) {
		t.Fatalf("watcher saw %v, want exactly %v", got, want)
	}
	// The update's and the add's values are fetched; the delete shows as
	// a key missing from the keys-only listing and needs no value.
	wantFetched(t, s, digestRegistrySize+2, "after an update, a delete and an add")
	if d := b.diff(s.Registrar()); d != "" {
		t.Fatalf("after further backstops the snapshot differs: %s", d)
	}
	if got := w.changes(); len(got) != len(want) {
		t.Fatalf("further backstops produced events: %v", got[len(want):])
	}
}

// etcdTxns is how many Txn calls etcd has answered (GetAt reads values a
// Txn at a time; a full listing uses Range). etcd's metrics are per
// process, counting the calls to every etcd this test binary runs, so
// callers compare two readings and do not run in parallel with the others.
func etcdTxns(t *testing.T, etcd *etcdtest.Cluster) float64 {
	t.Helper()
	resp, err := http.Get(etcd.Endpoints()[0] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	found := false
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, "grpc_server_handled_total{") || !strings.Contains(line, `grpc_method="Txn"`) {
			continue
		}
		found = true
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("etcd metric line %q: %v", line, err)
		}
		n += v
	}
	if !found {
		t.Fatal("etcd's /metrics has no grpc_server_handled_total for Txn")
	}
	return n
}

// When most values changed, fetching them key by key would cost more than
// listing them all: the backstop falls back to a full listing, and still
// converges.
func TestBackstopDigestPollFullListingFallback(t *testing.T) {
	// Not parallel: see etcdTxns.
	etcd := etcdtest.Start(t)
	// The registrar reaches etcd through a proxy, so that all the changes
	// can be made while it cannot read, and its next backstop sees them
	// all at once: etcd's limit of 128 operations per transaction would
	// otherwise let it see them in parts small enough to fetch.
	px, err := faultproxy.Start(stripScheme(etcd.Endpoints()[0]))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	b := newDigestBackend(t, etcd)
	s, w := startPolling(t, b, []string{"http://" + px.Addr()})
	waitBackstops(t, s, 2)
	wantFetched(t, s, digestRegistrySize, "with nothing changed since start-up")

	px.Blackhole()
	var muts []etcdstore.Mutation
	for i := 0; i < digestRegistrySize; i++ {
		muts = append(muts, putEP(digestEP(i, func(ep *registryv1.ServiceEndpoint) { ep.Weight = 2 })))
	}
	b.apply(muts...)
	txns := etcdTxns(t, etcd)
	px.Heal()

	waitFor(t, "the registrar converges on the rewrite", 20*time.Second, func() bool { return b.diff(s.Registrar()) == "" })
	waitFor(t, "the watcher sees every update", 5*time.Second, func() bool { return len(w.changes()) >= digestRegistrySize })
	seen := map[string]bool{}
	for _, c := range w.changes() {
		if !strings.HasPrefix(c, "UPDATED ") || seen[c] {
			t.Fatalf("watcher saw %q among the rewrite's events; want one UPDATED per endpoint", c)
		}
		seen[c] = true
	}
	// Every value was read once, by one full listing: no values were read
	// a Txn at a time.
	wantFetched(t, s, 2*digestRegistrySize, "after rewriting every endpoint")
	if got := etcdTxns(t, etcd); got != txns {
		t.Fatalf("etcd answered %v Txns after the rewrite, want none: the backstop fetched values key by key instead of listing", got-txns)
	}
	if d := b.diff(s.Registrar()); d != "" {
		t.Fatalf("after further backstops the snapshot differs: %s", d)
	}
}

// The registrar's own writes need no fetching either: a flush records the
// revision each write landed at, including a flush that etcd's limit of
// 128 operations per transaction splits over several revisions.
func TestBackstopDigestKnowsItsOwnFlushes(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	s := startRegistrar(t, etcd.Endpoints(), func(o *server.Config) {
		o.SyncMode = registrar.SyncPoll
		o.SyncInterval = 100 * time.Millisecond
		o.SyncDebounce = 10 * time.Millisecond
		// One flush of the 300 below, started by their count rather than
		// by a timer that a loaded machine could let run out before the
		// last of them is queued: three transactions.
		o.WriteBatchInterval = time.Hour
		o.WriteBatchSize = 300
	})
	c := dial(t, s.GRPCAddr())
	register(t, c, ep("web", "10.1.0.1", 80)) // a leading-edge flush of one
	waitFor(t, "the first flush", 5*time.Second, func() bool { return s.Registrar().PendingWrites() == 0 })
	for i := range 300 {
		register(t, c, ep(fmt.Sprint("svc", i%7), fmt.Sprintf("10.2.%d.%d", i/250, i%250+1), 80))
	}
	waitFor(t, "the big flush", 10*time.Second, func() bool { return s.Registrar().PendingWrites() == 0 })
	if n, sum := metricValue(t, s.HTTPAddr(), "registrar_write_batch_size_count"), metricValue(t, s.HTTPAddr(), "registrar_write_batch_size_sum"); n != 2 || sum != 301 {
		t.Fatalf("%v flushes of %v writes in all; the test needs two, of 1 and 300", n, sum)
	}
	// The start-up listing of an empty registry read nothing, and neither
	// may any backstop since: every value is the registrar's own.
	wantFetched(t, s, 0, "after 301 registrations flushed by the registrar itself")
}
