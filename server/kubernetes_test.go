package server_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/kubeapi"
	"github.com/aethermesh/aether/internal/testutil/regtest"
	"github.com/aethermesh/aether/internal/testutil/watchcheck"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/server"
)

// kubeConfig is a registrar of r1/c1 on the API server of kubeconfig, in
// namespace ns, installing the CRDs.
func kubeConfig(kubeconfig, ns string) server.Config {
	return server.Config{
		Backend: server.BackendKubernetes, Kubeconfig: kubeconfig, KubernetesNamespace: ns, KubernetesInstallCRDs: true,
		Options: registrar.Options{ClusterName: "c1", Region: "r1"},
	}
}

// guardedStream is a recorded watch stream the test's cleanup cancels.
func guardedStream(t *testing.T, c registrarv1.RegistrarClient, name string, req *registrarv1.WatchEndpointsRequest) *watchcheck.Recorder {
	t.Helper()
	r, err := watchcheck.Watch(context.Background(), c, name, req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Cancel)
	return r
}

// TestKubernetesTwoReplicas: two registrars on one real kube-apiserver see
// each other's writes through it (cross-replica propagation, timed), and
// the watch streams of the replica that did not take the writes keep
// every guarantee the watch checker knows, against that replica's own
// history; the checker is shown to catch a change dropped from them.
func TestKubernetesTwoReplicas(t *testing.T) {
	api := kubeapi.Start(t)
	cfg := kubeConfig(api.Kubeconfig, "default")
	a, b := regtest.Start(t, cfg), regtest.Start(t, cfg)
	if mode := b.Registrar().Options().SyncMode; mode != registrar.SyncWatch {
		t.Fatalf("sync mode on kubernetes = %q, want %q (the store has a change feed)", mode, registrar.SyncWatch)
	}
	ca, cb := dial(t, a.GRPCAddr()), dial(t, b.GRPCAddr())
	ref := guardedStream(t, cb, "reference", &registrarv1.WatchEndpointsRequest{NodeName: "reference"})
	if !ref.WaitCovered(0, 10*time.Second) {
		t.Fatal("reference stream got no snapshot")
	}
	streams := []*watchcheck.Recorder{
		guardedStream(t, cb, "b-all", &registrarv1.WatchEndpointsRequest{}),
		guardedStream(t, cb, "b-web", &registrarv1.WatchEndpointsRequest{Services: []string{"web"}}),
		guardedStream(t, cb, "b-db+cache", &registrarv1.WatchEndpointsRequest{Services: []string{"db", "cache"}}),
	}

	// Propagation: a registration on A, until B's reference stream has it.
	var lat []time.Duration
	for i := 1; i <= 10; i++ {
		ip := fmt.Sprintf("10.9.0.%d", i)
		start := time.Now()
		register(t, ca, ep("web", ip, 80))
		waitFor(t, "B's stream to deliver "+ip, 30*time.Second, func() bool { return streamHas(ref, ip) })
		lat = append(lat, time.Since(start))
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	t.Logf("cross-replica propagation A->B through the API server, 10 registrations: p50 %v, max %v (write-behind interval %v)",
		lat[len(lat)/2].Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond), a.Registrar().Options().WriteBatchInterval)

	// Churn on A: registrations, updates, removals over four services.
	w := watchcheck.Writers{Region: "r1", Cluster: "c1", Services: []string{"web", "db", "cache", "auth"},
		New: func(w int, svc, ip string) *registryv1.ServiceEndpoint {
			e := ep(svc, ip, 80)
			e.Metadata = map[string]string{"w": fmt.Sprint(w)}
			return e
		}}
	var acks watchcheck.AckLog
	if err := w.Run(ca, 0, 3, 30, &acks); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "A's churn to persist", 30*time.Second, func() bool { return a.Registrar().PendingWrites() == 0 })
	waitFor(t, "B to list what A lists", 30*time.Second, func() bool { return listing(t, ca) == listing(t, cb) })

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := cb.ListAllEndpoints(ctx, &registrarv1.ListAllEndpointsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	_, final, err := watchcheck.ParseVersion(l.Version)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range append([]*watchcheck.Recorder{ref}, streams...) {
		if !s.WaitCovered(final, 20*time.Second) {
			got, _ := s.Covered()
			t.Fatalf("stream %s stuck at %d, want %d", s.Name, got, final)
		}
	}
	h, vs := watchcheck.HistoryFrom(ref)
	h.Final, h.FinalVersion = l.Endpoints, l.Version
	vs = append(vs, watchcheck.Check(h, streams...)...)
	if len(vs) > 0 {
		t.Fatalf("%d guarantee violations on B's streams:\n%s", len(vs), watchcheck.Summary(vs))
	}
	// Not vacuous: the same history catches a stream missing a change.
	var idx []int
	for i, m := range streams[0].Messages() {
		switch m.Type {
		case registrarv1.EndpointEvent_ENDPOINT_ADDED, registrarv1.EndpointEvent_ENDPOINT_UPDATED, registrarv1.EndpointEvent_ENDPOINT_REMOVED:
			idx = append(idx, i)
		}
	}
	if len(idx) < 3 {
		t.Fatalf("stream %s saw %d changes; the churn should give many", streams[0].Name, len(idx))
	}
	if len(watchcheck.Check(h, streams[0].Without(idx[1]))) == 0 {
		t.Fatalf("the checker missed a change dropped from %s", streams[0].Name)
	}
	t.Logf("checked %d streams of B against %d events of its history", len(streams), len(h.Events))
}

