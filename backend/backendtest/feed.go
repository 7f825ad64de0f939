package backendtest

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/internal/testutil/wait"
	"github.com/aethermesh/aether/registry"
)

// watchTimeout bounds how long a change may take to reach a watcher.
const watchTimeout = 15 * time.Second

// Collector reads a Watch in the background, for the suite and for a
// backend's own feed tests, so that every feed is read and checked the same
// way.
type Collector struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	batches []backend.WatchBatch
	closed  bool
}

// Watch starts collecting w's feed after revision after; the collection
// stops, and its goroutine is joined, when the test ends.
func Watch(t T, w backend.Watcher, after int64) *Collector {
	ctx, cancel := context.WithCancel(context.Background())
	c := &Collector{cancel: cancel, done: make(chan struct{})}
	ch := w.Watch(ctx, after)
	go func() {
		defer close(c.done)
		for b := range ch {
			c.mu.Lock()
			c.batches = append(c.batches, b)
			c.mu.Unlock()
		}
		c.mu.Lock()
		c.closed = true
		c.mu.Unlock()
	}()
	t.Cleanup(c.Stop)
	return c
}

// Stop ends the watch and waits for the feed to close.
func (c *Collector) Stop() { c.cancel(); <-c.done }

// Snapshot is what the feed delivered so far, and whether it has closed.
func (c *Collector) Snapshot() ([]backend.WatchBatch, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]backend.WatchBatch(nil), c.batches...), c.closed
}

// UpTo waits until the watcher is known current up to rev, and returns
// what it got.
func (c *Collector) UpTo(t T, rev int64) []backend.WatchBatch {
	t.Helper()
	wait.For(t, fmt.Sprintf("the watch to reach revision %d", rev), watchTimeout, func() bool {
		bs, closed := c.Snapshot()
		return closed || (len(bs) > 0 && bs[len(bs)-1].Revision >= rev)
	})
	bs, closed := c.Snapshot()
	if closed && (len(bs) == 0 || bs[len(bs)-1].Revision < rev) {
		t.Fatalf("the watch closed before revision %d:%s", rev, DescribeBatches(bs))
	}
	return bs
}

// DescribeBatches renders a feed for a failure message.
func DescribeBatches(bs []backend.WatchBatch) string {
	var sb strings.Builder
	for _, b := range bs {
		fmt.Fprintf(&sb, "\n  rev=%d compacted=%v [", b.Revision, b.Compacted)
		for i, e := range b.Events {
			if i > 0 {
				sb.WriteString(" ")
			}
			op := "put"
			if e.Endpoint == nil {
				op = "del"
			}
			fmt.Fprintf(&sb, "%s:%s/%s@%d", op, e.ID.Service, e.ID.IP, e.Revision)
		}
		for _, n := range b.Nodes {
			op := "put"
			if n.Node == nil {
				op = "del"
			}
			fmt.Fprintf(&sb, " node-%s:%s@%d", op, n.ID.Name, n.Revision)
		}
		sb.WriteString("]")
	}
	return sb.String()
}

// checkFeed is CheckOrder on a store that nothing compacted, where a
// Compacted batch is itself a failure.
func checkFeed(t T, bs []backend.WatchBatch, after int64) {
	t.Helper()
	for i, b := range bs {
		if b.Compacted {
			t.Fatalf("batch %d is Compacted on a store nothing compacted:%s", i, DescribeBatches(bs))
		}
	}
	CheckOrder(t, bs, after)
}

