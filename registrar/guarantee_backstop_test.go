package registrar_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/internal/testutil/watchcheck"
	"github.com/aethermesh/aether/server"
)

// B re-lists a registry of several thousand endpoints every 20 ms, in the
// background and applied in steps with the watch let in between, while A's
// writers and another cluster's transaction keep changing it: every
// guarantee holds on B's streams, and B ends exactly where A is.
func TestGuaranteeBackstopListingBesideTheWatch(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	// Enough endpoints, over enough services, that one listing takes
	// several steps to apply.
	for chunk := 0; chunk < 50; chunk++ {
		var eps []*registryv1.ServiceEndpoint
		for i := 0; i < 100; i++ {
			n := chunk*100 + i
			eps = append(eps, foreignEP(fmt.Sprintf("bulk-%d", n%40), fmt.Sprintf("10.50.%d.%d", n/250, n%250)))
		}
		foreignTxn(t, cli, eps...)
	}
	a := startRegistrar(t, etcd.Endpoints(), fastProgress)
	b := startRegistrar(t, etcd.Endpoints(), fastProgress, func(o *server.Config) { o.SyncInterval = 20 * time.Millisecond })
	ca, cb := dial(t, a.GRPCAddr()), dial(t, b.GRPCAddr())
	refA, refB := reference(t, ca), reference(t, cb)
	onB := filteredStreams(t, dial(t, b.GRPCAddr()), "B-")
	listsBefore := metricValue(t, b.HTTPAddr(), "registrar_sync_duration_seconds_count")

	var acks ackLog
	runWriters(t, ca, 0, 4, 300, "", &acks)
	baseB, _ := refB.Covered()
	batch := []*registryv1.ServiceEndpoint{foreignEP("web", "10.9.3.1"), foreignEP("db", "10.9.3.2")}
	foreignTxn(t, cli, batch...)
	runWriters(t, ca, 4, 2, 100, "", &acks)

	waitSameListing(t, "B converges on A's state", ca, cb)
	if n := metricValue(t, b.HTTPAddr(), "registrar_sync_duration_seconds_count") - listsBefore; n < 3 {
		t.Fatalf("B listed the backend %v times during the writes; the test needs the backstop running", n)
	}
	hA := checkGuarantees(t, ca, refA, acks.All(), nil)
	hB := checkGuarantees(t, cb, refB, nil, []batchSpec{{after: baseB, eps: batch}}, onB...)
	alive(t, onB...)

	// B's own history is consistent with itself; judged against A's, it
	// must also never go back: a listing applied over newer watch changes
	// would flap endpoints to older values and back.
	l, err := cb.ListAllEndpoints(context.Background(), &registrarv1.ListAllEndpointsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	in := map[string]bool{}
	for _, s := range guaranteeServices {
		in[s] = true
	}
	view := watchcheck.View{Name: "B's view of A's services", Services: guaranteeServices}
	for _, e := range l.Endpoints {
		if in[e.Service] {
			view.Final = append(view.Final, e)
		}
	}
	for _, ev := range hB.Events {
		if in[ev.Endpoint.GetService()] {
			view.Changes = append(view.Changes, watchcheck.ViewChange{Type: ev.Type, Endpoint: ev.Endpoint})
		}
	}
	if vs := watchcheck.CheckView([]watchcheck.History{hA}, view); len(vs) > 0 {
		t.Fatalf("%d violations:\n%s", len(vs), watchcheck.Summary(vs))
	}
}
