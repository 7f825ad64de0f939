package etcd

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/faultproxy"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/registry"
)

func TestWatchDeliversPutsAndDeletesInOrder(t *testing.T) {
	etcd := etcdtest.Start(t)
	s, _ := newStore(t, etcd.Client(t), Options{})
	a, b := endpoint("svc", 1, 1), endpoint("svc", 2, 1)
	a2 := endpoint("svc", 1, 2)
	start := mustApply(t, s, put(endpoint("svc", 9, 1))) // before the watch: not delivered

	w := startWatch(t, s, start)
	r1 := mustApply(t, s, put(a))
	r2 := mustApply(t, s, put(b))
	r3 := mustApply(t, s, put(a2))
	r4 := mustApply(t, s, del(a))
	w.waitRevision(r4)

	bs, _ := w.snapshot()
	checkStream(t, bs, start)
	evs := w.events()
	want := []Event{
		{ID: registry.IDOf(a), Endpoint: a, Revision: r1},
		{ID: registry.IDOf(b), Endpoint: b, Revision: r2},
		{ID: registry.IDOf(a), Endpoint: a2, Revision: r3},
		{ID: registry.IDOf(a), Revision: r4},
	}
	if len(evs) != len(want) {
		t.Fatalf("got %d events, want %d:%s", len(evs), len(want), describe(bs))
	}
	for i := range want {
		if evs[i].ID != want[i].ID || evs[i].Revision != want[i].Revision ||
			(evs[i].Endpoint == nil) != (want[i].Endpoint == nil) ||
			(want[i].Endpoint != nil && !sameEndpoint(evs[i].Endpoint, want[i].Endpoint)) {
			t.Fatalf("event %d = %+v, want %+v", i, evs[i], want[i])
		}
	}
}

func TestWatchDeliversATxnInOneBatch(t *testing.T) {
	etcd := etcdtest.Start(t)
	s, _ := newStore(t, etcd.Client(t), Options{})
	start := currentRev(t, s.Client())
	w := startWatch(t, s, start)

	var muts []Mutation
	for i := range 5 {
		muts = append(muts, put(endpoint("svc", i, 1)))
	}
	rev := mustApply(t, s, muts...)
	w.waitRevision(rev)
	bs, _ := w.snapshot()
	if len(bs) != 1 || len(bs[0].Events) != 5 || bs[0].Revision != rev {
		t.Fatalf("want one batch of 5 events at %d:%s", rev, describe(bs))
	}
	for _, e := range bs[0].Events {
		if e.Revision != rev {
			t.Fatalf("event at %d, want %d", e.Revision, rev)
		}
	}
}

func TestWatchReplaysHistoryAfterRevision(t *testing.T) {
	etcd := etcdtest.Start(t)
	s, _ := newStore(t, etcd.Client(t), Options{})
	r1 := mustApply(t, s, put(endpoint("svc", 1, 1)))
	r2 := mustApply(t, s, put(endpoint("svc", 2, 1)))
	r3 := mustApply(t, s, del(endpoint("svc", 1, 1)))

	// Watching from r1 yields exactly what came after it.
	w := startWatch(t, s, r1)
	w.waitRevision(r3)
	bs, _ := w.snapshot()
	checkStream(t, bs, r1)
	evs := w.events()
	if len(evs) != 2 || evs[0].Revision != r2 || evs[1].Revision != r3 || evs[1].Endpoint != nil {
		t.Fatalf("want put@%d del@%d:%s", r2, r3, describe(bs))
	}
}