// CheckOrder asserts what every consumer of a feed relies on: batch
// revisions never decrease, event revisions increase across batches and
// are within (after, batch revision], no revision's events are split over
// batches, and nothing is delivered twice.
func CheckOrder(t T, bs []backend.WatchBatch, after int64) {
	t.Helper()
	last, lastEv := after, after
	for i, b := range bs {
		if b.Revision < last {
			t.Fatalf("batch %d revision %d below the previous %d:%s", i, b.Revision, last, DescribeBatches(bs))
		}
		for j, e := range b.Events {
			if e.Revision <= after || e.Revision > b.Revision {
				t.Fatalf("batch %d event %d at %d, outside (%d, %d]:%s", i, j, e.Revision, after, b.Revision, DescribeBatches(bs))
			}
			if e.Revision < lastEv || (j == 0 && i > 0 && e.Revision == lastEv) {
				t.Fatalf("batch %d event %d at %d, not after %d (out of order, repeated, or a revision split over batches):%s",
					i, j, e.Revision, lastEv, DescribeBatches(bs))
			}
			lastEv = e.Revision
		}
		last = b.Revision
	}
}

func eventsOf(bs []backend.WatchBatch) []backend.Event {
	var evs []backend.Event
	for _, b := range bs {
		evs = append(evs, b.Events...)
	}
	return evs
}

// expectEvents compares a feed's endpoint events with the writes that
// landed, in order.
func expectEvents(t T, what string, got []backend.Event, want []backend.Event, bs []backend.WatchBatch) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d events, want %d:%s", what, len(got), len(want), DescribeBatches(bs))
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.ID != w.ID || g.Revision != w.Revision || (g.Endpoint == nil) != (w.Endpoint == nil) ||
			(w.Endpoint != nil && !proto.Equal(g.Endpoint, w.Endpoint)) {
			t.Fatalf("%s: event %d is %s@%d (put %v), want %s@%d (put %v):%s", what, i, g.ID, g.Revision, g.Endpoint != nil,
				w.ID, w.Revision, w.Endpoint != nil, DescribeBatches(bs))
		}
	}
}

// landedEvents are the endpoint events a feed must report for muts:
// every landed put, and every landed delete of a key that was present.
func landedEvents(muts []backend.Mutation, outs []backend.Outcome, present map[registry.EndpointID]bool) []backend.Event {
	var evs []backend.Event
	for i, o := range outs {
		if !o.Landed {
			continue
		}
		m := muts[i]
		if m.Endpoint == nil && !present[m.ID] {
			continue
		}
		present[m.ID] = m.Endpoint != nil
		evs = append(evs, backend.Event{ID: m.ID, Endpoint: m.Endpoint, Revision: o.Revision})
	}
	// A store that lands a batch's mutations each at its own revision
	// may land them in any order; the feed is in revision order.
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].Revision < evs[j].Revision })
	return evs
}

