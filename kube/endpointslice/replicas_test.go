package endpointslice_test

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/client-go/kubernetes"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/regtest"
	"github.com/aethermesh/aether/internal/testutil/wait"
	"github.com/aethermesh/aether/kube/endpointslice"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/server"
)

// listCounter counts the EndpointSlice LISTs a client sends: a
// reconciler's resyncs, which the test waits on as proof that time has
// passed for a reconciler that would flap.
type listCounter struct{ n atomic.Int64 }

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func (c *listCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/endpointslices") {
			c.n.Add(1)
		}
		return rt.RoundTrip(r)
	})
}

// replicaWriter is one registrar replica with its own reconciler,
// election off: it writes every slice it plans.
type replicaWriter struct {
	name  string
	srv   *server.Server
	c     registrarv1.RegistrarClient
	reg   *prometheus.Registry
	lists *listCounter
}

// activity is what the writer has sent the API server that changes or
// tried to change a slice: accepted writes and failed calls.
func (w *replicaWriter) activity(t *testing.T) float64 {
	return counter(t, w.reg, "endpointslice_writes_total", "") + counter(t, w.reg, "endpointslice_errors_total", "")
}

// TestTwoReplicasWithoutElectionConverge: two registrar replicas of one
// origin on one etcd, each with its own reconciler and leader election
// off, take concurrent registrations, drains and removals (each replica
// some of them) and both write the same services' slices at once. The
// slices must end up exactly what the registrars hold (every endpoint in
// one slice, with its conditions, none lost, none twice, no slice over
// the limit or empty), and stay so: once converged, several resyncs of
// each reconciler write nothing (no flapping between the two).
func TestTwoReplicasWithoutElectionConverge(t *testing.T) {
	e := setup(t)
	b := regtest.Start(t, server.Config{
		EtcdEndpoints: e.srv.EtcdEndpoints(),
		Options:       registrar.Options{ClusterName: "c1", Region: "r1"},
	})
	const maxPer = 10
	newWriter := func(name string, s *server.Server) *replicaWriter {
		w := &replicaWriter{name: name, srv: s, c: regtest.Dial(t, s.GRPCAddr()), reg: prometheus.NewRegistry(), lists: &listCounter{}}
		cfg := e.api.Config()
		cfg.WrapTransport = w.lists.wrap
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		r, err := endpointslice.NewReconciler(endpointslice.ReconcilerConfig{
			Config: endpointslice.Config{Namespace: ns, Region: "r1", Cluster: "c1", ZoneHints: true, MaxEndpointsPerSlice: maxPer},
			Source: s.Registrar(), Client: cs,
			Logger: regtest.QuietLogger(), Registerer: w.reg,
			// Frequent resyncs: each is a full replan against a fresh
			// listing, where a pair that disagreed would write.
			Resync:   time.Second,
			WriteQPS: 200, WriteBurst: 200,
		})
		if err != nil {
			t.Fatal(err)
		}
		r.Start()
		t.Cleanup(r.Close)
		return w
	}
	ws := []*replicaWriter{newWriter("a", e.srv), newWriter("b", b)}

	services := []string{"pay", "cart", "auth"}
	const perService = 45
	ip := func(s, i int) string { return fmt.Sprintf("10.%d.%d.%d", 40+s, i/200, 1+i%200) }
	// Each replica takes every other registration, concurrently, so both
	// reconcilers plan and write the same services at the same moments.
	var wg sync.WaitGroup
	errs := make(chan error, len(ws))
	for wi, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := wi; i < perService; i += len(ws) {
				for si, svc := range services {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					_, err := w.c.RegisterEndpoint(ctx, &registrarv1.RegisterEndpointRequest{Endpoint: ep(svc, ip(si, i))})
					cancel()
					if err != nil {
						errs <- fmt.Errorf("%s: register %s %s: %w", w.name, svc, ip(si, i), err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// Then, crossing over: endpoints registered through one replica are
	// drained and removed through the other, again concurrently, once each
	// replica holds the other's registrations (it refuses to change an
	// endpoint it does not know).
	wait.ForState(t, "both registrars to hold every registration", 30*time.Second, func() (bool, string) {
		la, lb := published(t, ws[0].c), published(t, ws[1].c)
		for _, svc := range services {
			if len(la[svc]) != perService || len(lb[svc]) != perService {
				return false, fmt.Sprintf("%s: a %d, b %d of %d", svc, len(la[svc]), len(lb[svc]), perService)
			}
		}
		return true, ""
	})
	errs = make(chan error, len(ws))
	wg = sync.WaitGroup{}
	for wi, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			other := 1 - wi
			for i := other; i < perService; i += 3 * len(ws) {
				for si, svc := range services {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					var err error
					if i%2 == 0 {
						_, err = w.c.DrainEndpoint(ctx, &registrarv1.DrainEndpointRequest{Service: svc, Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: ip(si, i)})
					} else {
						_, err = w.c.UnregisterEndpoint(ctx, &registrarv1.UnregisterEndpointRequest{Service: svc, Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: ip(si, i)})
					}
					cancel()
					if err != nil {
						errs <- fmt.Errorf("%s: drain/remove %s %s: %w", w.name, svc, ip(si, i), err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	// What the slices must show: what both registrars list, once they
	// list the same.
	want := map[string]map[string]string{}
	wait.ForState(t, "both registrars to list the same", 30*time.Second, func() (bool, string) {
		la, lb := published(t, ws[0].c), published(t, ws[1].c)
		if fmt.Sprint(la) != fmt.Sprint(lb) {
			return false, fmt.Sprintf("a %v\nb %v", la, lb)
		}
		want = la
		return true, ""
	})
	removed, drained := 0, 0
	for _, m := range want {
		for _, st := range m {
			if st == "false/true/true" {
				drained++
			}
		}
	}
	for _, svc := range services {
		removed += perService - len(want[svc])
	}
	if removed == 0 || drained == 0 {
		t.Fatalf("the workload removed %d and drained %d endpoints; it should do both", removed, drained)
	}

	check := func() (bool, string) {
		for _, svc := range services {
			if msg := e.sliceProblems(t, svc, want[svc], maxPer); msg != "" {
				return false, svc + ": " + msg
			}
		}
		return true, ""
	}
	wait.ForState(t, "the slices to show exactly what the registrars hold", 60*time.Second, check)

	// Settled: the slices can show the right content while a reconciler
	// still holds a key queued from before, planned on a cache the
	// other's last write has not reached yet (that write then conflicts,
	// once). So first a resync of each with no write or failure by either;
	// two replicas fighting never get one (they write on every replan),
	// and this fails with the fighting message below.
	before := make([]float64, len(ws))
	lists := make([]int64, len(ws))
	mark := func() {
		for i, w := range ws {
			before[i], lists[i] = w.activity(t), w.lists.n.Load()
		}
	}
	resyncs := func(n int64) bool {
		for i, w := range ws {
			if w.lists.n.Load() < lists[i]+n {
				return false
			}
		}
		return true
	}
	quiet := func() bool {
		for i, w := range ws {
			if w.activity(t) != before[i] {
				return false
			}
		}
		return true
	}
	mark()
	settleBy := time.Now().Add(30 * time.Second)
	for {
		wait.For(t, "a resync of each reconciler", 60*time.Second, func() bool { return resyncs(1) })
		if quiet() || time.Now().After(settleBy) {
			break
		}
		mark()
	}
	// Stable: across three resyncs of each reconciler after that (each a
	// listing and a replan of every service), neither writes or fails a
	// write, and the slices still match.
	mark()
	wait.For(t, "three resyncs of each reconciler", 60*time.Second, func() bool { return resyncs(3) })
	for i, w := range ws {
		if got := w.activity(t); got != before[i] {
			t.Errorf("reconciler %s wrote or failed %v times across three resyncs after converging: the two replicas are fighting", w.name, got-before[i])
		}
	}
	if ok, msg := check(); !ok {
		t.Fatalf("after the resyncs: %s", msg)
	}
	for _, w := range ws {
		t.Logf("reconciler %s: %v writes, %v conflicts", w.name, counter(t, w.reg, "endpointslice_writes_total", ""), counter(t, w.reg, "endpointslice_conflicts_total", ""))
	}
}

// published is what a registrar holds, as the slices should show it: by
// service, ip → "ready/serving/terminating".
func published(t *testing.T, c registrarv1.RegistrarClient) map[string]map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := c.ListAllEndpoints(ctx, &registrarv1.ListAllEndpointsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]string{}
	for _, ep := range l.GetEndpoints() {
		if out[ep.GetService()] == nil {
			out[ep.GetService()] = map[string]string{}
		}
		st := "true/true/false"
		if ep.GetState() == registryv1.State_STATE_DRAINING {
			st = "false/true/true"
		}
		out[ep.GetService()][ep.GetIp()] = st
	}
	return out
}

// sliceProblems says how svc's managed slices differ from want (ip →
// conditions), or "" when they show exactly it: each address once, no
// slice empty or over max.
func (e *env) sliceProblems(t *testing.T, svc string, want map[string]string, max int) string {
	got := map[string]string{}
	var bad []string
	for _, s := range e.slicesOf(t, svc, endpointslice.ManagedBy) {
		if len(s.Endpoints) == 0 || len(s.Endpoints) > max {
			bad = append(bad, fmt.Sprintf("slice %s holds %d endpoints", s.Name, len(s.Endpoints)))
		}
		for _, p := range s.Endpoints {
			a := p.Addresses[0]
			if _, twice := got[a]; twice {
				bad = append(bad, a+" in two slices")
			}
			got[a] = conditions(p)
		}
	}
	for a, st := range want {
		if got[a] != st {
			bad = append(bad, fmt.Sprintf("%s: %q, want %q", a, got[a], st))
		}
	}
	for a := range got {
		if _, ok := want[a]; !ok {
			bad = append(bad, a+" published, not registered")
		}
	}
	sort.Strings(bad)
	return strings.Join(bad, "; ")
}

func conditions(p discoveryv1.Endpoint) string {
	c := p.Conditions
	return fmt.Sprintf("%v/%v/%v", *c.Ready, *c.Serving, *c.Terminating)
}
