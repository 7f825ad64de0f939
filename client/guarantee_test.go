package client

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/faultproxy"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/internal/testutil/watchcheck"
)

// What the client library delivers (OnChange, and the cache it describes)
// is judged against the registrar's authoritative history, through a
// connection cut that resumes inside the retention window and a registrar
// restart that cannot be resumed (new epoch: the client diffs a
// FULL_SNAPSHOT against its cache), with the agent's own writes queued
// across both, and one client subscribing to another service while cut
// off. Writers churn the registrar throughout, and the clients miss some of
// their changes during each fault.
//
// The histories come from reference streams on the registrar, validated by
// watchcheck.CheckEpochs (including that the restarted registrar starts
// exactly where the old one ended). Each client's changes must then pass
// watchcheck.CheckView: they replay (no duplicate ADDED, no REMOVED or
// UPDATED of an endpoint not held, no empty UPDATED), each endpoint only
// moves forward through the values the history gave it (nothing stale,
// nothing invented, no flapping across the snapshot diff), and the cache
// ends equal to the registrar's listing.
func TestGuaranteeClientViewUnderFaults(t *testing.T) {
	etcd := etcdtest.Start(t)
	addr := freeAddr(t)
	a := startRegistrar(t, etcd, addr)
	rc := dial(t, addr)
	px, err := faultproxy.Start(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = px.Close() })
	ref1 := referenceStream(t, rc, "reference-1")

	views := []*viewRecorder{{name: "client-all"}, {name: "client-some", services: []string{"web", "db"}}}
	var clients []*Client
	for i, v := range views {
		c := newClient(t, Config{Addrs: []string{px.Addr()}, Services: v.services, Node: fmt.Sprintf("agent-%d", i), OnChange: v.record})
		clients = append(clients, c)
	}
	agent := clients[0] // writes its own endpoints, in service "web"
	for _, c := range clients {
		waitSynced(t, c)
	}
	var acks watchcheck.AckLog
	churnAll(t, rc, 0, 2, 40, &acks)

	// A connection cut inside the retention window: the clients resume.
	px.Cut()
	waitFor(t, "clients disconnected", 5*time.Second, func() bool { return !clients[0].Connected() && !clients[1].Connected() })
	churnAll(t, rc, 2, 2, 40, &acks)
	// Subscribing while cut off: the stream resumes with the services held
	// and cache comes as a services snapshot.
	if err := clients[1].Subscribe("cache"); err != nil {
		t.Fatal(err)
	}
	views[1].services = append(views[1].services, "cache")
	for i := 1; i <= 3; i++ {
		if err := agent.Register(ep("web", fmt.Sprintf("10.200.0.%d", i), 80)); err != nil {
			t.Fatal(err)
		}
	}
	px.Heal()
	waitFor(t, "clients resumed", 10*time.Second, func() bool {
		return clients[0].Connected() && clients[1].Connected() && clients[0].stats.resumes.Load() == 1 && clients[1].stats.resumes.Load() == 1
	})
	flush(t, agent)
	churnAll(t, rc, 4, 2, 40, &acks)

	// A restart: the clients are cut off first, miss changes in both
	// epochs, and the agent writes while the registrar is down.
	px.Cut()
	waitFor(t, "clients disconnected", 5*time.Second, func() bool { return !clients[0].Connected() && !clients[1].Connected() })
	churnAll(t, rc, 6, 2, 40, &acks)
	a.stop(t)
	if err := agent.Register(ep("web", "10.200.0.9", 80)); err != nil {
		t.Fatal(err)
	}
	if err := agent.Unregister(id("web", "10.200.0.2")); err != nil {
		t.Fatal(err)
	}
	if err := agent.Register(ep("web", "10.200.0.3", 8080)); err != nil { // an update
		t.Fatal(err)
	}
	a2 := startRegistrar(t, etcd, addr)
	ref2 := referenceStream(t, rc, "reference-2")
	churnAll(t, rc, 8, 2, 40, &acks)
	px.Heal()
	flush(t, agent)
	churnAll(t, rc, 10, 2, 40, &acks)

	// Converged: every client's cache equals the registrar's listing.
	lc, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	final, err := rc.ListAllEndpoints(lc, &registrarv1.ListAllEndpointsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range clients {
		want := final.Endpoints
		if s := views[i].services; s != nil {
			want = slices.DeleteFunc(slices.Clone(want), func(e *registryv1.ServiceEndpoint) bool { return !slices.Contains(s, e.Service) })
		}
		waitFor(t, views[i].name+" converged on the registrar's listing", 15*time.Second, func() bool {
			return c.Connected() && settled(c) && quiet(c) && cached(c, "cache") && sameEndpoints(allOf(t, c), want)
		})
	}
	_, finalSeq, _ := watchcheck.ParseVersion(final.Version)
	if !ref2.WaitCovered(finalSeq, 10*time.Second) {
		t.Fatal("reference-2 did not reach the final listing")
	}

	h1, vs := watchcheck.HistoryFrom(ref1)
	h2, vs2 := watchcheck.HistoryFrom(ref2)
	vs = append(vs, vs2...)
	for _, a := range acks.All() {
		if e, _, _ := watchcheck.ParseVersion(a.Version); e == h1.Epoch {
			h1.Acks = append(h1.Acks, a)
		} else {
			h2.Acks = append(h2.Acks, a)
		}
	}
	h2.Final, h2.FinalVersion = final.Endpoints, final.Version
	vs = append(vs, watchcheck.CheckEpochs(watchcheck.Epoch{History: h1}, watchcheck.Epoch{History: h2})...)
	if len(vs) > 0 {
		t.Fatalf("the reference histories are inconsistent:\n%s", watchcheck.Summary(vs))
	}
	if h1.Epoch == h2.Epoch {
		t.Fatal("the restarted registrar kept its epoch")
	}
	hs := []watchcheck.History{h1, h2}
	for i, v := range views {
		view := v.view(allOf(t, clients[i]))
		if vs := watchcheck.CheckView(hs, view); len(vs) > 0 {
			t.Fatalf("%s delivered an inconsistent view:\n%s", v.name, watchcheck.Summary(vs))
		}
		t.Logf("%s: %d changes checked against %d+%d events; %d full snapshots, %d resumes",
			v.name, len(view.Changes), len(h1.Events), len(h2.Events), clients[i].stats.fullSnapshots.Load(), clients[i].stats.resumes.Load())
		// Not vacuous: the same histories catch one change dropped.
		if n := len(view.Changes); n > 2 {
			view.Changes = slices.Delete(view.Changes, n/2, n/2+1)
			if len(watchcheck.CheckView(hs, view)) == 0 {
				t.Fatalf("the checker missed a change dropped from %s", v.name)
			}
		}
	}
	for i, c := range clients {
		// The initial snapshot and the restart's; the cut resumed.
		if n := c.stats.fullSnapshots.Load(); n != 2 {
			t.Errorf("%s applied %d full snapshots, want 2", views[i].name, n)
		}
		if n := c.stats.resumes.Load(); n != 1 {
			t.Errorf("%s resumed %d times, want once (after the cut)", views[i].name, n)
		}
	}
	// The agent's writes made while the registrar was down are in etcd.
	waitFor(t, "writes persisted", 10*time.Second, func() bool { return a2.Registrar().PendingWrites() == 0 })
	got := map[string]uint32{}
	for _, e := range list(t, dial(t, a2.GRPCAddr()), "web") {
		if slices.Contains([]string{"10.200.0.1", "10.200.0.2", "10.200.0.3", "10.200.0.9"}, e.Ip) {
			got[e.Ip] = e.Ports[0].Port
		}
	}
	if want := map[string]uint32{"10.200.0.1": 80, "10.200.0.3": 8080, "10.200.0.9": 80}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("the agent's endpoints after the restart: %v, want %v", got, want)
	}
}