// RunWatchResumesWithoutGap: a watch from a listing's revision delivers
// every later change exactly once, in order, a write's changes together;
// a watch from any revision it reported resumes there without gap or
// repeat; a watch from an older revision replays the history since; and
// the listing plus the events is the store's next listing.
func RunWatchResumesWithoutGap(t T, f Factory) {
	s := f.New(t)
	w, ok := s.(backend.Watcher)
	if !ok {
		t.Fatalf("the store under test offers no Watcher; RunWatchResumesWithoutGap does not apply to it")
	}
	present := map[registry.EndpointID]bool{}
	pre := []backend.Mutation{put(endpoint("watch", 90, 1, 10, "A")), put(endpoint("watch", 91, 1, 10, "A"))}
	landedEvents(pre, apply(t, s, pre...), present)
	base := list(t, s)
	c := Watch(t, w, base.Revision)

	// The writes: puts, an update, deletes (one of a present key, one of
	// an absent key, which changes no endpoint), a batch of several keys,
	// and a write that is superseded and must not show.
	steps := [][]backend.Mutation{
		{put(endpoint("watch", 1, 1, 100, "A"))},
		{put(endpoint("watch", 2, 1, 100, "A"))},
		{put(endpoint("watch", 1, 2, 200, "A"))},
		{del(registry.IDOf(endpoint("watch", 90, 0, 0, "")), 200, "A")},
		{put(endpoint("watch", 3, 1, 200, "A")), put(endpoint("watch", 4, 1, 200, "A")), del(registry.IDOf(endpoint("watch", 2, 0, 0, "")), 200, "A")},
		{put(endpoint("watch", 1, 3, 150, "A"))}, // older than what the key holds
		{del(registry.IDOf(endpoint("watch", 77, 0, 0, "")), 300, "A")},
		{put(endpoint("watch", 5, 1, 300, "A")), put(endpoint("watch", 91, 2, 300, "A"))},
	}
	var want []backend.Event
	var revs []int64 // the revision each step's events are at
	for _, muts := range steps {
		evs := landedEvents(muts, apply(t, s, muts...), present)
		want = append(want, evs...)
		if len(evs) > 0 {
			revs = append(revs, evs[0].Revision)
		}
	}
	// A fence: once the watch has reached it, everything before it that
	// the watch was ever going to deliver has been delivered.
	fence := []backend.Mutation{put(endpoint("watch", 99, 1, 400, "A"))}
	fenceEvs := landedEvents(fence, apply(t, s, fence...), present)
	fenceRev := fenceEvs[0].Revision

	bs := c.UpTo(t, fenceRev)
	checkFeed(t, bs, base.Revision)
	expectEvents(t, "watch from the listing", eventsOf(bs), append(append([]backend.Event(nil), want...), fenceEvs...), bs)
	// A write of several keys arrives together: no revision's events are
	// split over two batches (a batch may carry several revisions).
	batchOf := map[int64]int{}
	for i, b := range bs {
		for _, e := range b.Events {
			if j, seen := batchOf[e.Revision]; seen && j != i {
				t.Fatalf("revision %d's events are split over batches %d and %d:%s", e.Revision, j, i, DescribeBatches(bs))
			}
			batchOf[e.Revision] = i
		}
	}
	c.Stop()

	// The listing plus the events is the store's state.
	state := map[registry.EndpointID]*registryv1.ServiceEndpoint{}
	for _, ep := range base.Endpoints {
		state[registry.IDOf(ep)] = ep
	}
	for _, e := range eventsOf(bs) {
		if e.Endpoint == nil {
			delete(state, e.ID)
		} else {
			state[e.ID] = e.Endpoint
		}
	}
	final := list(t, s)
	if len(final.Endpoints) != len(state) {
		t.Fatalf("listing plus events holds %d endpoints, the store lists %s", len(state), describeListing(final))
	}
	for _, ep := range final.Endpoints {
		if !proto.Equal(state[registry.IDOf(ep)], ep) {
			t.Fatalf("listing plus events disagrees with the store on %s", registry.IDOf(ep))
		}
	}

	// Resume from revisions the feed reported: exactly what came after.
	for _, mid := range []int64{revs[1], revs[3], bs[len(bs)-1].Revision} {
		c := Watch(t, w, mid)
		if mid >= fenceRev {
			// Nothing after the fence yet: write once more to see
			// that nothing before it comes again.
			more := []backend.Mutation{put(endpoint("watch", 98, 1, 500, "A"))}
			moreEvs := landedEvents(more, apply(t, s, more...), present)
			got := c.UpTo(t, moreEvs[0].Revision)
			checkFeed(t, got, mid)
			expectEvents(t, fmt.Sprintf("watch resumed at %d", mid), eventsOf(got), moreEvs, got)
			c.Stop()
			continue
		}
		got := c.UpTo(t, fenceRev)
		checkFeed(t, got, mid)
		var after []backend.Event
		for _, e := range append(append([]backend.Event(nil), want...), fenceEvs...) {
			if e.Revision > mid {
				after = append(after, e)
			}
		}
		expectEvents(t, fmt.Sprintf("watch resumed at %d", mid), eventsOf(got), after, got)
		c.Stop()
	}
}

