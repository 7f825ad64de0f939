package client

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/registry"
	"github.com/aethermesh/aether/server"
)

// slowFlush makes a registrar persist the first write of a burst at once
// (the flusher is leading-edge) and the rest only after an hour, so a crash
// loses them: the acknowledged-but-not-persisted window, held open.
func slowFlush(o *server.Config) { o.WriteBatchInterval = time.Hour }

// persisted counts the endpoints of r1/c1 in etcd.
func persisted(t *testing.T, etcd *etcdtest.Cluster) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := etcd.Client(t).Get(ctx, registry.ServicesPrefix("r1", "c1"), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count
}

func find(eps []*registryv1.ServiceEndpoint, ip string) *registryv1.ServiceEndpoint {
	for _, e := range eps {
		if e.Ip == ip {
			return e
		}
	}
	return nil
}

// A registrar that crashes before persisting acknowledged registrations
// comes back without them; its FULL_SNAPSHOT of a new epoch shows the
// client what is missing, and the client registers exactly those again,
// without its own view (or OnChange) ever showing them gone. The second
// crash comes as soon as the re-assertions are acknowledged, before the
// client's stream has shown them (they are still in its overlay), and
// within the re-assertion backoff's quiet period: they are restored again.
func TestLostRegistrationsAreReasserted(t *testing.T) {
	// Whether a crash lands inside the window depends on how the
	// registrar's flusher happened to batch the writes before it, which a
	// loaded machine changes; an attempt that missed the window proves
	// nothing either way, so it is run again on a fresh cluster.
	const attempts = 3
	for attempt := 1; attempt <= attempts; attempt++ {
		var missed string
		t.Run(fmt.Sprintf("attempt%d", attempt), func(t *testing.T) { missed = lostRegistrationsScenario(t) })
		if missed == "" || t.Failed() {
			return
		}
		t.Logf("attempt %d: %s; again", attempt, missed)
	}
	t.Fatalf("%d attempts, and every one missed the acknowledged-but-not-persisted window; the test proved nothing", attempts)
}

// lostRegistrationsScenario runs TestLostRegistrationsAreReasserted's two
// crashes; it returns why, when a crash lost nothing to re-assert.
func lostRegistrationsScenario(t *testing.T) (missed string) {
	etcd := etcdtest.Start(t)
	addr := freeAddr(t)
	r := startRegistrar(t, etcd, addr, slowFlush)
	reg := prometheus.NewRegistry()
	rec := &recorder{}
	c := newClient(t, Config{Addrs: []string{addr}, Services: []string{"web"}, Registerer: reg, OnChange: rec.record})
	waitSynced(t, c)
	const n = 5
	// The first registration takes the leading-edge flush alone, so the
	// other four wait for the next flush, an hour off: the first crash
	// loses exactly them.
	for i := 1; i <= n; i++ {
		if err := c.Register(ep("web", fmt.Sprintf("10.0.0.%d", i), 80)); err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			waitFor(t, "the first registration persisted", 10*time.Second, func() bool { return persisted(t, etcd) == 1 })
		}
	}
	flush(t, c)
	// Settled: the stream showed every write, so none is in the overlay any
	// more; only ownership can bring one back.
	waitFor(t, "the writes settled", 10*time.Second, func() bool { return settled(c) && quiet(c) })
	mark := rec.len()

	var lostTotal int64
	before := int64(0)
	for round := 1; round <= 2; round++ {
		// The burst's one flush has landed, so no flush is in flight at
		// the crash and etcd's count after it is what the restart loads.
		waitFor(t, "the leading-edge flush", 10*time.Second, func() bool { return persisted(t, etcd) > before })
		r.crash(t)
		before = persisted(t, etcd)
		lost := n - int(before)
		if lost == 0 {
			// Round 2 only: the re-assertions all made the restarted
			// registrar's first flush.
			return fmt.Sprintf("round %d: the crash lost no acknowledged registration", round)
		}
		lostTotal += int64(lost)
		t.Logf("round %d: %d of %d acknowledged registrations lost in the crash", round, lost, n)
		r = startRegistrar(t, etcd, addr, slowFlush)
		cr := dial(t, r.GRPCAddr())
		waitFor(t, "every registration back at the restarted registrar", 10*time.Second, func() bool {
			return len(list(t, cr, "web")) == n
		})
		if got := c.Reasserted(); got != lostTotal {
			t.Errorf("round %d: Reasserted() = %d, want %d (exactly the lost ones)", round, got, lostTotal)
		}
	}
	if got := metricValue(t, reg, "agent_registrar_reasserted_total"); got != float64(lostTotal) {
		t.Errorf("agent_registrar_reasserted_total = %v, want %d", got, lostTotal)
	}
	waitFor(t, "the re-assertions settled", 10*time.Second, func() bool { return settled(c) && quiet(c) })
	if got := rec.since(mark); len(got) != 0 {
		t.Errorf("OnChange across the crashes got %v; the client's own registrations never left its view", got)
	}
	if got := len(allOf(t, c)); got != n {
		t.Errorf("the client's view holds %d endpoints, want %d", got, n)
	}
	return ""
}

