package core

import (
	"errors"
	"sort"
	"strings"
	"testing"
	"time"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/registry"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func mkEP(t testing.TB, svc, ip string, mut ...func(*registryv1.ServiceEndpoint)) *registryv1.ServiceEndpoint {
	t.Helper()
	ep := &registryv1.ServiceEndpoint{
		Service: svc, Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: ip,
		Ports: []*registryv1.Port{{Port: 80}}, Region: "r", Cluster: "c",
	}
	for _, m := range mut {
		m(ep)
	}
	n, err := registry.NormalizeEndpoint(ep, registry.DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func draining(ep *registryv1.ServiceEndpoint) { ep.State = registryv1.State_STATE_DRAINING }

// types names each event (of a []*EndpointEvent, or an Effects's) by its
// type and IP.
func types(x any) []string {
	evs, ok := x.([]*registrarv1.EndpointEvent)
	if !ok {
		evs = x.(Effects).Events
	}
	var out []string
	for _, ev := range evs {
		out = append(out, ev.Type.String()+" "+ev.GetEndpoint().GetIp())
	}
	return out
}

func eq(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestRegisterUpdateUnregister(t *testing.T) {
	s := newStateForTest("e", 100, 100)
	_, ev, err := s.register(mkEP(t, "web", "10.0.0.1"), t0)
	if err != nil || ev.Type != registrarv1.EndpointEvent_ENDPOINT_ADDED || ev.Sequence != 1 || ev.Version != "e:1" {
		t.Fatalf("register: %v %v", ev, err)
	}
	if _, ev, _ := s.register(mkEP(t, "web", "10.0.0.1"), t0.Add(time.Second)); ev != nil {
		t.Fatalf("identical re-register produced %v", ev)
	}
	stored, ev, _ := s.register(mkEP(t, "web", "10.0.0.1", draining), t0.Add(2*time.Second))
	if ev.Type != registrarv1.EndpointEvent_ENDPOINT_UPDATED || ev.Sequence != 2 {
		t.Fatalf("update: %v", ev)
	}
	if !stored.CreatedAt.AsTime().Equal(t0) || !stored.UpdatedAt.AsTime().Equal(t0.Add(2*time.Second)) {
		t.Fatalf("timestamps: created %v updated %v", stored.CreatedAt.AsTime(), stored.UpdatedAt.AsTime())
	}
	id := registry.IDOf(stored)
	ev, err = s.unregister(id, time.Time{})
	if err != nil || ev.Type != registrarv1.EndpointEvent_ENDPOINT_REMOVED || ev.Endpoint.State != registryv1.State_STATE_DRAINING {
		t.Fatalf("unregister: %v %v", ev, err)
	}
	if _, err := s.unregister(id, time.Time{}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second unregister: %v", err)
	}
	if s.seq != 3 || s.Len() != 0 || len(s.byCount) != 0 {
		t.Fatalf("seq %d len %d counts %v", s.seq, s.Len(), s.byCount)
	}
}

func TestWriteQueueCoalesces(t *testing.T) {
	s := newStateForTest("e", 100, 100)
	a := mkEP(t, "web", "10.0.0.1")
	s.register(a, t0)
	s.register(mkEP(t, "web", "10.0.0.1", draining), t0)
	s.register(mkEP(t, "web", "10.0.0.2"), t0)
	s.unregister(registry.IDOf(mkEP(t, "web", "10.0.0.2")), t0)
	b := s.TakeBatch(100, t0)
	sort.Slice(b, func(i, j int) bool { return b[i].ID.IP < b[j].ID.IP })
	// Only the latest write of each key goes out. 10.0.0.2 does not net
	// out although the backend never saw it: another replica may have
	// written it meanwhile with an older stamp, and the delete's stamp
	// (its tombstone) must be there to win over that write.
	if len(b) != 2 || b[0].Endpoint.GetState() != registryv1.State_STATE_DRAINING || b[1].Endpoint != nil || b[1].Stamp == nil {
		t.Fatalf("batch = %+v; want the latest write of 10.0.0.1 and a stamped delete of 10.0.0.2", b)
	}
	if registry.CompareStamps(b[0].Endpoint.GetStamp(), b[1].Stamp) >= 0 {
		t.Fatalf("stamps %v then %v: a later write must be stamped later", b[0].Endpoint.GetStamp(), b[1].Stamp)
	}
	s.batchDone(b, 5)
	s.unregister(registry.IDOf(a), t0)
	b = s.TakeBatch(100, t0)
	if len(b) != 1 || b[0].Endpoint != nil {
		t.Fatalf("batch = %+v; want one delete", b)
	}
}

func TestWriteQueueLimit(t *testing.T) {
	s := newStateForTest("e", 100, 2)
	s.register(mkEP(t, "web", "10.0.0.1"), t0)
	s.register(mkEP(t, "web", "10.0.0.2"), t0)
	if _, _, err := s.register(mkEP(t, "web", "10.0.0.3"), t0); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("third key: %v, want ErrQueueFull", err)
	}
	if s.Len() != 2 || s.seq != 2 {
		t.Fatalf("a refused write changed state: len %d seq %d", s.Len(), s.seq)
	}
	// A key already queued still takes updates.
	if _, _, err := s.register(mkEP(t, "web", "10.0.0.1", draining), t0); err != nil {
		t.Fatalf("update of queued key: %v", err)
	}
	// In flight still counts against the limit until confirmed.
	b := s.TakeBatch(100, time.Time{})
	if _, _, err := s.register(mkEP(t, "web", "10.0.0.3"), t0); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("with writes in flight: %v, want ErrQueueFull", err)
	}
	s.batchDone(b, 3)
	if _, _, err := s.register(mkEP(t, "web", "10.0.0.3"), t0); err != nil {
		t.Fatalf("after flush: %v", err)
	}
}

func TestFailedFlushKeepsWrites(t *testing.T) {
	s := newStateForTest("e", 100, 100)
	s.register(mkEP(t, "web", "10.0.0.1"), t0)
	s.register(mkEP(t, "web", "10.0.0.2"), t0)
	b := s.TakeBatch(100, time.Time{})
	// A newer write to one key arrives while the batch is in flight.
	s.register(mkEP(t, "web", "10.0.0.1", draining), t0)
	s.BatchFailed(b)
	b = s.TakeBatch(100, time.Time{})
	if len(b) != 2 {
		t.Fatalf("after failure, batch = %d writes, want 2", len(b))
	}
	for _, m := range b {
		if m.ID.IP == "10.0.0.1" && m.Endpoint.State != registryv1.State_STATE_DRAINING {
			t.Fatal("the failed older write replaced the newer one")
		}
	}
}

func listing(rev int64, eps ...*registryv1.ServiceEndpoint) backend.Listing {
	return backend.Listing{Endpoints: eps, Revision: rev}
}

func put(rev int64, ep *registryv1.ServiceEndpoint) backend.Event {
	return backend.Event{ID: registry.IDOf(ep), Endpoint: ep, Revision: rev}
}

func del(rev int64, ep *registryv1.ServiceEndpoint) backend.Event {
	return backend.Event{ID: registry.IDOf(ep), Revision: rev}
}

func TestBackendReconcile(t *testing.T) {
	a, b, c := mkEP(t, "web", "10.0.0.1"), mkEP(t, "web", "10.0.0.2"), mkEP(t, "db", "10.0.0.3")
	s := newStateForTest("e", 100, 100)
	if got := types(s.ApplyListing(listing(10, a, b))); !eq(got, []string{"ENDPOINT_ADDED 10.0.0.1", "ENDPOINT_ADDED 10.0.0.2"}) && !eq(got, []string{"ENDPOINT_ADDED 10.0.0.2", "ENDPOINT_ADDED 10.0.0.1"}) {
		t.Fatalf("initial listing: %v", got)
	}
	// Watch: an add, an update, a delete, and a stale event that must be ignored.
	got := types(s.ApplyWatch(backend.WatchBatch{Revision: 13, Events: []backend.Event{
		put(9, mkEP(t, "web", "10.0.0.9")), // older than the listing
		put(11, c),
		put(12, mkEP(t, "web", "10.0.0.1", draining)),
		del(13, b),
	}}))
	if !eq(got, []string{"ENDPOINT_ADDED 10.0.0.3", "ENDPOINT_UPDATED 10.0.0.1", "ENDPOINT_REMOVED 10.0.0.2"}) {
		t.Fatalf("watch: %v", got)
	}
	// A listing older than the snapshot is ignored entirely.
	if evs := s.ApplyListing(listing(12)).Events; evs != nil {
		t.Fatalf("stale listing produced %v", types(evs))
	}
	// A newer listing that lacks c removes it.
	if got := types(s.ApplyListing(listing(20, mkEP(t, "web", "10.0.0.1", draining)))); !eq(got, []string{"ENDPOINT_REMOVED 10.0.0.3"}) {
		t.Fatalf("relist: %v", got)
	}
}

// A sync that reads the backend before a local write is flushed must not
// revert that write: the listing predates the write, so applying it would
// withdraw an endpoint the caller was told is registered, and the flush would
// bring it back a moment later.
func TestLocalWritesWinUntilPersisted(t *testing.T) {
	s := newStateForTest("e", 100, 100)
	s.ApplyListing(listing(10))
	a := mkEP(t, "web", "10.0.0.1")
	s.register(a, t0)
	// Pending: the backend does not have it yet.
	if evs := s.ApplyListing(listing(11)).Events; len(evs) != 0 {
		t.Fatalf("listing reverted a pending register: %v", types(evs))
	}
	b := s.TakeBatch(10, time.Time{})
	// In flight: same.
	if evs := s.ApplyListing(listing(12)).Events; len(evs) != 0 {
		t.Fatalf("listing reverted an in-flight register: %v", types(evs))
	}
	s.batchDone(b, 15)
	// Persisted at 15, but a listing taken at 14 (started before the flush)
	// does not have it yet: still no revert.
	if evs := s.ApplyListing(listing(14)).Events; len(evs) != 0 {
		t.Fatalf("stale listing reverted a persisted register: %v", types(evs))
	}
	// An older watch delete of the key is not applied either.
	if evs := s.ApplyWatch(backend.WatchBatch{Revision: 14, Events: []backend.Event{del(14, a)}}).Events; len(evs) != 0 {
		t.Fatalf("stale delete applied: %v", types(evs))
	}
	if s.Get(registry.IDOf(a)) == nil {
		t.Fatal("endpoint lost")
	}
	// Once the backend has caught up, its word counts again: another replica
	// deleted it at 16.
	if got := types(s.ApplyWatch(backend.WatchBatch{Revision: 16, Events: []backend.Event{put(15, a), del(16, a)}})); !eq(got, []string{"ENDPOINT_REMOVED 10.0.0.1"}) {
		t.Fatalf("after catch-up: %v", got)
	}
	if len(s.flushed) != 0 {
		t.Fatalf("flush revisions not pruned: %v", s.flushed)
	}
	// Unregister wins the same way: a listing that still has it does not
	// bring it back while the delete is pending.
	s.register(a, t0)
	s.batchDone(s.TakeBatch(10, time.Time{}), 17)
	s.ApplyListing(listing(17, a))
	s.unregister(registry.IDOf(a), time.Time{})
	if evs := s.ApplyListing(listing(18, a)).Events; len(evs) != 0 {
		t.Fatalf("listing resurrected a pending unregister: %v", types(evs))
	}
}

func TestHistorySince(t *testing.T) {
	s := newStateForTest("e", 3, 100)
	for _, ip := range []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5"} {
		svc := "web"
		if ip == "10.0.0.4" {
			svc = "db"
		}
		s.register(mkEP(t, svc, ip), t0)
	}
	// Window holds sequences 3..5.
	evs, ok := s.Since(2, nil)
	if !ok || len(evs) != 3 || evs[0].Sequence != 3 {
		t.Fatalf("since(2) = %v, %v", types(evs), ok)
	}
	if _, ok := s.Since(1, nil); ok {
		t.Fatal("since(1) must be outside the window")
	}
	if evs, ok := s.Since(5, nil); !ok || len(evs) != 0 {
		t.Fatalf("since(current) = %v, %v", evs, ok)
	}
	if _, ok := s.Since(6, nil); ok {
		t.Fatal("a future sequence must not resume")
	}
	f, _ := NewFilter([]string{"web"})
	evs, ok = s.Since(2, f)
	if !ok || !eq(types(evs), []string{"ENDPOINT_ADDED 10.0.0.3", "ENDPOINT_ADDED 10.0.0.5"}) {
		t.Fatalf("filtered since(2) = %v", types(evs))
	}
	snap, seq := s.Snapshot(f)
	if len(snap) != 4 || seq != 5 {
		t.Fatalf("filtered snapshot = %d endpoints at %d", len(snap), seq)
	}
}

