package etcd

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/registry"
)

func TestApplySplitsIntoMaxTxnOpsTxns(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	s, _ := newStore(t, cli, Options{})
	ctx := testCtx(t)

	var muts []Mutation
	var eps []*registryv1.ServiceEndpoint
	for i := range 300 {
		ep := endpoint("svc", i, 1)
		eps = append(eps, ep)
		muts = append(muts, put(ep))
	}
	before := currentRev(t, cli)
	rev := mustApply(t, s, muts...)
	// 300 mutations at 128 per txn: 128 + 128 + 44, one revision each.
	if rev != before+3 {
		t.Fatalf("Apply revision = %d, want %d (3 txns after %d)", rev, before+3, before)
	}

	perRev := map[int64]int{}
	for _, ep := range eps {
		resp, err := cli.Get(ctx, v1Key(ep))
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) != 1 {
			t.Fatalf("key %s missing", v1Key(ep))
		}
		got, err := registry.DecodeEndpoint(v1Key(ep), resp.Kvs[0].Value)
		if err != nil {
			t.Fatalf("value at %s: %v", v1Key(ep), err)
		}
		if !sameEndpoint(got, ep) {
			t.Fatalf("value at %s = %v, want %v", v1Key(ep), got, ep)
		}
		perRev[resp.Kvs[0].ModRevision]++
	}
	want := map[int64]int{before + 1: 128, before + 2: 128, before + 3: 44}
	if fmt.Sprint(perRev) != fmt.Sprint(want) {
		t.Fatalf("keys per revision = %v, want %v (mutations in order, 128 per txn)", perRev, want)
	}
}

func TestApplyHonoursMaxTxnOpsOption(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	s, _ := newStore(t, cli, Options{MaxTxnOps: 10})
	var muts []Mutation
	for i := range 25 {
		muts = append(muts, put(endpoint("svc", i, 1)))
	}
	before := currentRev(t, cli)
	if rev := mustApply(t, s, muts...); rev != before+3 {
		t.Fatalf("Apply revision = %d, want %d (25 mutations at 10 per txn)", rev, before+3)
	}
	// Exactly MaxTxnOps is one txn, not two.
	before = currentRev(t, cli)
	if rev := mustApply(t, s, muts[:10]...); rev != before+1 {
		t.Fatalf("Apply of MaxTxnOps mutations: revision = %d, want %d", rev, before+1)
	}
}

func TestApplyRejectsDuplicateKeyWithoutWriting(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	s, _ := newStore(t, cli, Options{})
	a, b := endpoint("svc", 1, 1), endpoint("svc", 2, 1)
	// A put and a delete of the same key collide just as two puts do.
	muts := []Mutation{put(a), put(b), del(a)}

	before := currentRev(t, cli)
	_, err := s.Apply(testCtx(t), muts)
	if err == nil {
		t.Fatal("Apply accepted a duplicate key")
	}
	if !strings.Contains(err.Error(), v1Key(a)) || !strings.Contains(err.Error(), "mutations 0 and 2") {
		t.Fatalf("err = %v, want it to name %s and mutations 0 and 2", err, v1Key(a))
	}
	if after := currentRev(t, cli); after != before {
		t.Fatalf("revision moved %d -> %d: something was written", before, after)
	}
}

func TestApplyRejectsInvalidMutationsWithoutWriting(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	s, _ := newStore(t, cli, Options{})
	good := endpoint("svc", 1, 1)
	other := endpoint("svc", 2, 1)
	badID := registry.IDOf(good)
	badID.Service = "no/slash"

	for _, tc := range []struct {
		name string
		mut  Mutation
		want string
	}{
		{"invalid id", Mutation{ID: badID}, "invalid endpoint id"},
		{"non-canonical ip", Mutation{ID: registry.EndpointID{Region: "r1", Cluster: "c1", Service: "svc", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, IP: "::ffff:10.0.0.1"}}, "canonical"},
		{"identity mismatch", Mutation{ID: registry.IDOf(endpoint("svc", 3, 1)), Endpoint: other}, "does not match its id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := currentRev(t, cli)
			// The bad mutation comes last: nothing before it may be sent.
			_, err := s.Apply(testCtx(t), []Mutation{put(good), tc.mut})
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "mutation 1") {
				t.Fatalf("err = %v, want it to mention mutation 1 and %q", err, tc.want)
			}
			if after := currentRev(t, cli); after != before {
				t.Fatalf("revision moved %d -> %d: something was written", before, after)
			}
		})
	}
}

