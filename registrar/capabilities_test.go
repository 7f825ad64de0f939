package registrar_test

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/backend/memory"
	"github.com/aethermesh/aether/internal/testutil/regtest"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/registrar/grpcapi"
)

// The model store offers every capability; these hide all but the core
// and the ones named, so the registrar sees a store that lacks the rest.
type (
	storeOnly        struct{ backend.Store }
	storeWithWatcher struct {
		backend.Store
		backend.Watcher
	}
)

// countingStore counts the full listings of the store it wraps.
type countingStore struct {
	backend.Store
	backend.Watcher
	lists atomic.Int64
}

func (c *countingStore) List(ctx context.Context) (backend.Listing, error) {
	c.lists.Add(1)
	return c.Store.List(ctx)
}

// serveOn starts a registrar over store and serves its API over gRPC on a
// loopback port; both end with t.
func serveOn(t *testing.T, store backend.Store, mut ...func(*registrar.Options)) (*registrar.Registrar, registrarv1.RegistrarClient) {
	t.Helper()
	o := registrar.Options{ClusterName: "c1", Region: "r1", Logger: regtest.QuietLogger()}
	for _, m := range mut {
		m(&o)
	}
	r, err := registrar.New(o, store)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	grpcapi.RegisterGRPC(srv, r)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() {
		r.EndStreams()
		srv.Stop()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := r.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return r, dial(t, lis.Addr().String())
}

// A store that offers only the core serves writes, listings and watches,
// and a second registrar on the same store learns the first one's writes
// by polling, the only sync there is without a change feed.
func TestStoreWithoutCapabilitiesServesAndPolls(t *testing.T) {
	t.Parallel()
	m := memory.New(memory.Options{})
	poll := func(o *registrar.Options) { o.SyncInterval = 100 * time.Millisecond }
	_, ca := serveOn(t, storeOnly{m}, poll)
	_, cb := serveOn(t, storeOnly{m}, poll)

	wa := watch(t, ca, &registrarv1.WatchEndpointsRequest{Services: []string{"web"}})
	wb := watch(t, cb, &registrarv1.WatchEndpointsRequest{Services: []string{"web"}})
	wa.waitSnapshot(t)
	wb.waitSnapshot(t)

	register(t, ca, ep("web", "10.0.0.1", 80))
	waitFor(t, "A's watcher sees its own write", 5*time.Second, func() bool { return wa.has("ADDED web 10.0.0.1") })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l, err := ca.ListAllEndpoints(ctx, &registrarv1.ListAllEndpointsRequest{})
	if err != nil || len(l.GetEndpoints()) != 1 || l.GetEndpoints()[0].GetIp() != "10.0.0.1" {
		t.Fatalf("A lists %v, %v; want web 10.0.0.1", l.GetEndpoints(), err)
	}
	waitFor(t, "A's write in the store", 5*time.Second, func() bool {
		got, _ := m.List(ctx)
		return len(got.Endpoints) == 1
	})
	waitFor(t, "B's watcher sees A's write by polling", 5*time.Second, func() bool { return wb.has("ADDED web 10.0.0.1") })

	unregister(t, ca, "web", "10.0.0.1")
	waitFor(t, "B's watcher sees A's removal by polling", 5*time.Second, func() bool { return wb.has("REMOVED web 10.0.0.1") })
}

// Asking to watch a store that has no change feed fails, naming the flag
// and the fix; poll, or no choice at all, runs.
func TestWatchModeRefusedWithoutChangeFeed(t *testing.T) {
	t.Parallel()
	m := memory.New(memory.Options{})
	_, err := registrar.New(registrar.Options{SyncMode: registrar.SyncWatch}, storeOnly{m})
	if err == nil || !strings.Contains(err.Error(), "--sync-mode") || !strings.Contains(err.Error(), "use --sync-mode poll") {
		t.Fatalf("watch mode on a store without a change feed: %v; want an error naming --sync-mode and poll", err)
	}
	for _, mode := range []string{"", registrar.SyncPoll} {
		if _, err := registrar.New(registrar.Options{SyncMode: mode}, storeOnly{m}); err != nil {
			t.Errorf("sync mode %q on a store without a change feed: %v", mode, err)
		}
	}
	if _, err := registrar.New(registrar.Options{SyncMode: registrar.SyncWatch}, storeWithWatcher{m, m}); err != nil {
		t.Errorf("watch mode on a store with a change feed: %v", err)
	}
}

// Without a keys-only digest the backstop takes full listings, next to a
// running watch.
func TestBackstopListsInFullWithoutDigest(t *testing.T) {
	t.Parallel()
	m := memory.New(memory.Options{})
	store := &countingStore{Store: m, Watcher: m}
	serveOn(t, store, func(o *registrar.Options) { o.SyncInterval = 100 * time.Millisecond })
	n := store.lists.Load() // the initial listing
	waitFor(t, "two backstop listings", 5*time.Second, func() bool { return store.lists.Load() >= n+2 })
}

// With a digest the backstop lists keys only: the listing Start took is
// the only full one (the counting wrapper hides nothing else).
func TestBackstopUsesDigestWhenOffered(t *testing.T) {
	t.Parallel()
	m := memory.New(memory.Options{})
	var backstops atomic.Int64
	store := &struct {
		*countingStore
		backend.Digester
	}{&countingStore{Store: m, Watcher: m}, &digestCounter{Digester: m, n: &backstops}}
	serveOn(t, store, func(o *registrar.Options) { o.SyncInterval = 100 * time.Millisecond })
	waitFor(t, "two backstops", 5*time.Second, func() bool { return backstops.Load() >= 2 })
	if n := store.lists.Load(); n != 1 {
		t.Errorf("%d full listings with a digest offered; want only the initial one", n)
	}
}

type digestCounter struct {
	backend.Digester
	n *atomic.Int64
}

func (d *digestCounter) ListRevisionsInParts(ctx context.Context, p backend.Parts) (backend.KeyRevisions, error) {
	d.n.Add(1)
	return d.Digester.ListRevisionsInParts(ctx, p)
}

// On a store without leases the node calls are refused with
// FAILED_PRECONDITION naming the missing capability, which a client treats
// as permanent: no retry can give the store leases.
func TestNodeCallsWithoutLeases(t *testing.T) {
	t.Parallel()
	m := memory.New(memory.Options{})
	_, c := serveOn(t, storeWithWatcher{m, m})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	calls := map[string]func() error{
		"AnnounceNode": func() error {
			_, err := c.AnnounceNode(ctx, &registrarv1.AnnounceNodeRequest{Node: &registryv1.Node{Name: "n1", Zone: "z1"}})
			return err
		},
		"Heartbeat": func() error {
			_, err := c.Heartbeat(ctx, &registrarv1.HeartbeatRequest{Node: "n1"})
			return err
		},
		"LeaveNode": func() error {
			_, err := c.LeaveNode(ctx, &registrarv1.LeaveNodeRequest{Node: "n1"})
			return err
		},
	}
	for name, call := range calls {
		err := call()
		if st := status.Convert(err); st.Code() != codes.FailedPrecondition || !strings.Contains(st.Message(), "no leases") {
			t.Errorf("%s on a store without leases: %v; want FAILED_PRECONDITION naming the missing leases", name, err)
		}
	}
	nodes, err := c.ListNodes(ctx, &registrarv1.ListNodesRequest{})
	if err != nil || len(nodes.GetNodes()) != 0 {
		t.Errorf("ListNodes: %v, %v; want none", nodes.GetNodes(), err)
	}
	// Endpoints are served as ever.
	register(t, c, ep("web", "10.0.0.1", 80))

	// The same calls on the full store succeed: the refusal is the
	// missing capability's, not the requests'.
	_, full := serveOn(t, m)
	if _, err := full.AnnounceNode(ctx, &registrarv1.AnnounceNodeRequest{Node: &registryv1.Node{Name: "n1", Zone: "z1"}}); err != nil {
		t.Fatalf("AnnounceNode on the full store: %v", err)
	}
	if _, err := full.Heartbeat(ctx, &registrarv1.HeartbeatRequest{Node: "n1"}); err != nil {
		t.Errorf("Heartbeat on the full store: %v", err)
	}
	if _, err := full.LeaveNode(ctx, &registrarv1.LeaveNodeRequest{Node: "n1"}); err != nil {
		t.Errorf("LeaveNode on the full store: %v", err)
	}
}
