package etcd

import (
	"context"
	"errors"
	"fmt"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/registry"
)

// spyKV wraps a client's real KV and records every Get and every Txn the
// Store sends through it, so tests can see how a listing was paged and how
// a read was split, and act between pages. Install it on a client of its
// own: writes and checks made through it would be recorded too.
type spyKV struct {
	clientv3.KV

	// afterGet, if set, runs after the nth Get (from 1) returns.
	afterGet func(ctx context.Context, n int, resp *clientv3.GetResponse, err error)

	mu   sync.Mutex
	gets []spyGet
	txns [][]clientv3.Op // the Then ops of each committed Txn
}

type spyGet struct {
	op   clientv3.Op
	kvs  int // keys returned
	more bool
	err  error
}

func (k *spyKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	resp, err := k.KV.Get(ctx, key, opts...)
	g := spyGet{op: clientv3.OpGet(key, opts...), err: err}
	if resp != nil {
		g.kvs, g.more = len(resp.Kvs), resp.More
	}
	k.mu.Lock()
	k.gets = append(k.gets, g)
	n := len(k.gets)
	k.mu.Unlock()
	if k.afterGet != nil {
		k.afterGet(ctx, n, resp, err)
	}
	return resp, err
}

func (k *spyKV) Txn(ctx context.Context) clientv3.Txn {
	return &spyTxn{Txn: k.KV.Txn(ctx), kv: k}
}

func (k *spyKV) reset() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.gets, k.txns = nil, nil
}

func (k *spyKV) snapshot() ([]spyGet, [][]clientv3.Op) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.gets), slices.Clone(k.txns)
}

type spyTxn struct {
	clientv3.Txn
	kv   *spyKV
	then []clientv3.Op
}

func (t *spyTxn) If(cs ...clientv3.Cmp) clientv3.Txn { t.Txn = t.Txn.If(cs...); return t }
func (t *spyTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.Txn = t.Txn.Else(ops...)
	return t
}

func (t *spyTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.then = append(t.then, ops...)
	t.Txn = t.Txn.Then(ops...)
	return t
}

func (t *spyTxn) Commit() (*clientv3.TxnResponse, error) {
	t.kv.mu.Lock()
	t.kv.txns = append(t.kv.txns, t.then)
	t.kv.mu.Unlock()
	return t.Txn.Commit()
}

// spiedStore is a Store on a client of its own whose KV is spied on.
func spiedStore(t *testing.T, etcd *etcdtest.Cluster, opts Options) (*Store, *spyKV, *logSink) {
	cli := etcd.Client(t)
	spy := &spyKV{KV: cli.KV}
	cli.KV = spy
	s, logs := newStore(t, cli, opts)
	return s, spy, logs
}