func TestWatchSkipsOtherRecordsAndTurnsGarbageIntoRemoval(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	s, logs := newStore(t, cli, Options{})
	ctx := testCtx(t)
	a := endpoint("svc", 1, 1)
	start := mustApply(t, s, put(a))
	w := startWatch(t, s, start)

	// A node record under Root: a node event, no endpoint event.
	nodeVal, err := registry.EncodeNode(&registryv1.Node{Name: "node-1", Region: "r1", Cluster: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	node, err := cli.Put(ctx, "/aether/v1/regions/r1/clusters/c1/nodes/node-1", string(nodeVal))
	if err != nil {
		t.Fatal(err)
	}
	w.waitRevision(node.Header.Revision)
	if evs := w.events(); len(evs) != 0 {
		t.Fatalf("node record produced endpoint events: %+v", evs)
	}
	var nodeEvents []NodeEvent
	bs0, _ := w.snapshot()
	for _, b := range bs0 {
		nodeEvents = append(nodeEvents, b.Nodes...)
	}
	if len(nodeEvents) != 1 || nodeEvents[0].Node.GetName() != "node-1" || nodeEvents[0].Revision != node.Header.Revision {
		t.Fatalf("node events = %+v", nodeEvents)
	}

	// Garbage over a valid endpoint: List would leave it out, so the watch
	// reports it gone rather than keep the stale value.
	bad, err := cli.Put(ctx, v1Key(a), "\xff\xff garbage")
	if err != nil {
		t.Fatal(err)
	}
	// A malformed endpoint key has no identity to report: skipped.
	if _, err := cli.Put(ctx, "/aether/v1/regions/r1/clusters/c1/services/svc/protocols/quic/endpoints/10.0.0.9", "x"); err != nil {
		t.Fatal(err)
	}
	last := mustApply(t, s, put(endpoint("svc", 2, 1)))
	w.waitRevision(last)

	bs, _ := w.snapshot()
	checkStream(t, bs, start)
	evs := w.events()
	if len(evs) != 2 || evs[0].ID != registry.IDOf(a) || evs[0].Endpoint != nil || evs[0].Revision != bad.Header.Revision || evs[1].Revision != last {
		t.Fatalf("want removal of a@%d then put@%d:%s", bad.Header.Revision, last, describe(bs))
	}
	if out := logs.String(); !strings.Contains(out, "treating it as removed") || !strings.Contains(out, "malformed endpoint key") {
		t.Fatalf("skips not logged:\n%s", out)
	}
	if l, err := s.List(ctx); err != nil || len(l.Endpoints) != 1 || l.Skipped != 2 || len(l.Nodes) != 1 {
		t.Fatalf("List agrees? endpoints=%d nodes=%d skipped=%d err=%v; want 1 endpoint, 1 node, 2 skipped", len(l.Endpoints), len(l.Nodes), l.Skipped, err)
	}
}

func TestWatchProgressNotification(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	s, _ := newStore(t, cli, Options{})
	ctx := testCtx(t)
	start := mustApply(t, s, put(endpoint("svc", 1, 1)))
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch := s.Watch(wctx, start)

	// Writes outside Root advance the store but not the watch.
	resp, err := cli.Put(ctx, "/elsewhere", "x")
	if err != nil {
		t.Fatal(err)
	}
	// etcd's periodic progress interval is 10 minutes; ask for one. The
	// request must name the watch's gRPC stream, which clientv3 keys by
	// the context metadata that WithRequireLeader adds.
	deadline := time.After(10 * time.Second)
	for {
		if err := cli.RequestProgress(clientv3.WithRequireLeader(wctx)); err != nil {
			t.Fatal(err)
		}
		select {
		case b := <-ch:
			if len(b.Events) != 0 || b.Compacted {
				t.Fatalf("unexpected batch %+v", b)
			}
			if b.Revision < resp.Header.Revision {
				continue // an earlier notification
			}
			if b.Revision != resp.Header.Revision {
				t.Fatalf("progress revision = %d, want %d", b.Revision, resp.Header.Revision)
			}
			return
		case <-time.After(200 * time.Millisecond):
		case <-deadline:
			t.Fatal("no progress notification")
		}
	}
}

// TestWatchResumesAcrossCutWithoutGapOrDuplicate breaks the TCP path to etcd
// while changes are being made, as a registrar sees when the network blips.
func TestWatchResumesAcrossCutWithoutGapOrDuplicate(t *testing.T) {
	etcd := etcdtest.Start(t)
	direct, _ := newStore(t, etcd.Client(t), Options{})
	px, err := faultproxy.Start(etcd.ClientAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = px.Close() })
	s, _ := newStore(t, etcdtest.NewClient(t, px.Addr()), Options{})

	start := currentRev(t, direct.Client())
	w := startWatch(t, s, start)
	var revs []int64
	write := func(i int) {
		ep := endpoint("svc", i%7, i) // same keys rewritten: revisions, not keys, must line up
		m := put(ep)
		if i%5 == 4 {
			m = del(ep)
		}
		// Deleting an absent key commits no revision and no event.
		if rev := mustApply(t, direct, m); len(revs) == 0 || rev > revs[len(revs)-1] {
			revs = append(revs, rev)
		}
	}
	for i := range 5 {
		write(i)
	}
	w.waitRevision(revs[len(revs)-1])

	for round := range 3 {
		px.Cut()
		for i := range 10 {
			write(100*(round+1) + i)
		}
		time.Sleep(100 * time.Millisecond) // let the client notice and retry against the cut
		px.Heal()
		for i := range 3 {
			write(100*(round+1) + 50 + i)
		}
		w.waitRevision(revs[len(revs)-1])
	}

	bs, closed := w.snapshot()
	if closed {
		t.Fatal("watch closed")
	}
	checkStream(t, bs, start)
	evs := w.events()
	if len(evs) != len(revs) {
		t.Fatalf("got %d events, want %d (one per committed write):%s", len(evs), len(revs), describe(bs))
	}
	for i, e := range evs {
		if e.Revision != revs[i] {
			t.Fatalf("event %d at revision %d, want %d:%s", i, e.Revision, revs[i], describe(bs))
		}
	}
}

// TestWatchCompactedWhileDisconnected: the history the watch would resume
// from is compacted while it cannot reach etcd, so it must say so and stop.
func TestWatchCompactedWhileDisconnected(t *testing.T) {
	etcd := etcdtest.Start(t)
	direct, _ := newStore(t, etcd.Client(t), Options{})
	px, err := faultproxy.Start(etcd.ClientAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = px.Close() })
	s, logs := newStore(t, etcdtest.NewClient(t, px.Addr()), Options{})
	ctx := testCtx(t)

	start := currentRev(t, direct.Client())
	w := startWatch(t, s, start)
	r1 := mustApply(t, direct, put(endpoint("svc", 1, 1)))
	w.waitRevision(r1)

	px.Cut()
	mustApply(t, direct, put(endpoint("svc", 2, 1)))
	r3 := mustApply(t, direct, put(endpoint("svc", 3, 1)))
	if _, err := direct.Client().Compact(ctx, r3); err != nil {
		t.Fatal(err)
	}
	px.Heal()

	w.waitFor("a Compacted batch and a closed channel", 15*time.Second, func(bs []WatchBatch, closed bool) bool { return closed })
	bs, _ := w.snapshot()
	last := bs[len(bs)-1]
	if !last.Compacted || last.Revision != r1 || len(last.Events) != 0 {
		t.Fatalf("last batch = %+v, want Compacted at the last delivered revision %d:%s", last, r1, describe(bs))
	}
	for _, b := range bs[:len(bs)-1] {
		if b.Compacted {
			t.Fatalf("more than one Compacted batch:%s", describe(bs))
		}
	}
	if !strings.Contains(logs.String(), "compacted") {
		t.Error("compaction not logged")
	}
}

