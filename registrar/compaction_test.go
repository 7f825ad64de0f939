package registrar_test

import (
	"context"
	"strings"
	"testing"
	"time"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/faultproxy"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/registry"
	"github.com/aethermesh/aether/server"
)

func stripScheme(u string) string {
	return strings.TrimPrefix(strings.TrimPrefix(u, "http://"), "https://")
}

func TestCompactionDuringBrokenWatchResyncs(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	px, err := faultproxy.Start(stripScheme(etcd.Endpoints()[0]))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	// The poll backstop is pushed out of the way so only the watch's
	// compaction handling can bring the registrar back in step.
	s := startRegistrar(t, []string{"http://" + px.Addr()}, func(o *server.Config) {
		o.SyncInterval = time.Hour
		o.SyncDebounce = 10 * time.Millisecond
	})
	c := dial(t, s.GRPCAddr())
	register(t, c, ep("web", "10.0.0.1", 80))
	waitFor(t, "persisted", 10*time.Second, func() bool { return countKeys(t, cli) == 1 })
	w := watch(t, c, &registrarv1.WatchEndpointsRequest{})
	w.waitSnapshot(t)

	px.Cut()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Another cluster's endpoint appears, ours is deleted by someone else,
	// and history is compacted past all of it.
	foreign := &registryv1.ServiceEndpoint{Service: "web", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: "10.0.0.2",
		Ports: []*registryv1.Port{{Name: "http", Port: 80}}, Region: "r1", Cluster: "c2", State: registryv1.State_STATE_SERVING, Weight: 1}
	k, _ := registry.IDOf(foreign).Key()
	v, _ := registry.EncodeEndpoint(foreign)
	if _, err := cli.Put(ctx, k, string(v)); err != nil {
		t.Fatal(err)
	}
	own, _ := registry.EndpointID{Region: "r1", Cluster: "c1", Service: "web", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, IP: "10.0.0.1"}.Key()
	resp, err := cli.Delete(ctx, own)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ { // more revisions past the ones the registrar missed
		if _, err := cli.Put(ctx, "/unrelated", "x"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cli.Compact(ctx, resp.Header.Revision+5); err != nil {
		t.Fatal(err)
	}
	px.Heal()

	waitFor(t, "watcher sees the resync's changes", 20*time.Second, func() bool {
		return w.has("ADDED web 10.0.0.2") && w.has("REMOVED web 10.0.0.1")
	})
	l, err := c.ListAllEndpoints(ctx, &registrarv1.ListAllEndpointsRequest{})
	if err != nil || len(l.Endpoints) != 1 || l.Endpoints[0].Cluster != "c2" {
		t.Fatalf("after resync the registrar lists %v, %v", l.GetEndpoints(), err)
	}
}
