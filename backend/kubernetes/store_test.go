package kubernetes

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/backend/backendtest"
	"github.com/aethermesh/aether/internal/faultproxy"
	"github.com/aethermesh/aether/internal/testutil/kubeapi"
	"github.com/aethermesh/aether/internal/testutil/wait"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/registry"
)

func testEndpoint(service string, i int, node string, hlc uint64, writer, cluster string) *registryv1.ServiceEndpoint {
	return &registryv1.ServiceEndpoint{
		Service: service, Protocol: registryv1.Protocol_PROTOCOL_HTTP1,
		Ip:    fmt.Sprintf("10.1.%d.%d", i>>8&0xff, i&0xff),
		Ports: []*registryv1.Port{{Name: "http", Port: 8080}},
		Node:  node, Cluster: cluster, Region: "r1", State: registryv1.State_STATE_SERVING, Weight: 1,
		Stamp: &registryv1.WriteStamp{Hlc: hlc, Writer: writer},
	}
}

func key(id registry.EndpointID) string { k, _ := id.Key(); return k }

func ctxFor(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func applyAll(t testing.TB, s *Store, muts ...backend.Mutation) []backend.Outcome {
	t.Helper()
	outs, err := s.ApplyOrdered(ctxFor(t, 30*time.Second), muts)
	if err != nil {
		t.Fatalf("ApplyOrdered: %v", err)
	}
	return outs
}

// TestConflictRaceCrossingStamps: two stores (two replicas) write one key
// at once, each with stamps that cross the other's and guesses that go
// stale with every write of the other, so their updates meet 409 Conflicts
// and their creates AlreadyExists. Per key the newest stamp must win: the
// object ends with the highest stamp, and the change feed of the key never
// shows a put stamped at or below one it showed before.
func TestConflictRaceCrossingStamps(t *testing.T) {
	srv := kubeapi.Start(t)
	ns := freshNamespace(t, srv.Clientset(t))
	a := openStore(t, srv, ns, nil)
	b := openStore(t, srv, ns, nil)
	id := registry.IDOf(testEndpoint("race", 1, "", 0, "", "c1"))
	base, err := a.List(ctxFor(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	feed := backendtest.Watch(t, a, base.Revision)

	const rounds = 40
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	var maxLanded [2]uint64
	var lastRev [2]int64 // the latest revision each writer landed at
	for w, s := range []*Store{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var keyRev, tombRev int64
			var seen uint64 // the newest stamp this writer has learned of
			for i := range rounds {
				// A's stamps are 10, 30, 50...; B's 20, 40, 60..., but B
				// runs them in an order that crosses A's: each writer's
				// i-th write is sometimes older than the other's
				// (i-1)-th.
				hlc := uint64(20*i + 10*(w+1))
				if w == 1 && i%3 == 0 && i > 0 {
					hlc -= 25
				}
				if hlc <= seen {
					// A writer that has learned of a newer write drops
					// its older ones, as the registrar's core does; its
					// guesses name what it learned, so sending an older
					// write with them would be a caller's error.
					continue
				}
				m := backend.Mutation{ID: id, KeyRev: keyRev, TombRev: tombRev}
				if i%5 == 4 {
					m.Stamp = &registryv1.WriteStamp{Hlc: hlc, Writer: fmt.Sprint(w)}
				} else {
					m.Endpoint = testEndpoint("race", 1, fmt.Sprintf("w%d-%d", w, i), hlc, fmt.Sprint(w), "c1")
				}
				outs, err := s.ApplyOrdered(context.Background(), []backend.Mutation{m})
				if err != nil {
					errs <- err
					return
				}
				o := outs[0]
				if !o.Settled() {
					continue // lost every round to the other: a caller retries later
				}
				keyRev, tombRev = o.KeyRev, o.TombRev
				seen = max(seen, hlc, o.CurrentStamp.GetHlc())
				if o.Landed && hlc > maxLanded[w] {
					maxLanded[w] = hlc
				}
				if o.Landed {
					lastRev[w] = max(lastRev[w], o.Revision)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	top := max(maxLanded[0], maxLanded[1])
	ep, rev, _, err := a.GetEndpoint(ctxFor(t, 30*time.Second), id)
	if err != nil {
		t.Fatal(err)
	}
	// The newest write may be a delete: then the tombstone holds its
	// stamp and the key is absent.
	obj, err := a.eps.Get(ctxFor(t, 30*time.Second), EndpointObjectName(key(id), id.Service), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d := decodeEndpointObject(obj)
	hlc, _, _ := unstructured.NestedInt64(obj.Object, "spec", "stamp", "hlc")
	if uint64(hlc) != top || (ep == nil) != d.tomb || (ep != nil && rev != d.rev) {
		t.Fatalf("after the race the object holds stamp %d (tombstone %v, endpoint %v at %d), want the newest landed %d", hlc, d.tomb, ep, rev, top)
	}
	// Wait for the last write, not for GetEndpoint's revision: that may be
	// a write to any other object of the API server, which the feed hears
	// of only with the next bookmark.
	bs := feed.UpTo(t, max(lastRev[0], lastRev[1]))
	backendtest.CheckOrder(t, bs, base.Revision)
	var last uint64
	for _, b := range bs {
		for _, e := range b.Events {
			if e.Endpoint == nil {
				continue
			}
			if h := e.Endpoint.GetStamp().GetHlc(); h <= last {
				t.Fatalf("the feed shows a put stamped %d after one stamped %d:%s", h, last, backendtest.DescribeBatches(bs))
			} else {
				last = h
			}
		}
	}
	conflicts := a.conflicts.Load() + b.conflicts.Load()
	if conflicts == 0 {
		t.Fatalf("no write met a conflict: the race did not happen")
	}
	t.Logf("%d writes each, %d conflicts re-read and decided again, newest stamp %d", rounds, conflicts, top)
}

// TestRestartSeesEverything: a new Store on the same API server (a
// restarted registrar) lists what the old one wrote at the same mod
// revisions, keeps honouring its tombstones, and resumes its feed.
func TestRestartSeesEverything(t *testing.T) {
	srv := kubeapi.Start(t)
	ns := freshNamespace(t, srv.Clientset(t))
	first := openStore(t, srv, ns, nil)
	var muts []backend.Mutation
	for i := range 20 {
		ep := testEndpoint("restart", i, "n", 100, "A", "c1")
		muts = append(muts, backend.Mutation{ID: registry.IDOf(ep), Endpoint: ep})
	}
	applyAll(t, first, muts...)
	gone := muts[3].ID
	applyAll(t, first, backend.Mutation{ID: gone, Stamp: &registryv1.WriteStamp{Hlc: 300, Writer: "A"}})
	before, err := first.List(ctxFor(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	open := backendtest.Watch(t, first, before.Revision)
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	// Close ends the store's watches (and waits for them).
	if _, closed := open.Snapshot(); !closed {
		wait.For(t, "the old store's watch to end with it", 5*time.Second, func() bool { _, closed := open.Snapshot(); return closed })
	}

	second := openStore(t, srv, ns, func(c *Config) { c.InstallCRDs = false })
	after, err := second.List(ctxFor(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if len(after.Endpoints) != 19 || len(after.Endpoints) != len(before.Endpoints) || after.Revision < before.Revision {
		t.Fatalf("after the restart: %d endpoints at %d, before %d at %d", len(after.Endpoints), after.Revision, len(before.Endpoints), before.Revision)
	}
	for i := range before.Endpoints {
		if !proto.Equal(before.Endpoints[i], after.Endpoints[i]) || before.EndpointRevs[i] != after.EndpointRevs[i] {
			t.Fatalf("endpoint %d differs across the restart", i)
		}
	}
	// A put stamped before the delete, flushed after the restart.
	stale := testEndpoint("restart", 3, "late", 200, "B", "c1")
	if o := applyAll(t, second, backend.Mutation{ID: gone, Endpoint: stale})[0]; !o.Superseded || o.CurrentStamp.GetHlc() != 300 {
		t.Fatalf("a write older than the tombstone after a restart: %+v, want superseded by the delete", o)
	}
	// The old store's listing revision resumes on the new one.
	feed := backendtest.Watch(t, second, before.Revision)
	fresh := testEndpoint("restart", 99, "n", 400, "B", "c1")
	o := applyAll(t, second, backend.Mutation{ID: registry.IDOf(fresh), Endpoint: fresh})[0]
	bs := feed.UpTo(t, o.Revision)
	backendtest.CheckOrder(t, bs, before.Revision)
	var evs []backend.Event
	for _, b := range bs {
		evs = append(evs, b.Events...)
	}
	if len(evs) != 1 || !proto.Equal(evs[0].Endpoint, fresh) || evs[0].Revision != o.Revision {
		t.Fatalf("feed resumed on the new store:%s", backendtest.DescribeBatches(bs))
	}
}

// proxied is srv's config through a fault proxy, which can cut the
// store's connections to the API server (TLS passes through it as bytes).
func proxied(t *testing.T, srv *kubeapi.Server) (*rest.Config, *faultproxy.Proxy) {
	t.Helper()
	cfg := rest.CopyConfig(srv.Config())
	u, err := url.Parse(cfg.Host)
	if err != nil {
		t.Fatal(err)
	}
	px, err := faultproxy.Start(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	u.Host = px.Addr()
	cfg.Host = u.String()
	if cfg.TLSClientConfig.ServerName == "" {
		cfg.TLSClientConfig.ServerName = "127.0.0.1"
	}
	return cfg, px
}

// TestCompactionWhileCutRelists: a registrar's watch is cut off from the
// API server while another replica writes and the API server's etcd is
// compacted past everything the watch saw. When the connection comes back
// the watch cannot resume (410 from the API server, or compaction found
// on resuming) and reports Compacted; the registrar then re-lists and
// holds what the other replica wrote, with its periodic re-list pushed out
// of the way so only the Compacted path can bring it.
func TestCompactionWhileCutRelists(t *testing.T) {
	srv := kubeapi.Start(t)
	ns := freshNamespace(t, srv.Clientset(t))
	other := openStore(t, srv, ns, nil)
	cfg, px := proxied(t, srv)
	mine := openStore(t, srv, ns, func(c *Config) { c.RESTConfig = cfg })

	// The store's own feed, and a registrar on it.
	l, err := mine.List(ctxFor(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	feed := backendtest.Watch(t, mine, l.Revision)
	opts := registrar.DefaultOptions()
	opts.ClusterName, opts.Region = "c1", "r1"
	opts.SyncInterval = time.Hour
	opts.SyncDebounce = 10 * time.Millisecond
	reg, err := registrar.New(opts, mine)
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Start(ctxFor(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Close(context.Background()) })
	seen := applyAll(t, other, backend.Mutation{ID: registry.IDOf(testEndpoint("web", 1, "n", 100, "B", "c2")), Endpoint: testEndpoint("web", 1, "n", 100, "B", "c2")})[0]
	feed.UpTo(t, seen.Revision)
	wait.For(t, "the registrar to hold the first foreign endpoint", 15*time.Second, func() bool {
		eps, _, _ := reg.List(nil)
		return len(eps) == 1
	})

	px.Cut()
	foreign := testEndpoint("web", 2, "n", 200, "B", "c2")
	outs := applyAll(t, other,
		backend.Mutation{ID: registry.IDOf(foreign), Endpoint: foreign},
		backend.Mutation{ID: registry.IDOf(testEndpoint("web", 1, "", 0, "", "c2")), Stamp: &registryv1.WriteStamp{Hlc: 200, Writer: "B"}})
	top := max(outs[0].Revision, outs[1].Revision)
	compactAPIServer(t, srv.EtcdClient(t), other, top)
	px.Heal()

	wait.For(t, "the cut-off watch to report compaction", 30*time.Second, func() bool { _, closed := feed.Snapshot(); return closed })
	bs, _ := feed.Snapshot()
	if last := bs[len(bs)-1]; !last.Compacted || last.Revision < seen.Revision || last.Revision >= top {
		t.Fatalf("feed after the compaction:%s\nwant it to end with one Compacted batch at the last revision delivered", backendtest.DescribeBatches(bs))
	}
	wait.ForState(t, "the registrar to re-list and hold what was written while it was cut off", 30*time.Second, func() (bool, string) {
		eps, _, _ := reg.List(nil)
		return len(eps) == 1 && proto.Equal(eps[0], foreign), fmt.Sprint(eps)
	})
	// And a relisted consumer's feed goes on from the new listing.
	l, err = mine.List(ctxFor(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Endpoints) != 1 || l.Revision < top {
		t.Fatalf("relisting after compaction: %d endpoints at %d", len(l.Endpoints), l.Revision)
	}
}

// TestTombstoneCollection: tombstones older than the TTL are collected
// (the object is gone), younger ones stay, and neither ever shows as a
// record.
func TestTombstoneCollection(t *testing.T) {
	srv := kubeapi.Start(t)
	ns := freshNamespace(t, srv.Clientset(t))
	s := openStore(t, srv, ns, func(c *Config) { c.GCInterval = -1 })
	var clock struct {
		sync.Mutex
		t time.Time
	}
	clock.t = time.Now()
	s.now = func() time.Time { clock.Lock(); defer clock.Unlock(); return clock.t }
	old, young := testEndpoint("gc", 1, "n", 100, "A", "c1"), testEndpoint("gc", 2, "n", 100, "A", "c1")
	applyAll(t, s, backend.Mutation{ID: registry.IDOf(old), Endpoint: old}, backend.Mutation{ID: registry.IDOf(young), Endpoint: young})
	applyAll(t, s, backend.Mutation{ID: registry.IDOf(old), Stamp: &registryv1.WriteStamp{Hlc: 200, Writer: "A"}})
	clock.Lock()
	clock.t = clock.t.Add(TombstoneTTL / 2)
	clock.Unlock()
	applyAll(t, s, backend.Mutation{ID: registry.IDOf(young), Stamp: &registryv1.WriteStamp{Hlc: 200, Writer: "A"}})
	clock.Lock()
	clock.t = clock.t.Add(TombstoneTTL/2 + time.Second)
	clock.Unlock()
	n, err := s.collect(ctxFor(t, 30*time.Second))
	if err != nil || n != 1 {
		t.Fatalf("collect = %d, %v; want the one tombstone older than %v", n, err, TombstoneTTL)
	}
	objs, err := s.eps.List(ctxFor(t, 30*time.Second), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(objs.Items) != 1 || objs.Items[0].GetLabels()[LabelTombstone] != "true" {
		t.Fatalf("after collection %d objects remain, want the young tombstone", len(objs.Items))
	}
	if l, err := s.List(ctxFor(t, 30*time.Second)); err != nil || len(l.Endpoints) != 0 {
		t.Fatalf("List after deletes: %d endpoints, %v", len(l.Endpoints), err)
	}
}

// TestListOvertakenByCompaction: a listing pages at its first page's
// revision; when that revision is compacted between pages (the API server
// answers the continue token with 410), List starts over and returns a
// listing at a later revision with everything in it. (That it gives up
// with backend.ErrCompacted after maxListAttempts is not run here: each
// compaction waits for the API server's 15 s compaction poll.)
func TestListOvertakenByCompaction(t *testing.T) {
	srv := kubeapi.Start(t)
	ns := freshNamespace(t, srv.Clientset(t))
	s := openStore(t, srv, ns, func(c *Config) { c.PageSize = 2 })
	var muts []backend.Mutation
	for i := range 6 {
		ep := testEndpoint("pages", i, "n", 100, "A", "c1")
		muts = append(muts, backend.Mutation{ID: registry.IDOf(ep), Endpoint: ep})
	}
	applyAll(t, s, muts...)

	compactions, written := 0, 0
	s.afterPage = func(ctx context.Context, page int) {
		if page != 0 || compactions > 0 {
			return
		}
		compactions++
		written++
		// A write after the listing's revision, then compaction past it.
		ep := testEndpoint("pages", 10+written, "n", 100, "A", "c1")
		o := applyAll(t, s, backend.Mutation{ID: registry.IDOf(ep), Endpoint: ep})[0]
		compactAPIServer(t, srv.EtcdClient(t), s, o.Revision)
	}
	l, err := s.List(ctxFor(t, 3*time.Minute))
	if err != nil {
		t.Fatalf("List overtaken once: %v", err)
	}
	if compactions != 1 || len(l.Endpoints) != 7 {
		t.Fatalf("List after %d compactions: %d endpoints at %d, want the 7 of the later revision", compactions, len(l.Endpoints), l.Revision)
	}
}
