package edge_test

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"sort"
	"testing"
	"time"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/edge"
	"github.com/aethermesh/aether/internal/faultproxy"
	"github.com/aethermesh/aether/internal/testutil/regtest"
	"github.com/aethermesh/aether/internal/testutil/wait"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/server"
)

// convergeBound is how long the two sites may take to agree after the link
// heals: the edge replicas' probe (100 ms here) plus a reconnect backoff
// of at most a second, then each registrar's watch; generous for a loaded
// machine under the race detector.
const convergeBound = 60 * time.Second

// site is one edge site: an edge replica and a registrar on it.
type site struct {
	name string
	edge *edge.Server
	reg  registrarv1.RegistrarClient
}

// TestRegistrarsAtTwoEdgeSites is the edge store's reason to exist, end to
// end: two sites, each an `aether edge` replica with a registrar on it, the
// replicas joined only through a link the test cuts. While cut, each site
// keeps registering and draining its own endpoints and its watchers see
// them (three etcd members across two sites would leave the minority site
// without a quorum to write); once healed, each registrar lists both
// sites' endpoints in their last acknowledged state, and nothing
// acknowledged is lost.
func TestRegistrarsAtTwoEdgeSites(t *testing.T) {
	names := []string{"site-a", "site-b"}
	real := map[string]string{}
	proxy := map[string]*faultproxy.Proxy{}
	ic := map[string][]url.URL{}
	for _, n := range names {
		real[n] = freeAddr(t)
		p, err := faultproxy.Start(real[n])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		proxy[n] = p
		// Each replica is known to the other at its proxy: every byte of
		// sync between the sites crosses a proxy the test can cut.
		ic[n] = []url.URL{{Scheme: "http", Host: p.Addr()}}
	}
	sites := map[string]*site{}
	for _, n := range names {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		e, err := edge.Start(ctx, edge.Config{
			Name:              n,
			DataDir:           t.TempDir(),
			ListenClientURLs:  []url.URL{{Scheme: "http", Host: "127.0.0.1:0"}},
			ListenPeerURLs:    []url.URL{{Scheme: "http", Host: real[n]}},
			AdvertisePeerURLs: ic[n],
			InitialCluster:    ic,
			SyncInterval:      100 * time.Millisecond,
		})
		cancel()
		if err != nil {
			t.Fatalf("start edge %s: %v", n, err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = e.Close(ctx)
		})
		srv := regtest.Start(t, server.Config{
			EtcdEndpoints: e.ClientURLs(),
			Options:       registrar.Options{Region: "edge", ClusterName: n},
		})
		sites[n] = &site{name: n, edge: e, reg: regtest.Dial(t, srv.GRPCAddr())}
	}
	a, b := sites["site-a"], sites["site-b"]

	// want is every endpoint's last acknowledged state, by site and IP.
	want := map[string]registryv1.State{}
	register := func(s *site, i int) {
		e := regtest.EP("web", fmt.Sprintf("10.%d.0.%d", siteIndex(s.name), i), 8080)
		regtest.Register(t, s.reg, e)
		want[s.name+"/"+e.Ip] = registryv1.State_STATE_SERVING
	}
	drain := func(s *site, i int) {
		ip := fmt.Sprintf("10.%d.0.%d", siteIndex(s.name), i)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := s.reg.DrainEndpoint(ctx, &registrarv1.DrainEndpointRequest{
			Service: "web", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: ip,
		}); err != nil {
			t.Fatalf("drain %s at %s: %v", ip, s.name, err)
		}
		want[s.name+"/"+ip] = registryv1.State_STATE_DRAINING
	}
	for i := 1; i <= 3; i++ {
		register(a, i)
		register(b, i)
	}
	for _, s := range []*site{a, b} {
		waitListed(t, s, want, "before the cut")
	}

	// Each site's watcher, opened before the cut, must keep hearing its
	// own site's writes while the link is down.
	watch := map[string]*watcher{}
	for _, s := range []*site{a, b} {
		watch[s.name] = startWatcher(t, s)
	}

	for _, p := range proxy {
		p.Cut()
	}
	for i := 4; i <= 6; i++ {
		register(a, i)
		register(b, i)
	}
	drain(a, 1)
	drain(b, 2)
	for _, s := range []*site{a, b} {
		own := map[string]registryv1.State{}
		for k, st := range want {
			if len(k) > len(s.name) && k[:len(s.name)] == s.name {
				own[k] = st
			}
		}
		// During the cut a site holds its own endpoints as acknowledged,
		// and its watcher has heard each of them.
		waitListedSubset(t, s, own, "during the cut")
		w := watch[s.name]
		wait.For(t, s.name+"'s watcher hearing its own site's writes during the cut", convergeBound, func() bool {
			return w.hasAll(own)
		})
	}
	// Across the cut nothing of the other site's new writes can be known:
	// the test's cut is real.
	if got := listed(t, a); got["site-b/10.2.0.6"] != 0 {
		t.Fatalf("site-a lists site-b's endpoint registered during the cut: the link was not cut")
	}

	for _, p := range proxy {
		p.Heal()
	}
	start := time.Now()
	for _, s := range []*site{a, b} {
		waitListed(t, s, want, "after the heal")
	}
	t.Logf("both sites converged %v after the heal (bound %v)", time.Since(start).Round(time.Millisecond), convergeBound)
}