// streamHas reports whether r has delivered an ADDED or UPDATED event
// of an endpoint at ip.
func streamHas(r *watchcheck.Recorder, ip string) bool {
	for _, m := range r.Messages() {
		if (m.Type == registrarv1.EndpointEvent_ENDPOINT_ADDED || m.Type == registrarv1.EndpointEvent_ENDPOINT_UPDATED) && m.GetEndpoint().GetIp() == ip {
			return true
		}
	}
	return false
}

// listing is a registrar's whole listing as comparable text.
func listing(t *testing.T, c registrarv1.RegistrarClient) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l, err := c.ListAllEndpoints(ctx, &registrarv1.ListAllEndpointsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range l.Endpoints {
		out = append(out, e.GetService()+" "+e.GetIp()+" "+fmt.Sprint(e.GetMetadata()))
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}

// TestKubernetesNodeLapseSweepsItsEndpoints: a node's Lease is kept alive
// by heartbeats through either replica; once they stop, a reaper ends the
// Lease after its TTL (judged on the API server's clock), the node record
// goes with it, both replicas learn that through their watch, and the
// node's endpoints are swept, another node's left.
func TestKubernetesNodeLapseSweepsItsEndpoints(t *testing.T) {
	api := kubeapi.Start(t)
	cfg := kubeConfig(api.Kubeconfig, "default")
	ttl := 2 * time.Second
	cfg.NodeTTL = ttl
	a, b := regtest.Start(t, cfg), regtest.Start(t, cfg)
	ca, cb := dial(t, a.GRPCAddr()), dial(t, b.GRPCAddr())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// The first node record written to a fresh API server takes about 2 s
	// (the CRD's validation rules are compiled on first use): longer than
	// this test's TTL, so n1 could lapse before B ever heard of it. A
	// throwaway node takes that cost; it lapses on its own, unwatched.
	if _, err := ca.AnnounceNode(ctx, &registrarv1.AnnounceNodeRequest{Node: &registryv1.Node{Name: "warm-up"}}); err != nil {
		t.Fatalf("announce the warm-up node: %v", err)
	}
	if _, err := ca.AnnounceNode(ctx, &registrarv1.AnnounceNodeRequest{Node: &registryv1.Node{Name: "n1"}}); err != nil {
		t.Fatalf("announce: %v", err)
	}
	register(t, ca, nodeEP("web", "10.0.0.1", "n1"))
	register(t, ca, nodeEP("web", "10.0.0.2", ""))
	webOn := func(s *server.Server) []string {
		eps, _, _ := s.Registrar().List([]string{"web"})
		var ips []string
		for _, e := range eps {
			ips = append(ips, e.GetIp())
		}
		sort.Strings(ips)
		return ips
	}
	waitFor(t, "B to know the node and both endpoints", 20*time.Second, func() bool {
		_, err := cb.Heartbeat(ctx, &registrarv1.HeartbeatRequest{Node: "n1"})
		return err == nil && len(webOn(b)) == 2
	})
	var last time.Time
	for end := time.Now().Add(2 * ttl); time.Now().Before(end); time.Sleep(ttl / 4) { // the heartbeat cadence under test
		last = time.Now()
		if _, err := cb.Heartbeat(ctx, &registrarv1.HeartbeatRequest{Node: "n1"}); err != nil {
			t.Fatalf("heartbeat through B: %v", err)
		}
	}
	for name, s := range map[string]*server.Server{"a": a, "b": b} {
		if got := webOn(s); len(got) != 2 {
			t.Fatalf("replica %s lost the node's endpoint while heartbeats kept coming: %v", name, got)
		}
	}
	for name, s := range map[string]*server.Server{"a": a, "b": b} {
		waitFor(t, "replica "+name+" to sweep the lapsed node's endpoint", 20*time.Second, func() bool {
			got := webOn(s)
			return len(got) == 1 && got[0] == "10.0.0.2"
		})
		if n := len(s.Registrar().Nodes()); n != 0 {
			t.Fatalf("replica %s still holds %d node records", name, n)
		}
	}
	if since := time.Since(last); since < ttl {
		t.Fatalf("endpoint swept %v after the last heartbeat, before the %v TTL", since, ttl)
	}
	t.Logf("the node's endpoint was swept on both replicas %v after the last heartbeat (TTL %v)", time.Since(last).Round(time.Millisecond), ttl)
	if _, err := cb.Heartbeat(ctx, &registrarv1.HeartbeatRequest{Node: "n1"}); err == nil {
		t.Fatalf("a heartbeat after the lapse was accepted")
	}
}

// TestKubernetesBackendFailsWithoutCRDs: without --kubernetes-install-crds
// on an API server that lacks the CRDs, the start fails naming the fix.
func TestKubernetesBackendFailsWithoutCRDs(t *testing.T) {
	api := kubeapi.Start(t)
	cfg := kubeConfig(api.Kubeconfig, "default")
	cfg.KubernetesInstallCRDs = false
	cfg.GRPCAddr, cfg.HTTPAddr, cfg.Logger = "127.0.0.1:0", "127.0.0.1:0", quietLogger()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := server.Serve(ctx, cfg)
	if err == nil || !strings.Contains(err.Error(), "--backend kubernetes") {
		t.Fatalf("Serve without the CRDs: %v, want a start failure naming the backend", err)
	}
	t.Logf("start without CRDs: %v", err)
}

// TestKubernetesPeerWatch: with --peer-watch, the replicas find each other
// through member records on their Leases, connect their streams, and a
// write on one reaches the other over the stream; a replica that stops
// drops out of the other's members.
func TestKubernetesPeerWatch(t *testing.T) {
	api := kubeapi.Start(t)
	cfg := kubeConfig(api.Kubeconfig, "default")
	cfg.PeerWatch = true
	cfg.PeerMemberTTL = 2 * time.Second
	cfg.PeerDiscoveryInterval = 200 * time.Millisecond
	a, b := regtest.Start(t, cfg), regtest.Start(t, cfg)
	connectedTo := func(s *server.Server, n int) func() bool {
		return func() bool {
			c := 0
			for _, p := range s.Registrar().Peers() {
				if p.Connected {
					c++
				}
			}
			return c == n
		}
	}
	waitFor(t, "A and B to connect their peer streams", 30*time.Second, func() bool { return connectedTo(a, 1)() && connectedTo(b, 1)() })
	ca := dial(t, a.GRPCAddr())
	register(t, ca, ep("web", "10.7.0.1", 80))
	waitFor(t, "B to receive A's write over the peer stream", 10*time.Second, func() bool {
		for _, p := range b.Registrar().Peers() {
			if p.Writes > 0 {
				return true
			}
		}
		return false
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = a.Close(ctx)
	waitFor(t, "A to drop out of B's peers", 30*time.Second, func() bool { return len(b.Registrar().Peers()) == 0 })
}