func TestWatchFromCompactedRevision(t *testing.T) {
	etcd := etcdtest.Start(t)
	s, _ := newStore(t, etcd.Client(t), Options{})
	r1 := mustApply(t, s, put(endpoint("svc", 1, 1)))
	r2 := mustApply(t, s, put(endpoint("svc", 2, 1)))
	if _, err := s.Client().Compact(testCtx(t), r2); err != nil {
		t.Fatal(err)
	}
	w := startWatch(t, s, r1-1)
	w.waitFor("close", 10*time.Second, func(_ []WatchBatch, closed bool) bool { return closed })
	bs, _ := w.snapshot()
	if len(bs) != 1 || !bs[0].Compacted || bs[0].Revision != r1-1 {
		t.Fatalf("want a single Compacted batch at %d:%s", r1-1, describe(bs))
	}
}

// flakyWatcher wraps the client's real Watcher: every etcd watch it opens
// ends after a few responses, and replays some history from before the
// revision asked for, as a resume can. The Store must re-establish and drop
// the replayed part.
type flakyWatcher struct {
	clientv3.Watcher
	after  int   // responses before each watch ends
	replay int64 // revisions to start early by

	mu     sync.Mutex
	opened int
	wg     sync.WaitGroup
}

func (f *flakyWatcher) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	f.mu.Lock()
	f.opened++
	f.mu.Unlock()
	rev := clientv3.OpGet(key, opts...).Rev()
	if early := rev - f.replay; early > 1 {
		opts = append(opts, clientv3.WithRev(early))
	}
	ictx, cancel := context.WithCancel(ctx)
	in := f.Watcher.Watch(ictx, key, opts...)
	out := make(chan clientv3.WatchResponse)
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		defer close(out)
		defer cancel()
		for n := 0; n < f.after; {
			r, ok := <-in
			if !ok {
				return
			}
			select {
			case out <- r:
			case <-ctx.Done():
				return
			}
			if len(r.Events) > 0 {
				n++
			}
		}
	}()
	return out
}

func (f *flakyWatcher) watches() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.opened
}

