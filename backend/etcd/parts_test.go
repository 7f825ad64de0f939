package etcd

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/registry"
)

// A listing read in parts lists exactly what one read lists, whatever the
// bounds, at the first part's revision: writes made between parts, before,
// among and after the keys still to be read, do not show. Streamed and
// paged alike.
func TestListRevisionsInPartsIsOneListing(t *testing.T) {
	etcd := etcdtest.Start(t)
	raw := etcd.Client(t)
	writer, _ := newStore(t, raw, Options{})
	ctx := testCtx(t)
	var muts []Mutation
	for i := range 600 {
		muts = append(muts, put(endpoint([]string{"api", "db", "web"}[i%3], i, 1)))
	}
	mustApply(t, writer, muts...)
	for i := range 3 {
		if _, err := writer.PutNode(ctx, node("r1", fmt.Sprint("c", i), fmt.Sprint("n", i), "z1"), 0); err != nil {
			t.Fatal(err)
		}
	}
	whole, err := writer.ListRevisions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(whole.Endpoints) != 600 || len(whole.Nodes) != 3 {
		t.Fatalf("whole listing: %d endpoints, %d nodes", len(whole.Endpoints), len(whole.Nodes))
	}
	keyOf := func(i int) string { return keyOf(t, whole.Endpoints[i].ID) }
	var every50 []string
	for i := 50; i < 600; i += 50 {
		every50 = append(every50, keyOf(i))
	}
	for _, tc := range []struct {
		name   string
		bounds []string
		parts  int
	}{
		{"no bounds", nil, 1},
		{"one bound", []string{keyOf(300)}, 2},
		{"every 50th key", every50, 12},
		{"bounds that are not keys", []string{registry.Root + "r1/clusters/c1/services/db", registry.Root + "r1/clusters/c1/services/e"}, 3},
		// Out of order, repeated, or outside registry.Root: ignored.
		{"bad bounds", []string{"/", registry.Root, keyOf(400), keyOf(100), keyOf(400), keyOf(500), "~", clientv3.GetPrefixRangeEnd(registry.Root)}, 3},
	} {
		for _, paged := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/paged=%v", tc.name, paged), func(t *testing.T) {
				s, _ := newStore(t, etcd.Client(t), Options{PageSize: 7})
				s.noRangeStream.Store(paged)
				before := currentRev(t, raw)
				want, err := s.ListRevisions(ctx)
				if err != nil || want.Revision != before {
					t.Fatalf("whole listing at %d (%v), want %d", want.Revision, err, before)
				}
				calls := 0
				added := []Mutation{put(endpoint("aaa", 1, 9)), put(endpoint("web", 5000, 9)), put(endpoint("zzz", 1, 9))}
				kr, err := s.ListRevisionsInParts(ctx, Parts{Bounds: tc.bounds, Expect: 600, Between: func(context.Context) error {
					if calls++; calls == 1 {
						// Keys before every listed key, among those yet
						// to be read and after them; a rewrite and a
						// delete of the last key.
						mustApply(t, writer, append(added, put(endpoint("api", 597, 2)), Mutation{ID: whole.Endpoints[599].ID})...)
					}
					return nil
				}})
				if err != nil {
					t.Fatal(err)
				}
				if calls != tc.parts-1 {
					t.Errorf("Between ran %d times, want %d (once between each two of %d parts)", calls, tc.parts-1, tc.parts)
				}
				if !reflect.DeepEqual(kr, want) {
					t.Errorf("in parts: %d endpoints, %d nodes at %d; one read: %d, %d at %d",
						len(kr.Endpoints), len(kr.Nodes), kr.Revision, len(want.Endpoints), len(want.Nodes), want.Revision)
				}
				if calls > 0 {
					// Back to the same keys for the next case.
					mustApply(t, writer, muts...)
					mustApply(t, writer, del(added[0].Endpoint), del(added[1].Endpoint), del(added[2].Endpoint))
				}
			})
		}
	}
}

// An error from Between ends the listing with that error, and nothing more
// is read.
func TestListRevisionsInPartsStopsOnBetweenError(t *testing.T) {
	etcd := etcdtest.Start(t)
	s, spy, _ := spiedStore(t, etcd, Options{})
	s.noRangeStream.Store(true)
	ctx := testCtx(t)
	var muts []Mutation
	for i := range 30 {
		muts = append(muts, put(endpoint("svc", i, 1)))
	}
	mustApply(t, s, muts...)
	stop := errors.New("stop here")
	_, err := s.ListRevisionsInParts(ctx, Parts{Bounds: []string{v1Key(endpoint("svc", 10, 1)), v1Key(endpoint("svc", 20, 1))},
		Between: func(context.Context) error { return stop }})
	if !errors.Is(err, stop) {
		t.Fatalf("err = %v, want Between's", err)
	}
	if gets, _ := spy.snapshot(); len(gets) != 1 {
		t.Fatalf("%d Gets, want the first part's only", len(gets))
	}
}

// Compaction of the first part's revision before a later part is read
// starts the listing over, streamed as paged.
func TestListRevisionsInPartsOverCompaction(t *testing.T) {
	for _, paged := range []bool{false, true} {
		t.Run(fmt.Sprintf("paged=%v", paged), func(t *testing.T) {
			etcd := etcdtest.Start(t)
			raw := etcd.Client(t)
			s, logs := newStore(t, etcd.Client(t), Options{})
			s.noRangeStream.Store(paged)
			ctx := testCtx(t)
			var muts []Mutation
			for i := range 40 {
				muts = append(muts, put(endpoint("svc", i, 1)))
			}
			mustApply(t, s, muts...)
			var compactedAt int64
			calls := 0
			kr, err := s.ListRevisionsInParts(ctx, Parts{Bounds: []string{v1Key(endpoint("svc", 20, 1))}, Between: func(ctx context.Context) error {
				if calls++; calls == 1 {
					compactedAt = putAndCompact(ctx, t, raw, 100)
				}
				return nil
			}})
			if err != nil {
				t.Fatal(err)
			}
			if calls != 2 || !strings.Contains(logs.String(), "overtaken by compaction") {
				t.Errorf("Between ran %d times (want 2: the listing started over); logs: %q", calls, logs.String())
			}
			if kr.Revision != compactedAt || len(kr.Endpoints) != 41 {
				t.Fatalf("listing: %d endpoints at %d, want 41 at %d (a fresh listing)", len(kr.Endpoints), kr.Revision, compactedAt)
			}
		})
	}
}
