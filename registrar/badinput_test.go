package registrar_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
)

func TestBadInputIsRejectedAndChangesNothing(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	s := startRegistrar(t, etcd.Endpoints())
	c := dial(t, s.GRPCAddr())
	w := watch(t, c, &registrarv1.WatchEndpointsRequest{})
	w.waitSnapshot(t)

	cases := badInputCatalog(c)
	if len(cases) < 20 {
		t.Fatalf("only %d cases", len(cases))
	}
	runBadInput(t, cases)

	// Nothing was written: no event reached the watcher, the snapshot is
	// empty, and after a flush interval etcd holds no key.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// A valid write afterwards proves the pipeline was live all along.
	marker := register(t, c, ep("marker", "10.0.0.200", 80))
	waitFor(t, "marker persisted", 10*time.Second, func() bool { return countKeys(t, cli) >= 1 })
	if n := countKeys(t, cli); n != 1 {
		t.Fatalf("etcd holds %d keys, want only the marker", n)
	}
	l, err := c.ListAllEndpoints(ctx, &registrarv1.ListAllEndpointsRequest{})
	if err != nil || len(l.Endpoints) != 1 || !proto.Equal(l.Endpoints[0], marker.Endpoint) {
		t.Fatalf("snapshot = %v, %v; want only the marker", l.GetEndpoints(), err)
	}
	waitFor(t, "watcher sees the marker", 5*time.Second, func() bool { return w.has("ADDED marker 10.0.0.200") })
	if got := w.changes(); len(got) != 1 {
		t.Fatalf("watcher saw %v; bad input produced events", got)
	}
}
