package registrar_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/internal/testutil/watchcheck"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/registry"
	"github.com/aethermesh/aether/server"
)

// A registrar restarted on the same etcd (or the same data dir, with its
// embedded etcd) is a new incarnation with a new epoch. Its streams end
// with UNAVAILABLE; clients come back with tokens of the old epoch and must
// get a FULL_SNAPSHOT of the new one whose content is exactly the state: no
// write the old incarnation acknowledged is lost (including writes answered
// while it was shutting down, after its streams had ended), and nothing it
// removed comes back. watchcheck.CheckEpochs judges both incarnations'
// streams and the switch between them.
func TestGuaranteeRegistrarRestart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		embedded bool
	}{{"ExternalEtcd", false}, {"EmbeddedEtcdSameDataDir", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var opts func(*server.Config)
			if tc.embedded {
				dir := t.TempDir()
				opts = func(o *server.Config) {
					o.EtcdEndpoints, o.DataDir = nil, dir
					o.EmbeddedEtcdAddr, o.EmbeddedEtcdPeerAddr = "127.0.0.1:0", "127.0.0.1:0"
				}
			} else {
				etcd := etcdtest.Start(t)
				opts = func(o *server.Config) { o.EtcdEndpoints = etcd.Endpoints() }
			}
			testRestart(t, opts)
		})
	}
}

func testRestart(t *testing.T, backend func(*server.Config)) {
	// The first incarnation binds a port of its own choosing, which no
	// other test can take before it does; the restart reuses it.
	s1 := startAt(t, "127.0.0.1:0", backend)
	addr := s1.GRPCAddr()
	c := dial(t, addr) // one connection across the restart, as a client has
	ref1 := reference(t, c)
	old := filteredStreams(t, dial(t, addr), "e1-")
	var acks ackLog
	runWriters(t, c, 0, 3, 60, "", &acks)

	// Writers keep going while the registrar shuts down: every write it
	// answered must survive, even those answered after its streams ended.
	wc := dial(t, addr)
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	before := len(acks.All())
	for w := 3; w < 5; w++ {
		wg.Go(func() {
			// Until the registrar refuses: a refused write was never
			// applied, so every write's outcome is known.
			err := churn(wc, w, 1_000_000, "", &acks)
			if err == nil || status.Code(err) != codes.Unavailable {
				errs <- fmt.Errorf("writer %d: %v", w, err)
			}
		})
	}
	waitFor(t, "writes during the run-up to the restart", 10*time.Second, func() bool { return len(acks.All()) >= before+100 })
	closeServer(t, s1)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("a writer failed otherwise than by the registrar going away: %v", err)
	}
	for _, r := range append(old, ref1) {
		// The server has ended the stream once Close returns; the client's
		// Recv learns it a moment later, on its own goroutine.
		waitFor(t, "stream "+r.Name+" of the stopped registrar ends", 10*time.Second, func() bool { done, _ := r.Ended(); return done })
		if done, err := r.Ended(); !done || status.Code(err) != codes.Unavailable {
			t.Fatalf("stream %s of the stopped registrar: ended %v with %v, want UNAVAILABLE", r.Name, done, err)
		}
	}

	s2 := startAt(t, addr, backend)
	ref2 := reference(t, c)
	// Clients come back with the old epoch's tokens: each must start over
	// with a snapshot of the new epoch, and then follow it.
	var back []*watchcheck.Recorder
	rc := dial(t, addr)
	for _, r := range old {
		back = append(back, guarded(t, rc, r.Name+"-back", &registrarv1.WatchEndpointsRequest{Services: r.Services, LastVersion: r.LastToken()}))
	}
	// A token of the old epoch that the new one's sequence has not reached
	// must not be mistaken for a position in it either.
	e1, _, _ := watchcheck.ParseVersion(ref1.LastToken())
	back = append(back, guarded(t, rc, "old-epoch-low-token", &registrarv1.WatchEndpointsRequest{LastVersion: e1 + ":1"}))
	fresh := filteredStreams(t, dial(t, addr), "e2-")
	runWriters(t, c, 5, 3, 60, "", &acks)

	var acks1, acks2 []watchcheck.Ack
	h1, vs := watchcheck.HistoryFrom(ref1)
	for _, a := range acks.All() {
		if e, _, _ := watchcheck.ParseVersion(a.Version); e == h1.Epoch {
			acks1 = append(acks1, a)
		} else {
			acks2 = append(acks2, a)
		}
	}
	h1.Acks = acks1
	h2, vs := currentHistory(t, c, ref2, acks2, append(back, fresh...)...)
	if len(vs) > 0 {
		t.Fatalf("reference: %s", watchcheck.Summary(vs))
	}
	if h1.Epoch == h2.Epoch {
		t.Fatalf("the restarted registrar kept epoch %s", h1.Epoch)
	}
	late := 0
	for _, a := range acks1 {
		if _, seq, _ := watchcheck.ParseVersion(a.Version); seq > h1.Last() {
			late++
		}
	}
	epochs := []watchcheck.Epoch{{History: h1, Streams: old}, {History: h2, Streams: append(back, fresh...)}}
	vs = append(vs, watchcheck.CheckEpochs(epochs...)...)
	if len(vs) > 0 {
		t.Fatalf("%d guarantee violations:\n%s", len(vs), watchcheck.Summary(vs))
	}
	for _, r := range back {
		if m := r.Messages(); len(m) == 0 || m[0].Type != registrarv1.EndpointEvent_FULL_SNAPSHOT {
			t.Fatalf("stream %s resumed with an old epoch's token did not start with a snapshot", r.Name)
		}
	}
	alive(t, append(back, fresh...)...)

	// Not vacuous: the same histories catch a new epoch that lost one
	// acknowledged endpoint.
	lost := h2
	lost.BaseState = lost.BaseState[1:]
	found := false
	for _, v := range watchcheck.CheckEpochs(watchcheck.Epoch{History: h1}, watchcheck.Epoch{History: lost}) {
		found = found || v.Property == watchcheck.Durable
	}
	if !found {
		t.Fatal("the checker missed an endpoint lost across the restart")
	}

	// What the registrar serves is what etcd holds.
	waitFor(t, "writes persisted", 10*time.Second, func() bool { return s2.Registrar().PendingWrites() == 0 })
	if d := etcdDiff(t, s2.EtcdClient(), h2.Final); d != "" {
		t.Fatalf("etcd differs from the registrar's listing: %s", d)
	}
	t.Logf("epoch %s: %d events, %d acks (%d answered after its streams ended); epoch %s starts from %d endpoints; %d streams came back",
		h1.Epoch, len(h1.Events), len(acks1), late, h2.Epoch, len(h2.BaseState), len(back))
}