// viewRecorder keeps every change a client's OnChange delivered.
type viewRecorder struct {
	name     string
	services []string
	mu       sync.Mutex
	changes  []watchcheck.ViewChange
}

func (v *viewRecorder) record(ch Change) {
	typ := map[ChangeType]registrarv1.EndpointEvent_EventType{
		ChangeAdded:   registrarv1.EndpointEvent_ENDPOINT_ADDED,
		ChangeUpdated: registrarv1.EndpointEvent_ENDPOINT_UPDATED,
		ChangeRemoved: registrarv1.EndpointEvent_ENDPOINT_REMOVED,
	}[ch.Type]
	v.mu.Lock()
	v.changes = append(v.changes, watchcheck.ViewChange{Type: typ, Endpoint: ch.Endpoint, Previous: ch.Previous})
	v.mu.Unlock()
}

func (v *viewRecorder) view(final []*registryv1.ServiceEndpoint) watchcheck.View {
	v.mu.Lock()
	defer v.mu.Unlock()
	return watchcheck.View{Name: v.name, Services: v.services, Changes: slices.Clone(v.changes), Final: final}
}

// referenceStream opens an unfiltered stream and waits for its snapshot.
func referenceStream(t *testing.T, c registrarv1.RegistrarClient, name string) *watchcheck.Recorder {
	t.Helper()
	r, err := watchcheck.Watch(context.Background(), c, name, &registrarv1.WatchEndpointsRequest{NodeName: name})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Cancel)
	if !r.WaitCovered(0, 10*time.Second) {
		t.Fatalf("%s got no snapshot", name)
	}
	return r
}

func flush(t *testing.T, c *Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}

// churnAll runs writers first..first+writers-1 concurrently, each
// registering, updating and unregistering n endpoints of its own across
// web, db, cache and auth, straight through the registrar's API.
func churnAll(t *testing.T, c registrarv1.RegistrarClient, first, writers, n int, acks *watchcheck.AckLog) {
	t.Helper()
	ws := watchcheck.Writers{Region: "r1", Cluster: "c1", Services: []string{"web", "db", "cache", "auth"},
		New: func(_ int, svc, ip string) *registryv1.ServiceEndpoint {
			e := ep(svc, ip, 80)
			e.Node = "" // static: no node, never swept
			return e
		}}
	if err := ws.Run(c, first, writers, n, acks); err != nil {
		t.Fatal(err)
	}
}
