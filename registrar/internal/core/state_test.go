package core

import (
	"errors"
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

func listing(rev int64, eps ...*registryv1.ServiceEndpoint) backend.Listing {
	return backend.Listing{Endpoints: eps, Revision: rev}
}

func put(rev int64, ep *registryv1.ServiceEndpoint) backend.Event {
	return backend.Event{ID: registry.IDOf(ep), Endpoint: ep, Revision: rev}
}

func del(rev int64, ep *registryv1.ServiceEndpoint) backend.Event {
	return backend.Event{ID: registry.IDOf(ep), Revision: rev}
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