// etcdDiff compares the endpoints stored in etcd with want.
func etcdDiff(t *testing.T, cli *clientv3.Client, want []*registryv1.ServiceEndpoint) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, registry.Root, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*registryv1.ServiceEndpoint{}
	for _, kv := range resp.Kvs {
		e, err := registry.DecodeEndpoint(string(kv.Key), kv.Value)
		if err != nil {
			continue // node records and other keys
		}
		got[string(kv.Key)] = e
	}
	for _, w := range want {
		k, _ := registry.IDOf(w).Key()
		g, ok := got[k]
		switch {
		case !ok:
			return "missing " + k
		case !proto.Equal(g, w):
			return "different value at " + k
		}
		delete(got, k)
	}
	for k := range got {
		return "unexpected " + k
	}
	return ""
}

// startAt starts a registrar serving gRPC at addr (region r1, cluster c1),
// retrying while the address is still held, e.g. by the previous
// incarnation's sockets.
func startAt(t *testing.T, addr string, mut ...func(*server.Config)) *server.Server {
	t.Helper()
	o := server.Config{GRPCAddr: addr, HTTPAddr: "127.0.0.1:0", Options: registrar.Options{ClusterName: "c1", Region: "r1", Logger: quietLogger()}}
	o.ProgressInterval = 50 * time.Millisecond
	o.NodeTTL = testNodeTTL
	for _, m := range mut {
		m(&o)
	}
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		s, err := server.Start(ctx, o)
		cancel()
		if err == nil {
			t.Cleanup(func() { closeServer(t, s) })
			return s
		}
		if !errors.Is(err, syscall.EADDRINUSE) || attempt == 50 {
			t.Fatalf("starting a registrar at %s: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// closeServer shuts a registrar down gracefully (a second call does
// nothing).
func closeServer(t *testing.T, s *server.Server) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Close(ctx); err != nil {
		t.Errorf("closing the registrar at %s: %v", s.GRPCAddr(), err)
	}
}