// The rule, against one registrar: an operator's drain of an owned
// endpoint holds (and comes back DRAINING if the endpoint is then lost
// altogether); an operator's change of attributes and a removal the client
// did not ask for are undone; the client's own Unregister is never undone,
// not even by a registrar restart's snapshot.
func TestReassertionRule(t *testing.T) {
	etcd := etcdtest.Start(t)
	addr := freeAddr(t)
	a := startRegistrar(t, etcd, addr)
	op := dial(t, addr)
	c := newClient(t, Config{Addrs: []string{addr}, Services: []string{"web"}})
	waitSynced(t, c)
	for _, ip := range []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"} {
		if err := c.Register(ep("web", ip, 80)); err != nil {
			t.Fatal(err)
		}
	}
	flush(t, c)
	waitFor(t, "the writes settled", 10*time.Second, func() bool { return settled(c) })

	// An operator drains .1: the client sees it and leaves it so. The
	// decision is made as the event is applied, before the view shows it,
	// so once the view shows DRAINING with nothing pending, it is final.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := op.DrainEndpoint(ctx, &registrarv1.DrainEndpointRequest{Service: "web", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: "10.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the client sees the drain", 5*time.Second, func() bool {
		e := find(endpointsOf(t, c, "web"), "10.0.0.1")
		return e != nil && e.State == registryv1.State_STATE_DRAINING && settled(c)
	})
	if n := c.Reasserted(); n != 0 {
		t.Fatalf("an operator's drain was re-asserted away (%d re-assertions)", n)
	}

	// The client unregisters .2 itself.
	if err := c.Unregister(id("web", "10.0.0.2")); err != nil {
		t.Fatal(err)
	}
	flush(t, c)
	waitFor(t, "the unregister settled", 5*time.Second, func() bool { return settled(c) && find(list(t, op, "web"), "10.0.0.2") == nil })

	// An operator changes .3's weight: the owner's attributes come back.
	changed := ep("web", "10.0.0.3", 80)
	changed.Weight = 7
	register(t, op, changed)
	waitFor(t, "the owner's attributes restored", 5*time.Second, func() bool {
		e := find(list(t, op, "web"), "10.0.0.3")
		return e != nil && e.Weight != 7 && settled(c)
	})
	if n := c.Reasserted(); n != 1 {
		t.Fatalf("%d re-assertions after the weight change, want 1", n)
	}

	// .1 (drained by the operator) and .4 vanish from etcd behind the
	// registrar's back: REMOVED events the client did not ask for. Both
	// come back, .1 still DRAINING.
	waitFor(t, "everything persisted", 5*time.Second, func() bool { return a.Registrar().PendingWrites() == 0 })
	for _, ip := range []string{"10.0.0.1", "10.0.0.4"} {
		key, err := id("web", ip).Key()
		if err != nil {
			t.Fatal(err)
		}
		if resp, err := etcd.Client(t).Delete(ctx, key); err != nil || resp.Deleted != 1 {
			t.Fatalf("deleting %s from etcd: %v, %v", key, resp, err)
		}
	}
	// Until the registrar has seen the deletes, both are still listed: the
	// two re-assertions are what says the removals arrived.
	waitFor(t, "both re-asserted", 10*time.Second, func() bool {
		l := list(t, op, "web")
		return c.Reasserted() >= 3 && find(l, "10.0.0.1") != nil && find(l, "10.0.0.4") != nil && settled(c)
	})
	l := list(t, op, "web")
	if e := find(l, "10.0.0.1"); e == nil || e.State != registryv1.State_STATE_DRAINING {
		t.Errorf("the operator-drained endpoint came back as %v, want DRAINING", e)
	}
	if e := find(l, "10.0.0.4"); e == nil || e.State != registryv1.State_STATE_SERVING {
		t.Errorf("the removed endpoint came back as %v, want SERVING", e)
	}
	if n := c.Reasserted(); n != 3 {
		t.Fatalf("%d re-assertions, want 3", n)
	}

	// A restart: the new epoch's FULL_SNAPSHOT is compared in full, and
	// still .2 stays gone and .1 drained.
	waitFor(t, "everything persisted", 5*time.Second, func() bool { return a.Registrar().PendingWrites() == 0 })
	a.stop(t)
	b := startRegistrar(t, etcd, addr)
	cb := dial(t, b.GRPCAddr())
	waitFor(t, "the client resynced", 10*time.Second, func() bool {
		return c.Connected() && c.stats.fullSnapshots.Load() == 2 && settled(c)
	})
	l = list(t, cb, "web")
	if got := sorted(ips(l)...); !slices.Equal(got, []string{"web 10.0.0.1", "web 10.0.0.3", "web 10.0.0.4"}) {
		t.Errorf("after the restart the registrar holds %v", got)
	}
	if e := find(l, "10.0.0.1"); e == nil || e.State != registryv1.State_STATE_DRAINING {
		t.Errorf("after the restart .1 is %v, want DRAINING", e)
	}
	if n := c.Reasserted(); n != 3 {
		t.Errorf("%d re-assertions after a restart that lost nothing, want still 3", n)
	}
}