func longLease(t *testing.T, s *Store) int64 {
	t.Helper()
	lease, err := s.GrantLease(testCtx(t), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return lease
}

func mustPutNode(t *testing.T, s *Store, n *registryv1.Node, lease int64) int64 {
	t.Helper()
	rev, err := s.PutNode(testCtx(t), n, lease)
	if err != nil {
		t.Fatalf("PutNode %s: %v", registry.NodeIDOf(n), err)
	}
	return rev
}

func node(region, cluster, name, zone string) *registryv1.Node {
	return &registryv1.Node{Name: name, Region: region, Cluster: cluster, Zone: zone}
}

// keyOf is an endpoint's or node record's key.
func keyOf(t *testing.T, id interface{ Key() (string, error) }) string {
	t.Helper()
	k, err := id.Key()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// modRev is a key's mod revision at rev (0 for the current one) by a plain
// Get, or 0 when the key is absent there.
func modRev(t *testing.T, cli *clientv3.Client, key string, rev int64) int64 {
	t.Helper()
	resp, err := cli.Get(testCtx(t), key, clientv3.WithRev(rev))
	if err != nil {
		t.Fatalf("get %s at %d: %v", key, rev, err)
	}
	if len(resp.Kvs) == 0 {
		return 0
	}
	return resp.Kvs[0].ModRevision
}

// wantKeyRevs is what ListRevisions must return at rev for the given
// identities: sorted by key, with the mod revisions a plain Get reports.
func wantKeyRevs(t *testing.T, cli *clientv3.Client, rev int64, eps []registry.EndpointID, nodes []registry.NodeID) ([]EndpointRevision, []NodeRevision) {
	t.Helper()
	eps, nodes = slices.Clone(eps), slices.Clone(nodes)
	sort.Slice(eps, func(i, j int) bool { return keyOf(t, eps[i]) < keyOf(t, eps[j]) })
	sort.Slice(nodes, func(i, j int) bool { return keyOf(t, nodes[i]) < keyOf(t, nodes[j]) })
	var er []EndpointRevision
	for _, id := range eps {
		r := modRev(t, cli, keyOf(t, id), rev)
		if r == 0 {
			t.Fatalf("test setup: %s absent at %d", id, rev)
		}
		er = append(er, EndpointRevision{ID: id, ModRevision: r})
	}
	var nr []NodeRevision
	for _, id := range nodes {
		r := modRev(t, cli, keyOf(t, id), rev)
		if r == 0 {
			t.Fatalf("test setup: %s absent at %d", id, rev)
		}
		nr = append(nr, NodeRevision{ID: id, ModRevision: r})
	}
	return er, nr
}

func checkKeyRevs(t *testing.T, kr KeyRevisions, eps []EndpointRevision, nodes []NodeRevision) {
	t.Helper()
	if !slices.Equal(kr.Endpoints, eps) {
		t.Errorf("ListRevisions endpoints:\n got %v\nwant %v", kr.Endpoints, eps)
	}
	if !slices.Equal(kr.Nodes, nodes) {
		t.Errorf("ListRevisions nodes:\n got %v\nwant %v", kr.Nodes, nodes)
	}
}

func idsOf(eps ...*registryv1.ServiceEndpoint) []registry.EndpointID {
	ids := make([]registry.EndpointID, len(eps))
	for i, ep := range eps {
		ids[i] = registry.IDOf(ep)
	}
	return ids
}

func nodeIDsOf(ns ...*registryv1.Node) []registry.NodeID {
	ids := make([]registry.NodeID, len(ns))
	for i, n := range ns {
		ids[i] = registry.NodeIDOf(n)
	}
	return ids
}

func TestListRevisionsOfEmptyRegistry(t *testing.T) {
	etcd := etcdtest.Start(t)
	raw := etcd.Client(t)
	s, _ := newStore(t, etcd.Client(t), Options{})
	// Something outside Root moves the revision but is not listed.
	if _, err := raw.Put(testCtx(t), "/elsewhere", "x"); err != nil {
		t.Fatal(err)
	}
	kr, err := s.ListRevisions(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(kr.Endpoints) != 0 || len(kr.Nodes) != 0 {
		t.Fatalf("empty registry listed %v %v", kr.Endpoints, kr.Nodes)
	}
	if want := currentRev(t, raw); kr.Revision != want || want < 2 {
		t.Fatalf("Revision = %d, want the store's %d", kr.Revision, want)
	}
}

func TestListRevisionsListsEndpointAndNodeKeys(t *testing.T) {
	etcd := etcdtest.Start(t)
	raw := etcd.Client(t)
	s, logs := newStore(t, etcd.Client(t), Options{})
	ctx := testCtx(t)

	a, b, c := endpoint("api", 1, 1), endpoint("api", 2, 1), endpoint("db", 1, 1)
	gone := endpoint("api", 3, 1)
	other := endpoint("api", 4, 1)
	other.Region, other.Cluster = "r2", "c9"
	created := mustApply(t, s, put(a), put(b), put(gone))
	mustApply(t, s, put(c), put(other))
	updated := mustApply(t, s, put(endpoint("api", 2, 2))) // b's mod revision moves
	mustApply(t, s, del(gone))

	lease := longLease(t, s)
	n1, n2 := node("r1", "c1", "n1", "z1"), node("r2", "c9", "n2", "z2")
	mustPutNode(t, s, n1, lease)
	n2rev := mustPutNode(t, s, n2, lease)
	mustPutNode(t, s, node("r2", "c9", "n2", "z3"), lease) // n2 rewritten

	// An endpoint key whose value does not decode still is an endpoint
	// key: ListRevisions reads no values, so it is listed (and GetAt will
	// skip it).
	garbage := endpoint("db", 7, 1)
	val := mustEncode(t, endpoint("db", 9, 1))
	for k, v := range map[string]string{
		v1Key(garbage):               "\xff\xff not a protobuf",
		"/aether/v1/something-else":  "outside Root",
		"/aether/v1/regionsX":        "outside Root, sorts right after it",
		"/aether/v1/regions/r1/meta": "x",
		"/aether/v1/regions/r1/clusters/c1/services/svc/protocols/quic/endpoints/10.0.0.9":         val, // unknown protocol
		"/aether/v1/regions/r1/clusters/c1/services/svc/protocols/http1/endpoints/not-an-ip":       val,
		"/aether/v1/regions/r1/clusters/c1/services/svc/protocols/http1/endpoints/10.0.0.10/extra": val,
		"/aether/v1/regions/r1/clusters/c1/services/bad name/protocols/http1/endpoints/10.0.0.11":  val,
		"/aether/v1/regions/r1/clusters/c1/services/svc/protocols/http1/endpoints/0:0:0:0:0:0:0:1": val, // not canonical
		"/aether/v1/regions/r1/clusters/c1/nodes/a/b":                                              "x",
		"/aether/v1/regions/r1/clusters/c1/nodes/":                                                 "x",
		"/aether/v1/regions/r1/clusters/c1/nodes/-bad-":                                            "x",
		"/aether/v1/regions/r1/nodes/n3":                                                           "x",
	} {
		if _, err := raw.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
	}
	storeRev := currentRev(t, raw)

	logged := len(logs.String())
	kr, err := s.ListRevisions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if kr.Revision != storeRev {
		t.Errorf("Revision = %d, want the store's revision %d", kr.Revision, storeRev)
	}
	wantEPs, wantNodes := wantKeyRevs(t, raw, 0, idsOf(a, b, c, other, garbage), nodeIDsOf(n1, n2))
	checkKeyRevs(t, kr, wantEPs, wantNodes)

	// The mod revision, not the create revision or the version: spelled
	// out for the keys that were rewritten.
	for _, e := range kr.Endpoints {
		if e.ID == registry.IDOf(b) && (e.ModRevision != updated || e.ModRevision == created) {
			t.Errorf("rewritten endpoint %s at %d, want its last write's %d", e.ID, e.ModRevision, updated)
		}
	}
	for _, n := range kr.Nodes {
		if n.ID == registry.NodeIDOf(n2) && n.ModRevision <= n2rev {
			t.Errorf("rewritten node %s at %d, want after its first write's %d", n.ID, n.ModRevision, n2rev)
		}
	}
	if out := logs.String()[logged:]; out != "" {
		t.Errorf("ListRevisions logged %q; foreign keys must be ignored silently", out)
	}
}

// TestListRevisionsPagesAtOneRevision and TestListRevisionsOverCompaction
// test the paged listing used on etcd before v3.7 (no RangeStream).
func TestListRevisionsPagesAtOneRevision(t *testing.T) {
	etcd := etcdtest.Start(t)
	raw := etcd.Client(t)
	writer, _ := newStore(t, raw, Options{})
	// A listing page of 3 makes a keys-only page of 30.
	s, spy, _ := spiedStore(t, etcd, Options{PageSize: 3})
	s.noRangeStream.Store(true) // the paged listing, as on etcd before v3.7
	ctx := testCtx(t)

	var eps []*registryv1.ServiceEndpoint
	var muts []Mutation
	for i := range 100 {
		ep := endpoint([]string{"api", "db"}[i%2], i, 1)
		eps = append(eps, ep)
		muts = append(muts, put(ep))
	}
	mustApply(t, writer, muts...)
	lease := longLease(t, writer)
	var nodes []*registryv1.Node
	for i := range 5 {
		n := node("r1", "c1", fmt.Sprintf("n%d", i), "z1")
		nodes = append(nodes, n)
		mustPutNode(t, writer, n, lease)
	}
	if _, err := raw.Put(ctx, "/aether/v1/regions/r1/meta", "x"); err != nil {
		t.Fatal(err)
	}
	rev := currentRev(t, raw)
	wantEPs, wantNodes := wantKeyRevs(t, raw, rev, idsOf(eps...), nodeIDsOf(nodes...))

	// After the first page, another client writes before and after the
	// cursor, rewrites and deletes keys yet to be read and adds a node
	// record. None of it may show.
	last, secondLast := wantEPs[len(wantEPs)-1].ID, wantEPs[len(wantEPs)-2].ID
	var rewritten *registryv1.ServiceEndpoint
	for _, ep := range eps {
		if registry.IDOf(ep) == last {
			rewritten = proto.Clone(ep).(*registryv1.ServiceEndpoint)
			rewritten.Node = "node-9"
		}
	}
	spy.afterGet = func(ctx context.Context, n int, _ *clientv3.GetResponse, _ error) {
		if n != 1 {
			return
		}
		if _, err := writer.Apply(ctx, []Mutation{
			put(endpoint("aaa", 1, 9)),   // sorts before every listed key
			put(endpoint("zzz", 1, 9)),   // and after
			put(endpoint("db", 1000, 9)), // among them, not yet read
		}); err != nil {
			t.Errorf("concurrent write: %v", err)
		}
		if _, err := writer.Apply(ctx, []Mutation{put(rewritten), {ID: secondLast}}); err != nil {
			t.Errorf("concurrent write: %v", err)
		}
		if _, err := writer.PutNode(ctx, node("r1", "c1", "n9", "z1"), lease); err != nil {
			t.Errorf("concurrent node write: %v", err)
		}
	}
	kr, err := s.ListRevisions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	spy.afterGet = nil
	if kr.Revision != rev {
		t.Errorf("Revision = %d, want %d (the first page's)", kr.Revision, rev)
	}
	checkKeyRevs(t, kr, wantEPs, wantNodes)

	// Once each and in key order: nodes/ sorts before services/ here.
	var keys []string
	for _, n := range kr.Nodes {
		keys = append(keys, keyOf(t, n.ID))
	}
	for _, e := range kr.Endpoints {
		keys = append(keys, keyOf(t, e.ID))
	}
	for i := 1; i < len(keys); i++ {
		if keys[i-1] >= keys[i] {
			t.Fatalf("key %d %s not after %s", i, keys[i], keys[i-1])
		}
	}

	// 106 keys under Root (100 endpoints, 5 nodes, 1 other) at 30 a page.
	gets, _ := spy.snapshot()
	if len(gets) != 4 {
		t.Fatalf("ListRevisions sent %d Gets, want 4 pages", len(gets))
	}
	for i, g := range gets {
		wantRev := rev
		if i == 0 {
			wantRev = 0 // the first page sets the revision
		}
		if !g.op.IsKeysOnly() || g.op.Limit() != 30 || g.op.Rev() != wantRev || g.err != nil {
			t.Errorf("page %d: keys-only=%v limit=%d rev=%d err=%v; want keys-only, limit 30, rev %d",
				i+1, g.op.IsKeysOnly(), g.op.Limit(), g.op.Rev(), g.err, wantRev)
		}
		if wantKvs, wantMore := min(30, 106-30*i), i < 3; g.kvs != wantKvs || g.more != wantMore {
			t.Errorf("page %d: %d keys (more=%v), want %d (more=%v)", i+1, g.kvs, g.more, wantKvs, wantMore)
		}
	}

	// A later listing sees the writes.
	kr2, err := s.ListRevisions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if now := currentRev(t, raw); kr2.Revision != now || now != rev+3 {
		t.Errorf("second listing at %d, want %d (three writes after %d)", kr2.Revision, now, rev)
	}
	if len(kr2.Endpoints) != 100+3-1 || len(kr2.Nodes) != 6 {
		t.Errorf("second listing: %d endpoints and %d nodes, want 102 and 6", len(kr2.Endpoints), len(kr2.Nodes))
	}
	for _, e := range kr2.Endpoints {
		if e.ID == last && e.ModRevision != rev+2 {
			t.Errorf("rewritten %s at %d in the second listing, want %d", e.ID, e.ModRevision, rev+2)
		}
		if e.ID == secondLast {
			t.Errorf("deleted %s still listed", e.ID)
		}
	}
}

func TestListRevisionsOverCompaction(t *testing.T) {
	for _, tc := range []struct {
		name    string
		compact func(attempt int) bool // compact after page 1 of this attempt?
		wantErr bool
		gets    int
	}{
		// Attempt 1 fails on page 2; attempt 2 lists both pages.
		{"starts over", func(a int) bool { return a == 1 }, false, 1 + 1 + 2},
		// Every attempt fails on page 2: ListRevisions gives up after
		// maxListAttempts.
		{"gives up", func(int) bool { return true }, true, 2 * maxListAttempts},
	} {
		t.Run(tc.name, func(t *testing.T) {
			etcd := etcdtest.Start(t)
			raw := etcd.Client(t)
			s, spy, logs := spiedStore(t, etcd, Options{PageSize: 3})
			s.noRangeStream.Store(true) // paged, so compaction can overtake a page
			ctx := testCtx(t)
			var muts []Mutation
			for i := range 40 {
				muts = append(muts, put(endpoint("svc", i, 1)))
			}
			mustApply(t, s, muts...)

			var compactedAt int64
			attempt := 0
			spy.afterGet = func(ctx context.Context, _ int, resp *clientv3.GetResponse, err error) {
				if err != nil || resp.Header.Revision == 0 {
					return
				}
				// A Get without a pinned revision is an attempt's first page.
				gets, _ := spy.snapshot()
				if gets[len(gets)-1].op.Rev() != 0 {
					return
				}
				attempt++
				if !tc.compact(attempt) {
					return
				}
				compactedAt = putAndCompact(ctx, t, raw, 100+attempt)
			}
			kr, err := s.ListRevisions(ctx)
			gets, _ := spy.snapshot()
			if len(gets) != tc.gets {
				t.Errorf("sent %d Gets, want %d", len(gets), tc.gets)
			}
			if !strings.Contains(logs.String(), "overtaken by compaction") {
				t.Error("restart after compaction was not logged")
			}
			if tc.wantErr {
				if !errors.Is(err, rpctypes.ErrCompacted) || attempt != maxListAttempts {
					t.Fatalf("after %d attempts: err = %v, want ErrCompacted after %d", attempt, err, maxListAttempts)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if kr.Revision != compactedAt || len(kr.Endpoints) != 41 {
				t.Fatalf("listing: %d endpoints at %d, want 41 at %d (a fresh listing)", len(kr.Endpoints), kr.Revision, compactedAt)
			}
		})
	}
}

func TestListModRevisionsLineUp(t *testing.T) {
	etcd := etcdtest.Start(t)
	raw := etcd.Client(t)
	s, _ := newStore(t, etcd.Client(t), Options{PageSize: 2})
	ctx := testCtx(t)

	var eps []*registryv1.ServiceEndpoint
	for i := range 6 {
		eps = append(eps, endpoint([]string{"api", "db"}[i%2], i, 1))
	}
	// Several revisions, so a shift by one slot would show.
	for _, ep := range eps {
		mustApply(t, s, put(ep))
	}
	eps[2] = endpoint("api", 2, 2)
	updated := mustApply(t, s, put(eps[2]))
	lease := longLease(t, s)
	nodes := []*registryv1.Node{node("r1", "c1", "n1", "z1"), node("r1", "c2", "n2", "z1"), node("r1", "c1", "n0", "z1")}
	for _, n := range nodes {
		mustPutNode(t, s, n, lease)
	}
	garbageEP, garbageNode := endpoint("api", 10, 1), "/aether/v1/regions/r1/clusters/c1/nodes/n5"
	for k, v := range map[string]string{
		v1Key(garbageEP):             "\xff not a protobuf",
		garbageNode:                  "\xff not a node",
		"/aether/v1/regions/r1/meta": "x",
	} {
		if _, err := raw.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
	}

	l, err := s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	kr, err := s.ListRevisions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if l.Revision != kr.Revision || l.Skipped != 2 {
		t.Fatalf("List at %d skipping %d, ListRevisions at %d; want one revision and 2 skipped", l.Revision, l.Skipped, kr.Revision)
	}
	if len(l.Endpoints) != len(eps) || len(l.EndpointRevs) != len(l.Endpoints) {
		t.Fatalf("%d endpoints with %d revisions, want %d of each", len(l.Endpoints), len(l.EndpointRevs), len(eps))
	}
	if len(l.Nodes) != len(nodes) || len(l.NodeRevs) != len(l.Nodes) {
		t.Fatalf("%d nodes with %d revisions, want %d of each", len(l.Nodes), len(l.NodeRevs), len(nodes))
	}

	krEP := map[registry.EndpointID]int64{}
	for _, e := range kr.Endpoints {
		krEP[e.ID] = e.ModRevision
	}
	krNode := map[registry.NodeID]int64{}
	for _, n := range kr.Nodes {
		krNode[n.ID] = n.ModRevision
	}
	for i, ep := range l.Endpoints {
		id := registry.IDOf(ep)
		want := modRev(t, raw, v1Key(ep), 0)
		if l.EndpointRevs[i] != want || krEP[id] != want {
			t.Errorf("endpoint %d %s: List says %d, ListRevisions %d, etcd %d", i, id, l.EndpointRevs[i], krEP[id], want)
		}
		if id == registry.IDOf(eps[2]) && l.EndpointRevs[i] != updated {
			t.Errorf("rewritten endpoint %s at %d, want %d", id, l.EndpointRevs[i], updated)
		}
		delete(krEP, id)
	}
	for i, n := range l.Nodes {
		id := registry.NodeIDOf(n)
		want := modRev(t, raw, keyOf(t, id), 0)
		if l.NodeRevs[i] != want || krNode[id] != want {
			t.Errorf("node %d %s: List says %d, ListRevisions %d, etcd %d", i, id, l.NodeRevs[i], krNode[id], want)
		}
		delete(krNode, id)
	}
	// What ListRevisions has beyond List is exactly the undecodable keys.
	if _, ok := krEP[registry.IDOf(garbageEP)]; !ok || len(krEP) != 1 {
		t.Errorf("ListRevisions endpoints not in List: %v, want just %s", krEP, registry.IDOf(garbageEP))
	}
	if len(krNode) != 1 {
		t.Errorf("ListRevisions nodes not in List: %v, want just %s", krNode, garbageNode)
	}

	// ListPrefix fills them too.
	lp, err := s.ListPrefix(ctx, registry.ServicePrefix("r1", "c1", "api"))
	if err != nil {
		t.Fatal(err)
	}
	if len(lp.Endpoints) != 3 || len(lp.EndpointRevs) != 3 {
		t.Fatalf("ListPrefix: %d endpoints, %d revisions; want 3 and 3", len(lp.Endpoints), len(lp.EndpointRevs))
	}
	for i, ep := range lp.Endpoints {
		if want := modRev(t, raw, v1Key(ep), 0); lp.EndpointRevs[i] != want {
			t.Errorf("ListPrefix endpoint %d %s at %d, want %d", i, ep.Ip, lp.EndpointRevs[i], want)
		}
	}
}

func TestGetAt(t *testing.T) {
	etcd := etcdtest.Start(t)
	raw := etcd.Client(t)
	writer, _ := newStore(t, raw, Options{})
	s, spy, logs := spiedStore(t, etcd, Options{MaxTxnOps: 4})
	ctx := testCtx(t)

	// At old: ten endpoints, written over several revisions, and two nodes.
	var v1s []*registryv1.ServiceEndpoint
	for i := range 10 {
		v1s = append(v1s, endpoint("svc", i, 1))
	}
	for lo := 0; lo < 10; lo += 3 {
		mustApply(t, writer, putAll(v1s[lo:min(lo+3, 10)])...)
	}
	lease := longLease(t, writer)
	n1, n2 := node("r1", "c1", "n1", "z1"), node("r1", "c2", "n2", "z1")
	mustPutNode(t, writer, n1, lease)
	mustPutNode(t, writer, n2, lease)
	old := currentRev(t, raw)

	// After it: v1s[0] rewritten, v1s[1] deleted, ep10 added, n1 rewritten
	// and n2 deleted.
	v2 := endpoint("svc", 0, 2)
	ep10 := endpoint("svc", 10, 1)
	mustApply(t, writer, put(v2), del(v1s[1]), put(ep10))
	n1b := node("r1", "c1", "n1", "z2")
	mustPutNode(t, writer, n1b, lease)
	if _, err := raw.Delete(ctx, keyOf(t, registry.NodeIDOf(n2))); err != nil {
		t.Fatal(err)
	}
	cur := currentRev(t, raw)

	allIDs := idsOf(append(slices.Clone(v1s), ep10)...)
	current := append([]*registryv1.ServiceEndpoint{v2}, v1s[2:]...)
	current = append(current, ep10)

	for _, tc := range []struct {
		name      string
		rev       int64
		eps       []registry.EndpointID
		nodes     []registry.NodeID
		wantEPs   []*registryv1.ServiceEndpoint
		wantNodes []*registryv1.Node
		txns      []int // ops per Txn
	}{
		{"old values at an old revision", old, allIDs, nodeIDsOf(n1, n2), v1s, []*registryv1.Node{n1, n2}, []int{4, 4, 4, 1}},
		{"current values", cur, allIDs, nodeIDsOf(n1, n2), current, []*registryv1.Node{n1b}, []int{4, 4, 4, 1}},
		{"a key absent at rev is absent", old, idsOf(ep10), nil, nil, nil, []int{1}},
		{"a deleted key is read at its old revision", old, idsOf(v1s[1]), nil, v1s[1:2], nil, []int{1}},
		{"nodes only", old, nil, nodeIDsOf(n1, n2), nil, []*registryv1.Node{n1, n2}, []int{2}},
		{"exactly MaxTxnOps keys is one Txn", old, idsOf(v1s[:3]...), nodeIDsOf(n1), v1s[:3], []*registryv1.Node{n1}, []int{4}},
		{"MaxTxnOps plus one is two", cur, idsOf(v1s[2:7]...), nil, v1s[2:7], nil, []int{4, 1}},
		{"nothing asked, nothing sent", old, nil, nil, nil, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spy.reset()
			l, err := s.GetAt(ctx, tc.rev, tc.eps, tc.nodes)
			if err != nil {
				t.Fatal(err)
			}
			if l.Revision != tc.rev || l.Skipped != 0 {
				t.Errorf("listing at %d skipping %d, want at %d skipping none", l.Revision, l.Skipped, tc.rev)
			}
			checkListingAt(t, raw, l, tc.rev, tc.wantEPs, tc.wantNodes)

			_, txns := spy.snapshot()
			var sizes []int
			for i, ops := range txns {
				sizes = append(sizes, len(ops))
				for _, op := range ops {
					if !op.IsGet() || op.Rev() != tc.rev || len(op.RangeBytes()) != 0 {
						t.Errorf("Txn %d has an op other than a single-key Get at %d: %s", i, tc.rev, op.KeyBytes())
					}
				}
			}
			if !slices.Equal(sizes, tc.txns) {
				t.Errorf("Txns of %v ops, want %v (MaxTxnOps 4)", sizes, tc.txns)
			}
		})
	}

	t.Run("undecodable values are skipped", func(t *testing.T) {
		garbage, mismatched := endpoint("svc", 20, 1), endpoint("svc", 21, 1)
		garbageNode := node("r1", "c1", "n7", "z1")
		for k, v := range map[string]string{
			v1Key(garbage):                           "\xff\xff not a protobuf",
			v1Key(mismatched):                        mustEncode(t, endpoint("svc", 22, 1)), // names another endpoint
			keyOf(t, registry.NodeIDOf(garbageNode)): "\xff not a node",
		} {
			if _, err := raw.Put(ctx, k, v); err != nil {
				t.Fatal(err)
			}
		}
		rev := currentRev(t, raw)
		l, err := s.GetAt(ctx, rev, idsOf(v1s[2], garbage, mismatched, v1s[3]), nodeIDsOf(garbageNode, n1))
		if err != nil {
			t.Fatal(err)
		}
		if l.Skipped != 3 {
			t.Errorf("Skipped = %d, want 3", l.Skipped)
		}
		checkListingAt(t, raw, l, rev, []*registryv1.ServiceEndpoint{v1s[2], v1s[3]}, []*registryv1.Node{n1b})
		for _, k := range []string{v1Key(garbage), v1Key(mismatched), keyOf(t, registry.NodeIDOf(garbageNode))} {
			if !strings.Contains(logs.String(), k) {
				t.Errorf("no warning names skipped key %s", k)
			}
		}
	})

	t.Run("invalid identities send nothing", func(t *testing.T) {
		badEP := registry.IDOf(v1s[2])
		badEP.Service = "no/slash"
		nonCanonical := registry.IDOf(v1s[2])
		nonCanonical.IP = "::ffff:10.0.0.2"
		for _, tc := range []struct {
			name  string
			eps   []registry.EndpointID
			nodes []registry.NodeID
		}{
			{"endpoint after valid ones", append(idsOf(v1s[2], v1s[3], v1s[4], v1s[5], v1s[6]), badEP), nil},
			{"non-canonical endpoint", []registry.EndpointID{nonCanonical}, nil},
			{"zero endpoint", []registry.EndpointID{{}}, nil},
			{"node", idsOf(v1s[2]), []registry.NodeID{{Region: "r1", Cluster: "c1", Name: "a/b"}}},
			{"zero node", nil, []registry.NodeID{{}}},
		} {
			spy.reset()
			if _, err := s.GetAt(ctx, cur, tc.eps, tc.nodes); err == nil {
				t.Errorf("%s: GetAt accepted an invalid identity", tc.name)
			}
			if _, txns := spy.snapshot(); len(txns) != 0 {
				t.Errorf("%s: %d Txns sent before the identities were checked", tc.name, len(txns))
			}
		}
	})

	t.Run("future revision", func(t *testing.T) {
		rev := currentRev(t, raw) + 100
		if _, err := s.GetAt(ctx, rev, idsOf(v1s[2]), nil); !errors.Is(err, rpctypes.ErrFutureRev) {
			t.Fatalf("GetAt at future revision %d: err = %v, want ErrFutureRev", rev, err)
		}
	})

	// Last: it compacts away the history the cases above read.
	t.Run("compacted revision", func(t *testing.T) {
		compactAt := currentRev(t, raw)
		if _, err := raw.Compact(ctx, compactAt, clientv3.WithCompactPhysical()); err != nil {
			t.Fatal(err)
		}
		for _, rev := range []int64{old, compactAt - 1} {
			_, err := s.GetAt(ctx, rev, allIDs, nodeIDsOf(n1))
			if !errors.Is(err, rpctypes.ErrCompacted) {
				t.Errorf("GetAt at compacted revision %d: err = %v, want ErrCompacted", rev, err)
			}
		}
		// The compaction revision itself is kept.
		l, err := s.GetAt(ctx, compactAt, idsOf(v2, v1s[2]), nodeIDsOf(n1))
		if err != nil {
			t.Fatalf("GetAt at the compaction revision %d: %v", compactAt, err)
		}
		checkListingAt(t, raw, l, compactAt, []*registryv1.ServiceEndpoint{v2, v1s[2]}, []*registryv1.Node{n1b})
	})
}

func putAll(eps []*registryv1.ServiceEndpoint) []Mutation {
	var muts []Mutation
	for _, ep := range eps {
		muts = append(muts, put(ep))
	}
	return muts
}

// checkListingAt checks that l holds exactly eps and nodes, each once,
// with the mod revision a plain Get reports for it at rev in the matching
// slot of EndpointRevs or NodeRevs. GetAt promises no order, so none is
// checked.
func checkListingAt(t *testing.T, cli *clientv3.Client, l Listing, rev int64, eps []*registryv1.ServiceEndpoint, nodes []*registryv1.Node) {
	t.Helper()
	if len(l.Endpoints) != len(eps) || len(l.EndpointRevs) != len(eps) {
		t.Fatalf("%d endpoints with %d revisions, want %d: %v", len(l.Endpoints), len(l.EndpointRevs), len(eps), l.Endpoints)
	}
	wantEP := map[string]*registryv1.ServiceEndpoint{}
	for _, ep := range eps {
		wantEP[v1Key(ep)] = ep
	}
	for i, ep := range l.Endpoints {
		k := v1Key(ep)
		w, ok := wantEP[k]
		if !ok {
			t.Errorf("endpoint %d %s not wanted (or listed twice)", i, k)
			continue
		}
		delete(wantEP, k)
		if !sameEndpoint(ep, w) {
			t.Errorf("endpoint %d = %v, want %v", i, ep, w)
		}
		if want := modRev(t, cli, k, rev); l.EndpointRevs[i] != want || want == 0 {
			t.Errorf("endpoint %d %s at %d, want %d", i, ep.Ip, l.EndpointRevs[i], want)
		}
	}
	if len(l.Nodes) != len(nodes) || len(l.NodeRevs) != len(nodes) {
		t.Fatalf("%d nodes with %d revisions, want %d: %v", len(l.Nodes), len(l.NodeRevs), len(nodes), l.Nodes)
	}
	wantNode := map[string]*registryv1.Node{}
	for _, n := range nodes {
		wantNode[keyOf(t, registry.NodeIDOf(n))] = n
	}
	for i, n := range l.Nodes {
		k := keyOf(t, registry.NodeIDOf(n))
		w, ok := wantNode[k]
		if !ok {
			t.Errorf("node %d %s not wanted (or listed twice)", i, k)
			continue
		}
		delete(wantNode, k)
		if !proto.Equal(n, w) {
			t.Errorf("node %d = %v, want %v", i, n, w)
		}
		if want := modRev(t, cli, k, rev); l.NodeRevs[i] != want || want == 0 {
			t.Errorf("node %d %s at %d, want %d", i, n.Name, l.NodeRevs[i], want)
		}
	}
}

func TestApplyEachReportsEachTxnsRevision(t *testing.T) {
	c := etcdtest.Start(t)
	cli := c.Client(t)
	s := New(cli, Options{MaxTxnOps: 4})
	var muts []Mutation
	for i := range 10 {
		ep := endpoint(fmt.Sprint("svc", i%3), i+1, 0)
		muts = append(muts, Mutation{ID: registry.IDOf(ep), Endpoint: ep})
	}
	revs, err := s.ApplyEach(context.Background(), muts)
	if err != nil {
		t.Fatal(err)
	}
	if len(revs) != len(muts) {
		t.Fatalf("%d revisions for %d mutations", len(revs), len(muts))
	}
	// Txns of 4, 4 and 2, at three increasing revisions.
	for i := range revs {
		if want := revs[i/4*4]; revs[i] != want {
			t.Errorf("mutation %d landed at %d, the rest of its Txn at %d", i, revs[i], want)
		}
	}
	if !(revs[0] < revs[4] && revs[4] < revs[8]) {
		t.Fatalf("Txn revisions %d, %d, %d do not increase", revs[0], revs[4], revs[8])
	}
	for i, m := range muts {
		key, _ := m.ID.Key()
		resp, err := cli.Get(context.Background(), key)
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("get %s: %v, %d kvs", key, err, len(resp.Kvs))
		}
		if resp.Kvs[0].ModRevision != revs[i] {
			t.Errorf("%s: mod revision %d, ApplyEach said %d", key, resp.Kvs[0].ModRevision, revs[i])
		}
	}
	last, err := s.Apply(context.Background(), muts[:1])
	if err != nil || last <= revs[9] {
		t.Fatalf("Apply = %d, %v; want the revision after %d", last, err, revs[9])
	}
}

// oldEtcdKV answers RangeStream as an etcd before v3.7 does, and counts the
// streams asked for; everything else goes to the real KV.
type oldEtcdKV struct {
	clientv3.KV
	unimplemented bool
	streams       atomic.Int32
}

func (k *oldEtcdKV) GetStream(ctx context.Context, key string, opts ...clientv3.OpOption) (clientv3.GetStreamChan, error) {
	k.streams.Add(1)
	if k.unimplemented {
		return nil, status.Error(codes.Unimplemented, "unknown method RangeStream for service etcdserverpb.KV")
	}
	return k.KV.GetStream(ctx, key, opts...)
}

// The keys-only listing streams (etcd's RangeStream, no counting under
// etcd's index lock), and lists exactly what the paged listing lists; on an
// etcd without RangeStream it pages, and stops asking for streams.
func TestListRevisionsStreamsAndFallsBackToPages(t *testing.T) {
	etcd := etcdtest.Start(t)
	raw := etcd.Client(t)
	writer, _ := newStore(t, raw, Options{})
	ctx := testCtx(t)
	var muts []Mutation
	for i := range 3000 {
		muts = append(muts, put(endpoint([]string{"api", "db", "web"}[i%3], i, 1)))
	}
	mustApply(t, writer, muts...)
	for i := range 3 {
		if _, err := writer.PutNode(ctx, &registryv1.Node{Name: fmt.Sprint("n", i), Region: "r1", Cluster: "c1"}, 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := raw.Put(ctx, registry.Root+"not-ours", "x"); err != nil {
		t.Fatal(err)
	}

	paged, _ := newStore(t, etcd.Client(t), Options{PageSize: 7})
	paged.noRangeStream.Store(true)
	want, err := paged.ListRevisions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(want.Endpoints) != 3000 || len(want.Nodes) != 3 || want.Revision != currentRev(t, raw) {
		t.Fatalf("paged listing: %d endpoints, %d nodes at %d", len(want.Endpoints), len(want.Nodes), want.Revision)
	}

	cli := etcd.Client(t)
	kv := &oldEtcdKV{KV: cli.KV}
	cli.KV = kv
	s, _ := newStore(t, cli, Options{})
	got, err := s.ListRevisions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if kv.streams.Load() != 1 || s.noRangeStream.Load() {
		t.Fatalf("%d streams asked for (fallback %v); want the listing streamed", kv.streams.Load(), s.noRangeStream.Load())
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("streamed listing differs from the paged one: %d endpoints, %d nodes at %d", len(got.Endpoints), len(got.Nodes), got.Revision)
	}

	// An etcd without RangeStream: the same listing, paged.
	kv.unimplemented = true
	s2, logs := newStore(t, cli, Options{})
	got, err = s2.ListRevisions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) || !s2.noRangeStream.Load() || kv.streams.Load() != 2 {
		t.Fatalf("fallback: equal %v, paged from now on %v, streams asked %d", reflect.DeepEqual(got, want), s2.noRangeStream.Load(), kv.streams.Load())
	}
	if !strings.Contains(logs.String(), "no RangeStream") {
		t.Errorf("the fallback was not logged: %q", logs.String())
	}
	if _, err := s2.ListRevisions(ctx); err != nil || kv.streams.Load() != 2 {
		t.Fatalf("after the fallback: %v, %d streams asked (want no more)", err, kv.streams.Load())
	}
}