func TestApplyMixedPutsAndDeletesInOneTxn(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	s, _ := newStore(t, cli, Options{})
	ctx := testCtx(t)
	a, b, c, never := endpoint("svc", 1, 1), endpoint("svc", 2, 1), endpoint("svc", 3, 1), endpoint("svc", 4, 1)
	mustApply(t, s, put(a), put(b))

	b2 := endpoint("svc", 2, 2)
	before := currentRev(t, cli)
	// Deleting a key that does not exist is fine: deletes are idempotent.
	rev := mustApply(t, s, del(a), put(b2), put(c), del(never))
	if rev != before+1 {
		t.Fatalf("revision = %d, want %d (one txn)", rev, before+1)
	}
	l, err := s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if l.Revision != rev || len(l.Endpoints) != 2 || !sameEndpoint(l.Endpoints[0], b2) || !sameEndpoint(l.Endpoints[1], c) {
		t.Fatalf("listing at %d = %v, want [b2 c] at %d", l.Revision, l.Endpoints, rev)
	}

	// Replaying the same batch is harmless: that is what makes retries safe.
	if _, err := s.Apply(ctx, []Mutation{del(a), put(b2), put(c), del(never)}); err != nil {
		t.Fatal(err)
	}
	l2, err := s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(l2.Endpoints) != 2 || !sameEndpoint(l2.Endpoints[0], b2) || !sameEndpoint(l2.Endpoints[1], c) {
		t.Fatalf("listing after replay = %v", l2.Endpoints)
	}
}

func TestApplyEmptySendsNothing(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	s, _ := newStore(t, cli, Options{})
	before := currentRev(t, cli)
	rev, err := s.Apply(testCtx(t), nil)
	if err != nil || rev != 0 {
		t.Fatalf("Apply(nil) = %d, %v; want 0, nil", rev, err)
	}
	if after := currentRev(t, cli); after != before {
		t.Fatalf("revision moved %d -> %d", before, after)
	}
}

func TestListPaginatesAtOneRevision(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	s, _ := newStore(t, cli, Options{PageSize: 7})
	writer, _ := newStore(t, etcd.Client(t), Options{})
	ctx := testCtx(t)

	var want []*registryv1.ServiceEndpoint
	var muts []Mutation
	for i := range 50 {
		ep := endpoint("svc", i, 1)
		want = append(want, ep)
		muts = append(muts, put(ep))
	}
	rev := mustApply(t, s, muts...)

	// Between pages, another client adds keys both before and after the
	// cursor, updates one that is yet to be read and deletes another. None
	// of it may show: the listing is the snapshot at the first page.
	pages := 0
	s.afterPage = func(ctx context.Context, page int) {
		pages = page
		if page != 1 {
			return
		}
		if _, err := writer.Apply(ctx, []Mutation{
			put(endpoint("aaa", 1, 9)),    // sorts before every listed key
			put(endpoint("zzz", 1, 9)),    // and after
			put(endpoint("svc", 1000, 9)), // among them, not yet read
			put(endpoint("svc", 40, 9)),   // update of a key not yet read
			del(endpoint("svc", 45, 1)),   // delete of a key not yet read
		}); err != nil {
			t.Errorf("concurrent write: %v", err)
		}
	}
	l, err := s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if pages != 8 {
		t.Errorf("read %d pages, want 8 (50 keys at 7 per page)", pages)
	}
	if l.Revision != rev {
		t.Errorf("listing revision = %d, want %d (the first page's)", l.Revision, rev)
	}
	sort.Slice(want, func(i, j int) bool { return v1Key(want[i]) < v1Key(want[j]) })
	if len(l.Endpoints) != len(want) {
		t.Fatalf("listed %d endpoints, want %d", len(l.Endpoints), len(want))
	}
	for i := range want {
		if !sameEndpoint(l.Endpoints[i], want[i]) {
			t.Fatalf("endpoint %d = %v, want %v (key order, snapshot values)", i, l.Endpoints[i], want[i])
		}
	}

	// Without the hook a later listing sees the new state.
	s.afterPage = nil
	l2, err := s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if l2.Revision != rev+1 || len(l2.Endpoints) != 50-1+3 {
		t.Fatalf("second listing: %d endpoints at %d, want 52 at %d", len(l2.Endpoints), l2.Revision, rev+1)
	}
}

func TestListWithConcurrentWriters(t *testing.T) {
	etcd := etcdtest.Start(t)
	s, _ := newStore(t, etcd.Client(t), Options{PageSize: 7})
	writer, _ := newStore(t, etcd.Client(t), Options{})
	ctx := testCtx(t)
	var muts []Mutation
	for i := range 50 {
		muts = append(muts, put(endpoint("svc", i, 0)))
	}
	mustApply(t, s, muts...)

	// Free-running writers, unsynchronised with paging: every listing must
	// still be one snapshot, which shows as every endpoint carrying the
	// same generation (each write rewrites all 50 in one txn).
	wctx, stop := context.WithCancel(ctx)
	done, running := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for gen := 1; wctx.Err() == nil; gen++ {
			var muts []Mutation
			for i := range 50 {
				muts = append(muts, put(endpoint("svc", i, gen)))
			}
			if _, err := writer.Apply(wctx, muts); err != nil && wctx.Err() == nil {
				t.Errorf("writer: %v", err)
				return
			}
			if gen == 1 {
				close(running)
			}
		}
	}()
	select {
	case <-running:
	case <-done:
		t.Fatal("writer stopped before its first write")
	}
	revs := map[int64]bool{}
	for range 20 {
		l, err := s.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(l.Endpoints) != 50 {
			t.Fatalf("listed %d endpoints, want 50", len(l.Endpoints))
		}
		for _, ep := range l.Endpoints {
			if ep.Node != l.Endpoints[0].Node {
				t.Fatalf("listing at %d mixes generations %s and %s", l.Revision, l.Endpoints[0].Node, ep.Node)
			}
		}
		revs[l.Revision] = true
	}
	stop()
	<-done
	if len(revs) < 2 {
		t.Fatalf("all listings at one revision: the writer never overlapped a listing")
	}
}