// An acknowledged Drain of the client's own is its intent: a registrar
// that lost the drain (and a registration) in a crash gets both back as the
// client last asked.
func TestOwnDrainIsReassertedDraining(t *testing.T) {
	etcd := etcdtest.Start(t)
	addr := freeAddr(t)
	a := startRegistrar(t, etcd, addr, slowFlush)
	c := newClient(t, Config{Addrs: []string{addr}, Services: []string{"web"}})
	waitSynced(t, c)
	// .1 is persisted at once (the flusher is leading-edge); everything
	// after it waits for the next flush, which the crash forestalls.
	if err := c.Register(ep("web", "10.0.0.1", 80)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ".1 persisted", 10*time.Second, func() bool { return persisted(t, etcd) == 1 })
	if err := c.Register(ep("web", "10.0.0.2", 80)); err != nil {
		t.Fatal(err)
	}
	if err := c.Drain(id("web", "10.0.0.1")); err != nil {
		t.Fatal(err)
	}
	flush(t, c)
	waitFor(t, "the writes settled", 10*time.Second, func() bool { return settled(c) })
	a.crash(t)
	// What the restarted registrar will load (the client may re-assert
	// before a listing of it could show this).
	key, err := id("web", "10.0.0.1").Key()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := etcd.Client(t).Get(ctx, registry.ServicesPrefix("r1", "c1"), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Key) != key {
		t.Fatalf("etcd holds %d endpoints after the crash; the test needs .1 alone", len(resp.Kvs))
	}
	if e, err := registry.DecodeEndpoint(key, resp.Kvs[0].Value); err != nil || e.State != registryv1.State_STATE_SERVING {
		t.Fatalf("etcd holds .1 as %v (%v); the test needs it SERVING, the drain lost", e, err)
	}
	b := startRegistrar(t, etcd, addr, slowFlush)
	cb := dial(t, b.GRPCAddr())
	waitFor(t, "the client's intents restored", 10*time.Second, func() bool {
		l := list(t, cb, "web")
		one, two := find(l, "10.0.0.1"), find(l, "10.0.0.2")
		return one != nil && one.State == registryv1.State_STATE_DRAINING && two != nil && two.State == registryv1.State_STATE_SERVING
	})
	if n := c.Reasserted(); n != 2 {
		t.Errorf("%d re-assertions, want 2 (the drain of .1, the registration of .2)", n)
	}
}

// Re-asserting one endpoint over and over backs off: the first goes out
// at once, the next within the quiet period waits the backoff, and a
// re-assertion after the quiet period goes out at once again. (State
// machine only: the timing is what is tested.)
func TestRepeatedReassertionBacksOff(t *testing.T) {
	s := newState([]string{"web"}, false)
	s.held["web"] = struct{}{}
	s.reassertQuiet = time.Minute
	var attempts []int
	s.reassertDelay = func(n int) time.Duration { attempts = append(attempts, n); return time.Duration(n+1) * time.Second }
	e := ep("web", "10.0.0.1", 80)
	e.Region, e.Cluster = "r1", "c1"
	i := id("web", "10.0.0.1")
	s.owned[i] = &ownership{}
	s.owned[i].set(e)
	removed := &registrarv1.EndpointEvent{Type: registrarv1.EndpointEvent_ENDPOINT_REMOVED, Endpoint: e}
	t0 := time.Now()
	ack := func() {
		w := s.writes[i]
		if w == nil || !w.reassert {
			t.Fatalf("no re-assertion queued: %+v", w)
		}
		delete(s.writes, i)
		s.queue = nil
	}

	s.reconcile(i, t0, false) // the registrar lacks it
	ack()
	s.applyEvent(removed, time.Now()) // lost again at once
	if s.writes[i] != nil || s.due[i].IsZero() {
		t.Fatalf("a second re-assertion within the quiet period went out at once (due %v)", s.due[i])
	}
	if !s.dueChanged {
		t.Fatal("a re-assertion was scheduled without telling the writer to look at its timer again")
	}
	if got := s.nextDue(); got.Before(t0) {
		t.Fatalf("nextDue = %v", got)
	}
	s.fireDue(s.due[i])
	ack()
	if !slices.Equal(attempts, []int{0}) {
		t.Fatalf("backoff attempts %v, want [0]", attempts)
	}
	s.applyEvent(removed, time.Now())
	s.fireDue(s.due[i])
	ack()
	if !slices.Equal(attempts, []int{0, 1}) {
		t.Fatalf("backoff attempts %v, want [0 1]", attempts)
	}
	// After the quiet period: at once.
	s.owned[i].last = t0.Add(-time.Hour)
	s.applyEvent(removed, time.Now())
	ack()
	if len(s.due) != 0 || len(attempts) != 2 {
		t.Fatalf("after the quiet period: due %v, attempts %v", s.due, attempts)
	}
	if got := len(s.takeReasserted()); got != 4 {
		t.Fatalf("%d re-assertions counted, want 4", got)
	}
}