// RunDigest: a keys-and-revisions digest read in parts is the listing's
// keys and mod revisions at one revision, Between runs between the parts
// and an error from it ends the read.
func RunDigest(t T, f Factory) {
	s := f.New(t)
	d, ok := s.(backend.Digester)
	if !ok {
		t.Fatalf("the store under test offers no Digester; RunDigest does not apply to it")
	}
	ctx := testCtx(t)
	var muts []backend.Mutation
	for i := range 12 {
		muts = append(muts, put(endpoint(fmt.Sprintf("dig-%d", i%4), i, 1, 100, "A")))
	}
	apply(t, s, muts[:5]...)
	apply(t, s, muts[5:]...)
	apply(t, s, put(endpoint("dig-1", 1, 2, 200, "A")), del(muts[2].ID, 200, "A"))
	if ls, ok := s.(backend.Leases); ok {
		lease, err := ls.GrantLease(ctx, time.Minute)
		if err != nil {
			t.Fatalf("GrantLease: %v", err)
		}
		t.Cleanup(func() { _, _ = ls.RevokeLease(context.Background(), lease) })
		if _, err := ls.PutNode(ctx, &registryv1.Node{Name: "n1", Region: "r1", Cluster: "c1"}, lease); err != nil {
			t.Fatalf("PutNode: %v", err)
		}
	}
	l := list(t, s)
	k2, _ := registry.IDOf(endpoint("dig-2", 0, 0, 0, "")).Key()
	k1, _ := registry.IDOf(endpoint("dig-1", 0, 0, 0, "")).Key()
	for _, tc := range []struct {
		name   string
		bounds []string
		parts  int
	}{
		{"one part", nil, 1},
		{"three parts", []string{k1, k2}, 3},
		{"bounds out of order or outside the registry are ignored", []string{"/", k2, k1, "\xff"}, 2},
	} {
		between := 0
		kr, err := d.ListRevisionsInParts(ctx, backend.Parts{Bounds: tc.bounds, Between: func(context.Context) error { between++; return nil }})
		if err != nil {
			t.Fatalf("%s: ListRevisionsInParts: %v", tc.name, err)
		}
		if between != tc.parts-1 {
			t.Errorf("%s: Between ran %d times, want %d", tc.name, between, tc.parts-1)
		}
		// Nothing under registry.Root was written since the listing, but a
		// store may move its revision without touching the registry (the
		// kubernetes store's fences and tombstone collection do): the
		// digest may be at a later revision, never an earlier one, and
		// must hold exactly the listing's keys at their mod revisions.
		if kr.Revision < l.Revision || len(kr.Endpoints) != len(l.Endpoints) || len(kr.Nodes) != len(l.Nodes) {
			t.Fatalf("%s: digest at %d of %d endpoints and %d nodes, listing %s", tc.name, kr.Revision, len(kr.Endpoints), len(kr.Nodes), describeListing(l))
		}
		for i, er := range kr.Endpoints {
			if er.ID != registry.IDOf(l.Endpoints[i]) || er.ModRevision != l.EndpointRevs[i] {
				t.Errorf("%s: digest entry %d is %s@%d, listing has %s@%d", tc.name, i, er.ID, er.ModRevision, registry.IDOf(l.Endpoints[i]), l.EndpointRevs[i])
			}
		}
		for i, nr := range kr.Nodes {
			if nr.ID != registry.NodeIDOf(l.Nodes[i]) || nr.ModRevision != l.NodeRevs[i] {
				t.Errorf("%s: digest node %d is %s@%d, listing has %s@%d", tc.name, i, nr.ID, nr.ModRevision, registry.NodeIDOf(l.Nodes[i]), l.NodeRevs[i])
			}
		}
	}
	stop := errors.New("stop here")
	if _, err := d.ListRevisionsInParts(ctx, backend.Parts{Bounds: []string{k1}, Between: func(context.Context) error { return stop }}); !errors.Is(err, stop) {
		t.Fatalf("Between failing: ListRevisionsInParts returned %v, want its error", err)
	}
}