func siteIndex(name string) int {
	if name == "site-a" {
		return 1
	}
	return 2
}

// listed is what a site's registrar lists for web, by site and IP.
func listed(t *testing.T, s *site) map[string]registryv1.State {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := s.reg.ListAllEndpoints(ctx, &registrarv1.ListAllEndpointsRequest{Services: []string{"web"}})
	if err != nil {
		t.Fatalf("list at %s: %v", s.name, err)
	}
	out := map[string]registryv1.State{}
	for _, e := range resp.Endpoints {
		out[e.Cluster+"/"+e.Ip] = e.State
	}
	return out
}

// waitListed waits until s lists exactly want.
func waitListed(t *testing.T, s *site, want map[string]registryv1.State, when string) {
	t.Helper()
	wait.ForState(t, s.name+" listing every acknowledged endpoint "+when, convergeBound, func() (bool, string) {
		got := listed(t, s)
		return equalStates(got, want), describe(got)
	})
}

// waitListedSubset waits until s lists at least want, in those states.
func waitListedSubset(t *testing.T, s *site, want map[string]registryv1.State, when string) {
	t.Helper()
	wait.ForState(t, s.name+" listing its own endpoints "+when, convergeBound, func() (bool, string) {
		got := listed(t, s)
		for k, st := range want {
			if got[k] != st {
				return false, describe(got)
			}
		}
		return true, ""
	})
}

func equalStates(a, b map[string]registryv1.State) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func describe(m map[string]registryv1.State) string {
	keys := make([]string, 0, len(m))
	for k, v := range m {
		keys = append(keys, k+"="+v.String())
	}
	sort.Strings(keys)
	return fmt.Sprint(keys)
}

// watcher is a WatchEndpoints stream of web at one site, folded into the
// state its events describe.
type watcher struct {
	states chan map[string]registryv1.State
}

func startWatcher(t *testing.T, s *site) *watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := s.reg.WatchEndpoints(ctx, &registrarv1.WatchEndpointsRequest{Services: []string{"web"}})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	w := &watcher{states: make(chan map[string]registryv1.State, 1)}
	w.states <- map[string]registryv1.State{}
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		var pending []*registryv1.ServiceEndpoint
		for {
			ev, err := stream.Recv()
			if err != nil {
				return
			}
			st := <-w.states
			switch ev.Type {
			case registrarv1.EndpointEvent_FULL_SNAPSHOT:
				pending = append(pending, ev.Endpoints...)
				if !ev.SnapshotContinues {
					st = map[string]registryv1.State{}
					for _, e := range pending {
						st[e.Cluster+"/"+e.Ip] = e.State
					}
					pending = nil
				}
			case registrarv1.EndpointEvent_ENDPOINT_ADDED, registrarv1.EndpointEvent_ENDPOINT_UPDATED:
				st[ev.Endpoint.Cluster+"/"+ev.Endpoint.Ip] = ev.Endpoint.State
			case registrarv1.EndpointEvent_ENDPOINT_REMOVED:
				delete(st, ev.Endpoint.Cluster+"/"+ev.Endpoint.Ip)
			}
			w.states <- st
		}
	}()
	return w
}

// hasAll reports whether the watcher's state holds want.
func (w *watcher) hasAll(want map[string]registryv1.State) bool {
	st := <-w.states
	defer func() { w.states <- st }()
	for k, v := range want {
		if st[k] != v {
			return false
		}
	}
	return true
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