func TestListSkipsGarbageAndIgnoresOtherRecords(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	s, logs := newStore(t, cli, Options{PageSize: 2})
	ctx := testCtx(t)
	good1, good2 := endpoint("svc", 1, 1), endpoint("svc", 3, 1)
	mustApply(t, s, put(good1), put(good2))

	garbage := v1Key(endpoint("svc", 2, 1))
	mismatched := v1Key(endpoint("svc", 4, 1)) // valid proto, wrong identity
	val, err := registry.EncodeEndpoint(endpoint("svc", 5, 1))
	if err != nil {
		t.Fatal(err)
	}
	badProto := "/aether/v1/regions/r1/clusters/c1/services/svc/protocols/quic/endpoints/10.0.0.9"
	for k, v := range map[string]string{
		garbage:    "\xff\xff not a protobuf",
		mismatched: string(val),
		badProto:   string(val),
		"/aether/v1/regions/r1/clusters/c1/nodes/node-1": "\xff not a node record",
		"/aether/v1/regions/r1/meta":                     "x",
		"/elsewhere/key":                                 "outside Root",
	} {
		if _, err := cli.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
	}

	l, err := s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Endpoints) != 2 || !sameEndpoint(l.Endpoints[0], good1) || !sameEndpoint(l.Endpoints[1], good2) {
		t.Fatalf("endpoints = %v, want the two good ones", l.Endpoints)
	}
	if l.Skipped != 4 {
		t.Fatalf("Skipped = %d, want 4 (garbage, mismatched identity, unknown protocol, garbage node record)", l.Skipped)
	}
	out := logs.String()
	for _, k := range []string{garbage, mismatched, badProto, "/aether/v1/regions/r1/clusters/c1/nodes/node-1"} {
		if !strings.Contains(out, k) {
			t.Errorf("no warning names skipped key %s", k)
		}
	}
	if strings.Contains(out, "/aether/v1/regions/r1/meta") {
		t.Error("a key that is neither an endpoint nor a node record was logged; other keys must be ignored silently")
	}
}

func TestListPrefix(t *testing.T) {
	etcd := etcdtest.Start(t)
	s, _ := newStore(t, etcd.Client(t), Options{PageSize: 3})
	ctx := testCtx(t)
	var muts []Mutation
	for i := range 5 {
		muts = append(muts, put(endpoint("api", i, 1)), put(endpoint("db", i, 1)))
	}
	// "ap" is a prefix of "api"'s service segment, but ServicePrefix ends
	// in "/" so a service named "ap" would not match: check that too.
	muts = append(muts, put(endpoint("ap", 1, 1)))
	rev := mustApply(t, s, muts...)

	l, err := s.ListPrefix(ctx, registry.ServicePrefix("r1", "c1", "api"))
	if err != nil {
		t.Fatal(err)
	}
	if l.Revision != rev || len(l.Endpoints) != 5 {
		t.Fatalf("listed %d endpoints at %d, want 5 at %d", len(l.Endpoints), l.Revision, rev)
	}
	for _, ep := range l.Endpoints {
		if ep.Service != "api" {
			t.Fatalf("listing of api includes %s", ep.Service)
		}
	}
	if _, err := s.ListPrefix(ctx, "/aether/v2/"); err == nil || !strings.Contains(err.Error(), "not under") {
		t.Fatalf("ListPrefix outside Root: err = %v", err)
	}
}

func TestListStartsOverWhenCompactedMidway(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	s, logs := newStore(t, cli, Options{PageSize: 3})
	ctx := testCtx(t)
	var muts []Mutation
	for i := range 10 {
		muts = append(muts, put(endpoint("svc", i, 1)))
	}
	mustApply(t, s, muts...)

	// After the first page of the first attempt, write and compact past
	// the revision the listing is pinned to, as auto-compaction might.
	var compactedAt int64
	s.afterPage = func(ctx context.Context, page int) {
		if compactedAt != 0 || page != 1 {
			return
		}
		compactedAt = putAndCompact(ctx, t, cli, 99)
	}
	l, err := s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if l.Revision != compactedAt || len(l.Endpoints) != 11 {
		t.Fatalf("listing: %d endpoints at %d, want 11 at %d (a fresh listing)", len(l.Endpoints), l.Revision, compactedAt)
	}
	if !strings.Contains(logs.String(), "overtaken by compaction") {
		t.Error("restart after compaction was not logged")
	}
}

func mustEncode(t *testing.T, ep *registryv1.ServiceEndpoint) string {
	t.Helper()
	b, err := registry.EncodeEndpoint(ep)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
