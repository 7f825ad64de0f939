package registrar_test

import (
	"context"
	"testing"
	"time"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/faultproxy"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/internal/testutil/watchcheck"
)

// Subscribe streams change their services while writers are busy; each is
// recorded with the updates its client sent and judged by watchcheck against
// the filter in force at every sequence: an added service arrives as a
// SERVICES_SNAPSHOT exactly as of the point the update took effect, then
// all its events; a removed one stops getting events there; nothing is lost
// or repeated across the change. One stream is cut off and resumes with its
// token, adding a service right after the start as the client library does.
func TestGuaranteeSubscribeServiceChanges(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	s := startRegistrar(t, etcd.Endpoints(), fastProgress)
	c := dial(t, s.GRPCAddr())
	px, err := faultproxy.Start(s.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	ref := reference(t, c)
	var acks ackLog
	runWriters(t, c, 0, 2, 40, "", &acks)

	sc := dial(t, s.GRPCAddr())
	subscribe := func(c registrarv1.RegistrarClient, name string, req *registrarv1.WatchEndpointsRequest) *watchcheck.Recorder {
		t.Helper()
		r, err := watchcheck.Subscribe(context.Background(), c, name, req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Cancel)
		return r
	}
	update := func(r *watchcheck.Recorder, add, remove []string) {
		t.Helper()
		if err := r.Update(add, remove); err != nil {
			t.Fatalf("update %s: %v", r.Name, err)
		}
	}
	grow := subscribe(sc, "grow-shrink", &registrarv1.WatchEndpointsRequest{Services: []string{"web"}})
	toggle := subscribe(sc, "toggle", &registrarv1.WatchEndpointsRequest{Services: []string{"auth"}})
	cut := subscribe(dial(t, px.Addr()), "cut", &registrarv1.WatchEndpointsRequest{Services: []string{"web", "db"}})
	for _, r := range []*watchcheck.Recorder{grow, toggle, cut} {
		if !r.WaitCovered(0, 10*time.Second) {
			t.Fatalf("%s got no snapshot", r.Name)
		}
	}

	// Writers run throughout; the updates land between their writes.
	stopWriters := backgroundWriters(c, 2, 2, &acks)
	more := func(n int) {
		t.Helper()
		at := len(acks.All())
		waitFor(t, "more writes", 10*time.Second, func() bool { return len(acks.All()) >= at+n })
	}
	more(30)
	update(grow, []string{"db", "cache"}, nil)
	more(30)
	update(grow, nil, []string{"web"}) // remove only: no marker
	more(30)
	update(grow, []string{"web"}, []string{"db"}) // a swap, pinned by web's snapshot
	for i := 0; i < 10; i++ {
		svc := guaranteeServices[i%3]
		update(toggle, []string{svc}, nil)
		more(5)
		update(toggle, nil, []string{svc})
	}
	update(toggle, []string{"web", "db"}, []string{"auth"})

	px.Cut()
	waitFor(t, "the cut stream ends", 10*time.Second, func() bool { done, _ := cut.Ended(); return done })
	more(30)
	px.Heal()
	resumed := subscribe(dial(t, px.Addr()), "cut-resumed", &registrarv1.WatchEndpointsRequest{Services: cut.Services, LastVersion: cut.LastToken()})
	resumed.ExpectResume = true
	update(resumed, []string{"auth"}, nil)
	more(30)
	if err := stopWriters(); err != nil {
		t.Fatal(err)
	}

	// An atomic write of another cluster across services: a services
	// snapshot never splits it.
	base, _ := ref.Covered()
	batch := []*registryv1.ServiceEndpoint{foreignEP("web", "10.9.4.1"), foreignEP("cache", "10.9.4.2"), foreignEP("auth", "10.9.4.3")}
	foreignTxn(t, cli, batch...)
	update(grow, []string{"auth"}, nil)
	runWriters(t, c, 150, 2, 20, "", &acks)

	streams := []*watchcheck.Recorder{grow, toggle, cut, resumed}
	h := checkGuarantees(t, c, ref, acks.All(), []batchSpec{{after: base, eps: batch}}, streams...)
	alive(t, grow, toggle, resumed)

	snaps := map[string]int{}
	for _, r := range streams {
		for _, m := range r.Messages() {
			if m.Type == registrarv1.EndpointEvent_SERVICES_SNAPSHOT {
				snaps[r.Name]++
			}
		}
	}
	if snaps["grow-shrink"] < 3 || snaps["toggle"] < 11 || snaps["cut-resumed"] != 1 {
		t.Fatalf("services snapshots per stream %v: the updates did not all take effect", snaps)
	}
	// Not vacuous: the same history catches a lost services snapshot.
	for i, m := range grow.Messages() {
		if m.Type == registrarv1.EndpointEvent_SERVICES_SNAPSHOT && len(m.Endpoints) > 0 {
			if len(watchcheck.Check(h, grow.Without(i))) == 0 {
				t.Fatal("the checker missed a lost services snapshot")
			}
			break
		}
	}
}