func TestGhosts(t *testing.T) {
	s := newStateForTest("e", 100, 100)
	old := t0
	now := t0.Add(time.Minute)
	onNode := func(node string) func(*registryv1.ServiceEndpoint) {
		return func(e *registryv1.ServiceEndpoint) { e.Node = node }
	}
	s.register(mkEP(t, "web", "10.0.0.1", onNode("alive")), old)
	s.register(mkEP(t, "web", "10.0.0.2", onNode("dead")), old)
	s.register(mkEP(t, "web", "10.0.0.3"), old)                                   // no node: static
	s.register(mkEP(t, "web", "10.0.0.4", onNode("dead")), now.Add(-time.Second)) // too young
	s.register(mkEP(t, "web", "10.0.0.5", onNode("dead"), func(e *registryv1.ServiceEndpoint) { e.Cluster = "c2" }), old)
	s.register(mkEP(t, "web", "10.0.0.6", onNode("dead"), func(e *registryv1.ServiceEndpoint) { e.Region = "r2" }), old)
	s.NodePut(&registryv1.Node{Name: "alive", Region: "r", Cluster: "c"}, 5)
	got := s.ghosts("r", "c", now, 30*time.Second)
	if len(got) != 1 || got[0].IP != "10.0.0.2" {
		t.Fatalf("ghosts = %v, want only 10.0.0.2", got)
	}
	// A listing older than our node put does not forget the node.
	s.ApplyListing(listing(4))
	if len(s.ghosts("r", "c", now, 30*time.Second)) != 1 {
		t.Fatal("stale listing dropped a node we just wrote")
	}
	// A newer listing without it does.
	s.batchDone(s.TakeBatch(100, time.Time{}), 6)
	s.ApplyListing(listing(10, s.snapshotAll()...))
	if n := len(s.ghosts("r", "c", now, 30*time.Second)); n != 2 {
		t.Fatalf("after the node's record is gone: %d ghosts, want 2", n)
	}
}