// RunCompactedIsReported: once history before a revision is forgotten,
// reading at an earlier revision fails with backend.ErrCompacted, a watch
// from an earlier revision ends with one Compacted batch at the revision
// it was asked to resume after, and everything from the compaction
// revision on still works.
func RunCompactedIsReported(t T, f Factory) {
	if f.Compact == nil {
		t.Fatalf("the factory has no Compact hook; RunCompactedIsReported does not apply")
	}
	s := f.New(t)
	ctx := testCtx(t)
	a, b, c := endpoint("compact", 1, 1, 100, "A"), endpoint("compact", 2, 1, 100, "A"), endpoint("compact", 3, 1, 100, "A")
	r1 := applyOne(t, s, put(a)).Revision
	applyOne(t, s, put(b))
	r3 := applyOne(t, s, put(c)).Revision
	f.Compact(t, s, r3)

	ids := []registry.EndpointID{registry.IDOf(a), registry.IDOf(b), registry.IDOf(c)}
	if _, err := s.GetAt(ctx, r1, ids, nil); !isCompacted(err) {
		t.Fatalf("GetAt(%d) after compaction at %d: %v, want backend.ErrCompacted", r1, r3, err)
	}
	if l, err := s.GetAt(ctx, r3, ids, nil); err != nil || len(l.Endpoints) != 3 {
		t.Fatalf("GetAt at the compaction revision %d: %s, %v; want all three", r3, describeListing(l), err)
	}
	if l := list(t, s); l.Revision < r3 || len(l.Endpoints) != 3 {
		t.Fatalf("List after compaction: %s", describeListing(l))
	}
	if d, ok := s.(backend.Digester); ok {
		if kr, err := d.ListRevisionsInParts(ctx, backend.Parts{}); err != nil || len(kr.Endpoints) != 3 {
			t.Fatalf("digest after compaction: %d endpoints, %v", len(kr.Endpoints), err)
		}
	}
	w, ok := s.(backend.Watcher)
	if !ok {
		return
	}
	old := Watch(t, w, r1)
	wait.For(t, "the watch from a compacted revision to close", watchTimeout, func() bool { _, closed := old.Snapshot(); return closed })
	bs, _ := old.Snapshot()
	if len(bs) != 1 || !bs[0].Compacted || bs[0].Revision != r1 || len(bs[0].Events) != 0 {
		t.Fatalf("watch from %d after compaction at %d: want exactly one Compacted batch at %d:%s", r1, r3, r1, DescribeBatches(bs))
	}
	cur := Watch(t, w, r3)
	d := endpoint("compact", 4, 1, 100, "A")
	r4 := applyOne(t, s, put(d)).Revision
	got := cur.UpTo(t, r4)
	checkFeed(t, got, r3)
	expectEvents(t, "watch from the compaction revision", eventsOf(got), []backend.Event{{ID: registry.IDOf(d), Endpoint: d, Revision: r4}}, got)
}

