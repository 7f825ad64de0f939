package registrar_test

import (
	"testing"
	"time"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/faultproxy"
	"github.com/aethermesh/aether/internal/testutil/etcdcluster"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/server"
)

// A registrar on a three-member etcd cluster keeps every watch guarantee
// while an etcd member is killed (as a crash: no leadership transfer) under
// write load and later restarted:
//
//   - LeaderKilled: the registrar knows all three members and the leader
//     dies, so its persistence and its etcd watch must move to the
//     survivors across an election (in-flight transactions fail with
//     unknown outcome and are retried; one that a survivor had forwarded to
//     the dead leader is lost by etcd and only times out, after the
//     registrar's 5s flush timeout, which is most of this test's time);
//   - OnlyMemberKilled: the registrar knows only the member that dies (a
//     follower), so etcd is unreachable for it until that member returns:
//     it keeps acknowledging and streaming writes, then persists them and
//     learns what another cluster wrote through the survivors meanwhile.
//
// Either way every stream passes watchcheck against the registrar's own
// history, every acknowledged write is in that history (and so in every
// stream whose filter takes it), and etcd ends up holding exactly what the
// registrar lists.
func TestGuaranteeEtcdLeaderKilled(t *testing.T) {
	t.Parallel()
	testEtcdMemberKilled(t, false)
}

func TestGuaranteeEtcdOnlyMemberKilled(t *testing.T) {
	t.Parallel()
	testEtcdMemberKilled(t, true)
}

// testEtcdMemberKilled runs the test; onlyKill: the registrar knows only
// the member killed.
func testEtcdMemberKilled(t *testing.T, onlyKill bool) {
	cl := etcdcluster.Start(t, 3)
	// The registrar reaches each member through a proxy, so that a
	// kill also resets the member's connections at once, as a dead
	// process's kernel would.
	var pxs []*faultproxy.Proxy
	var viaProxies []string
	for _, ep := range cl.Endpoints() {
		px, err := faultproxy.Start(stripScheme(ep))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { px.Close() })
		pxs = append(pxs, px)
		viaProxies = append(viaProxies, "http://"+px.Addr())
	}
	victim := waitLeader(t, cl)
	endpoints := viaProxies
	if onlyKill {
		victim = (victim + 1) % 3 // a follower: no election, just gone
		endpoints = viaProxies[victim : victim+1]
	}
	cli := etcdtest.NewClient(t, cl.Endpoints()[(victim+1)%3]) // another cluster's writer, on a survivor
	s := startRegistrar(t, endpoints, fastProgress, func(o *server.Config) {
		o.SyncInterval = time.Hour // the watch alone must carry other writers' changes
	})
	c := dial(t, s.GRPCAddr())
	ref := reference(t, c)
	streams := filteredStreams(t, dial(t, s.GRPCAddr()), "")
	var acks ackLog
	runWriters(t, c, 0, 3, 60, "", &acks)

	// Kill the member while writers are busy, and keep writing
	// while it is down; another cluster writes atomically meanwhile.
	stopWriters := backgroundWriters(c, 3, 3, &acks)
	waitFor(t, "writes under way", 10*time.Second, func() bool { return len(acks.All()) >= 250 })
	pxs[victim].Cut()
	cl.Kill(victim)
	killedAt := time.Now()
	if !onlyKill {
		waitFor(t, "a new leader", 10*time.Second, func() bool { l := cl.Leader(); return l >= 0 && l != victim })
	}
	base, _ := ref.Covered()
	batch := []*registryv1.ServiceEndpoint{foreignEP("web", "10.9.3.1"), foreignEP("db", "10.9.3.2"), foreignEP("auth", "10.9.3.3")}
	foreignTxn(t, cli, batch...)
	during := len(acks.All())
	waitFor(t, "writes acknowledged while the member is down", 10*time.Second, func() bool { return len(acks.All()) >= during+150 })
	if onlyKill {
		// Nothing can be persisted without the member.
		if n := s.Registrar().PendingWrites(); n == 0 {
			t.Fatal("no write pending while the registrar's only etcd member is down")
		}
	} else {
		waitFor(t, "the other cluster's write seen through the survivors", 15*time.Second, func() bool { return lists(t, c, "10.9.3.3") })
	}
	if err := stopWriters(); err != nil {
		t.Fatalf("a write failed while an etcd member was down: %v", err)
	}

	late := guarded(t, dial(t, s.GRPCAddr()), "late-web+db", &registrarv1.WatchEndpointsRequest{Services: []string{"web", "db"}})

	cl.Restart(t, victim)
	pxs[victim].Heal()
	t.Logf("member m%d was down for %v", victim, time.Since(killedAt).Round(time.Millisecond))
	waitFor(t, "queued writes persisted", 20*time.Second, func() bool { return s.Registrar().PendingWrites() == 0 })
	waitFor(t, "the other cluster's write seen", 20*time.Second, func() bool { return lists(t, c, "10.9.3.3") })
	runWriters(t, c, 150, 2, 40, "", &acks)

	h := checkGuarantees(t, c, ref, acks.All(), []batchSpec{{after: base, eps: batch}}, append(streams, late)...)
	alive(t, append(streams, late)...)
	waitFor(t, "the last writes persisted", 10*time.Second, func() bool { return s.Registrar().PendingWrites() == 0 })
	if d := etcdDiff(t, etcdtest.NewClient(t, cl.Endpoints()...), h.Final); d != "" {
		t.Fatalf("etcd differs from the registrar's listing: %s", d)
	}
}

// waitLeader returns the cluster's leader once its members agree on one.
func waitLeader(t *testing.T, cl *etcdcluster.Cluster) int {
	t.Helper()
	leader := -1
	waitFor(t, "an etcd leader", 10*time.Second, func() bool { leader = cl.Leader(); return leader >= 0 })
	return leader
}

// lists reports whether the registrar lists an endpoint with this IP.
func lists(t *testing.T, c registrarv1.RegistrarClient, ip string) bool {
	t.Helper()
	l := listAllEndpoints(t, c)
	for _, e := range l.Endpoints {
		if e.Ip == ip {
			return true
		}
	}
	return false
}