func (s *State) snapshotAll() []*registryv1.ServiceEndpoint {
	eps, _ := s.Snapshot(nil)
	return eps
}

// TestNodeEndpointCounts drives the per-node counts of
// --max-endpoints-per-node through every way the snapshot changes: client
// writes, moves between nodes, unregistrations and backend reports.
func TestNodeEndpointCounts(t *testing.T) {
	on := func(node string) func(*registryv1.ServiceEndpoint) {
		return func(e *registryv1.ServiceEndpoint) { e.Node = node }
	}
	n := func(name string) registry.NodeID { return registry.NodeID{Region: "r", Cluster: "c", Name: name} }
	type step struct {
		do      func(t *testing.T, s *State) error
		wantErr string // substring of the error; "" for success
	}
	reg := func(svc, ip, node string) func(*testing.T, *State) error {
		return func(t *testing.T, s *State) error {
			_, _, err := s.register(mkEP(t, svc, ip, on(node)), t0)
			return err
		}
	}
	unreg := func(svc, ip string) func(*testing.T, *State) error {
		return func(t *testing.T, s *State) error {
			_, err := s.unregister(registry.IDOf(mkEP(t, svc, ip)), time.Time{})
			return err
		}
	}
	backend := func(rev int64, svc, ip, node string, gone bool) func(*testing.T, *State) error {
		return func(t *testing.T, s *State) error {
			e := backend.Event{Revision: rev, ID: registry.IDOf(mkEP(t, svc, ip))}
			if !gone {
				e.Endpoint = mkEP(t, svc, ip, on(node))
			}
			s.ApplyWatch(backend.WatchBatch{Revision: rev, Events: []backend.Event{e}})
			return nil
		}
	}
	cases := []struct {
		name  string
		max   int
		steps []step
		want  map[registry.NodeID]int
	}{
		{"adds count per node", 0, []step{
			{do: reg("web", "10.0.0.1", "n1")}, {do: reg("web", "10.0.0.2", "n1")}, {do: reg("db", "10.0.0.1", "n2")},
		}, map[registry.NodeID]int{n("n1"): 2, n("n2"): 1}},
		{"endpoints without a node are not counted", 0, []step{
			{do: reg("web", "10.0.0.1", "")}, {do: reg("web", "10.0.0.2", "n1")},
		}, map[registry.NodeID]int{n("n1"): 1}},
		{"update keeps the count", 0, []step{
			{do: reg("web", "10.0.0.1", "n1")},
			{do: func(t *testing.T, s *State) error {
				_, _, err := s.register(mkEP(t, "web", "10.0.0.1", on("n1"), draining), t0)
				return err
			}},
		}, map[registry.NodeID]int{n("n1"): 1}},
		{"move between nodes", 0, []step{
			{do: reg("web", "10.0.0.1", "n1")}, {do: reg("web", "10.0.0.1", "n2")},
		}, map[registry.NodeID]int{n("n2"): 1}},
		{"unregister decrements and forgets", 0, []step{
			{do: reg("web", "10.0.0.1", "n1")}, {do: reg("web", "10.0.0.2", "n1")},
			{do: unreg("web", "10.0.0.1")}, {do: unreg("web", "10.0.0.2")},
		}, map[registry.NodeID]int{}},
		{"backend adds and removes count", 0, []step{
			{do: backend(5, "web", "10.0.0.1", "n1", false)}, {do: backend(6, "web", "10.0.0.2", "n1", false)},
			{do: backend(7, "web", "10.0.0.1", "", true)},
		}, map[registry.NodeID]int{n("n1"): 1}},
		{"limit refuses a new endpoint", 2, []step{
			{do: reg("web", "10.0.0.1", "n1")}, {do: reg("web", "10.0.0.2", "n1")},
			{do: reg("web", "10.0.0.3", "n1"), wantErr: `node "n1" of region "r" cluster "c" already has 2 endpoints, the limit (--max-endpoints-per-node 2)`},
			{do: reg("web", "10.0.0.3", "n2")},
		}, map[registry.NodeID]int{n("n1"): 2, n("n2"): 1}},
		{"limit allows updates of existing endpoints", 1, []step{
			{do: reg("web", "10.0.0.1", "n1")},
			{do: func(t *testing.T, s *State) error {
				_, _, err := s.register(mkEP(t, "web", "10.0.0.1", on("n1"), draining), t0)
				return err
			}},
		}, map[registry.NodeID]int{n("n1"): 1}},
		{"limit frees a slot on unregister", 1, []step{
			{do: reg("web", "10.0.0.1", "n1")}, {do: unreg("web", "10.0.0.1")}, {do: reg("web", "10.0.0.2", "n1")},
		}, map[registry.NodeID]int{n("n1"): 1}},
		{"limit refuses a move onto a full node", 1, []step{
			{do: reg("web", "10.0.0.1", "n1")}, {do: reg("web", "10.0.0.2", "n2")},
			{do: reg("web", "10.0.0.2", "n1"), wantErr: "already has 1 endpoints"},
		}, map[registry.NodeID]int{n("n1"): 1, n("n2"): 1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newStateForTest("e", 100, 100)
			s.maxPerNode = c.max
			for i, st := range c.steps {
				seq := s.seq
				err := st.do(t, s)
				switch {
				case st.wantErr == "" && err != nil:
					t.Fatalf("step %d: %v", i, err)
				case st.wantErr != "":
					var nf *NodeFullError
					if !errors.As(err, &nf) || !strings.Contains(err.Error(), st.wantErr) {
						t.Fatalf("step %d: error %v, want a NodeFullError containing %q", i, err, st.wantErr)
					}
					if s.seq != seq {
						t.Fatalf("step %d: refused write changed the snapshot (seq %d -> %d)", i, seq, s.seq)
					}
				}
			}
			if len(s.byNode) != len(c.want) {
				t.Fatalf("byNode = %v, want %v", s.byNode, c.want)
			}
			for k, v := range c.want {
				if s.byNode[k] != v {
					t.Fatalf("byNode = %v, want %v", s.byNode, c.want)
				}
			}
		})
	}
}