// RunLeases: a node record lives under its lease: renewed, it stays;
// revoked, it goes at once; left alone, the store deletes it after the
// TTL; and a lease that is gone is backend.ErrLeaseNotFound everywhere.
func RunLeases(t T, f Factory) {
	s := f.New(t)
	ls, ok := s.(backend.Leases)
	if !ok {
		t.Fatalf("the store under test offers no Leases; RunLeases does not apply to it")
	}
	ctx := testCtx(t)
	w, watches := s.(backend.Watcher)
	var c *Collector
	if watches {
		c = Watch(t, w, list(t, s).Revision)
	}

	const ask = 1500 * time.Millisecond
	lease, err := ls.GrantLease(ctx, ask)
	if err != nil || lease == 0 {
		t.Fatalf("GrantLease = %x, %v", lease, err)
	}
	n := &registryv1.Node{Name: "n1", Region: "r1", Cluster: "c1", Zone: "z1"}
	putRev, err := ls.PutNode(ctx, n, lease)
	if err != nil || putRev <= 0 {
		t.Fatalf("PutNode = %d, %v", putRev, err)
	}
	l := list(t, s)
	if len(l.Nodes) != 1 || !proto.Equal(l.Nodes[0], n) || l.NodeRevs[0] != putRev {
		t.Fatalf("listing after PutNode at %d: %s", putRev, describeListing(l))
	}
	ttl, err := ls.KeepAliveOnce(ctx, lease)
	if err != nil || ttl < ask {
		t.Fatalf("KeepAliveOnce = %v, %v; want at least the %v asked", ttl, err, ask)
	}
	remaining, granted, err := ls.LeaseTTL(ctx, lease)
	if err != nil || granted != ttl || remaining <= 0 || remaining > granted {
		t.Fatalf("LeaseTTL = %v of %v, %v; want some of the %v granted left", remaining, granted, err, ttl)
	}

	revoked, err := ls.RevokeLease(ctx, lease)
	if err != nil || revoked <= putRev {
		t.Fatalf("RevokeLease = %d, %v; want a revision after the put at %d", revoked, err, putRev)
	}
	if l := list(t, s); len(l.Nodes) != 0 {
		t.Fatalf("revoking the lease left the node record: %s", describeListing(l))
	}
	if _, err := ls.KeepAliveOnce(ctx, lease); !errors.Is(err, backend.ErrLeaseNotFound) {
		t.Fatalf("KeepAliveOnce of a revoked lease: %v, want ErrLeaseNotFound", err)
	}
	if _, _, err := ls.LeaseTTL(ctx, lease); !errors.Is(err, backend.ErrLeaseNotFound) {
		t.Fatalf("LeaseTTL of a revoked lease: %v, want ErrLeaseNotFound", err)
	}
	if _, err := ls.PutNode(ctx, n, lease); !errors.Is(err, backend.ErrLeaseNotFound) {
		t.Fatalf("PutNode under a revoked lease: %v, want ErrLeaseNotFound", err)
	}
	if r, err := ls.RevokeLease(ctx, lease); err != nil || r != 0 {
		t.Fatalf("revoking twice: %d, %v; want 0, nil", r, err)
	}
	if _, err := ls.PutNode(ctx, &registryv1.Node{Name: "a/b", Region: "r1", Cluster: "c1"}, lease); err == nil {
		t.Fatalf("PutNode accepted an invalid node name")
	}
	if watches {
		bs := c.UpTo(t, revoked)
		var nodes []backend.NodeEvent
		for _, b := range bs {
			nodes = append(nodes, b.Nodes...)
		}
		if len(nodes) != 2 || nodes[0].Node == nil || nodes[0].Revision != putRev || nodes[1].Node != nil || nodes[1].Revision != revoked ||
			nodes[0].ID != registry.NodeIDOf(n) || nodes[1].ID != registry.NodeIDOf(n) {
			t.Fatalf("node events %+v, want the put at %d and the revocation at %d:%s", nodes, putRev, revoked, DescribeBatches(bs))
		}
	}

	// Left alone, a lease runs out and the store deletes its record.
	lease, err = ls.GrantLease(ctx, time.Second)
	if err != nil {
		t.Fatalf("GrantLease: %v", err)
	}
	if _, err := ls.PutNode(ctx, n, lease); err != nil {
		t.Fatalf("PutNode: %v", err)
	}
	_, granted, err = ls.LeaseTTL(ctx, lease)
	if err != nil {
		t.Fatalf("LeaseTTL: %v", err)
	}
	if f.Advance != nil {
		f.Advance(t, s, granted)
	}
	wait.For(t, "the node record to lapse with its lease", granted+10*time.Second, func() bool { return len(list(t, s).Nodes) == 0 })
	if _, err := ls.KeepAliveOnce(ctx, lease); !errors.Is(err, backend.ErrLeaseNotFound) {
		t.Fatalf("KeepAliveOnce of a lapsed lease: %v, want ErrLeaseNotFound", err)
	}
}