func TestWatchReestablishesWithoutGapOrDuplicate(t *testing.T) {
	etcd := etcdtest.Start(t)
	direct, _ := newStore(t, etcd.Client(t), Options{})
	cli := etcd.Client(t)
	fw := &flakyWatcher{Watcher: cli.Watcher, after: 3, replay: 4}
	cli.Watcher = fw
	s, logs := newStore(t, cli, Options{})

	start := currentRev(t, cli)
	w := startWatch(t, s, start)
	var revs []int64
	for i := range 30 {
		ep := endpoint("svc", i%4, i)
		m := put(ep)
		if i%3 == 2 {
			m = del(ep)
		}
		// Deleting an absent key commits no revision and no event.
		if rev := mustApply(t, direct, m); len(revs) == 0 || rev > revs[len(revs)-1] {
			revs = append(revs, rev)
		}
		// Waiting makes each write its own etcd response, so the flaky
		// watcher's budget runs out a predictable number of times; each
		// re-opened watch then replays several revisions in one response.
		w.waitRevision(revs[len(revs)-1])
	}
	w.waitRevision(revs[len(revs)-1])

	bs, _ := w.snapshot()
	checkStream(t, bs, start)
	evs := w.events()
	if len(evs) != len(revs) {
		t.Fatalf("got %d events, want %d:%s", len(evs), len(revs), describe(bs))
	}
	for i, e := range evs {
		if e.Revision != revs[i] {
			t.Fatalf("event %d at %d, want %d:%s", i, e.Revision, revs[i], describe(bs))
		}
	}
	if fw.watches() < 5 {
		t.Fatalf("only %d etcd watches opened; the test did not break any", fw.watches())
	}
	if !strings.Contains(logs.String(), "re-establishing") {
		t.Error("re-establishment not logged at warn")
	}
	w.Stop()
	fw.wg.Wait()
}

func TestWatchClosesWhenContextEndsEvenIfNobodyReads(t *testing.T) {
	etcd := etcdtest.Start(t)
	s, _ := newStore(t, etcd.Client(t), Options{})
	start := currentRev(t, s.Client())
	ctx, cancel := context.WithCancel(context.Background())
	ch := s.Watch(ctx, start)
	// Changes pile up behind a consumer that never reads.
	for i := range 5 {
		mustApply(t, s, put(endpoint("svc", i, 1)))
	}
	time.Sleep(100 * time.Millisecond)
	cancel()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-timeout:
			t.Fatal("watch channel still open 5s after ctx ended")
		}
	}
}

func TestWatchEndsWhenClientCloses(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcdtest.NewClient(t, etcd.Endpoints()...)
	s, logs := newStore(t, cli, Options{})
	w := startWatch(t, s, currentRev(t, cli))
	_ = cli.Close()
	w.waitFor("close", 5*time.Second, func(_ []WatchBatch, closed bool) bool { return closed })
	if !strings.Contains(logs.String(), "client closed") {
		t.Errorf("closing not logged: %s", logs.String())
	}
}

func TestWatchSurvivesEtcdRestart(t *testing.T) {
	etcd := etcdtest.Start(t)
	s, _ := newStore(t, etcd.Client(t), Options{})
	start := currentRev(t, s.Client())
	w := startWatch(t, s, start)
	r1 := mustApply(t, s, put(endpoint("svc", 1, 1)))
	w.waitRevision(r1)

	etcd.Restart(t)
	writer, _ := newStore(t, etcd.Client(t), Options{})
	var revs []int64
	for i := range 3 {
		revs = append(revs, mustApply(t, writer, put(endpoint("svc", i, 2))))
	}
	w.waitRevision(revs[2])
	bs, _ := w.snapshot()
	checkStream(t, bs, start)
	if got := fmt.Sprint(revisionsOf(w.events())); got != fmt.Sprint(append([]int64{r1}, revs...)) {
		t.Fatalf("event revisions %s, want %v", got, append([]int64{r1}, revs...))
	}
}

func revisionsOf(evs []Event) []int64 {
	var out []int64
	for _, e := range evs {
		out = append(out, e.Revision)
	}
	return out
}

// TestWatchCatchUpRevisionNeverRunsAhead replays more history than etcd
// sends in one response (1000 revisions). etcd stamps every chunk of such a
// catch-up with the current store revision, so a batch Revision taken from
// the header would claim revisions whose events are still to come, and a
// consumer resuming or filtering by it would lose them.
func TestWatchCatchUpRevisionNeverRunsAhead(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	s, _ := newStore(t, cli, Options{})
	ctx := testCtx(t)
	start := currentRev(t, cli)

	const n = 1200
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 8 {
				ep := endpoint("svc", i, 1)
				if _, err := cli.Put(ctx, v1Key(ep), mustEncode(t, ep)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	end := currentRev(t, cli)
	if end != start+n {
		t.Fatalf("revision %d, want %d", end, start+n)
	}

	w := startWatch(t, s, start)
	w.waitRevision(end)
	bs, _ := w.snapshot()
	checkStream(t, bs, start)
	total := 0
	for i, b := range bs {
		if len(b.Events) > 0 && b.Revision != b.Events[len(b.Events)-1].Revision {
			t.Fatalf("batch %d of %d events claims revision %d but its last event is at %d", i, len(b.Events), b.Revision, b.Events[len(b.Events)-1].Revision)
		}
		total += len(b.Events)
	}
	if total != n {
		t.Fatalf("got %d events in %d batches, want %d", total, len(bs), n)
	}
	if len(bs) < 2 {
		t.Fatalf("history came in %d batch(es); the test needs etcd to split it", len(bs))
	}
}
