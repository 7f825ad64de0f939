package console_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/aethermesh/aether/console"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/internal/testutil/regtest"
	"github.com/aethermesh/aether/internal/testutil/wait"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/server"
)

// TestSubscriptionOnlyWhilePagesAreOpen: the console's subscription to
// the replica is a watch stream like an agent's, so it is held only while
// a page (an event stream) is open: none before, one while two pages
// are open, none after they close.
func TestSubscriptionOnlyWhilePagesAreOpen(t *testing.T) {
	srv := plane(t)
	base := "http://" + srv.HTTPAddr()
	streams := func() float64 { return regtest.MetricValue(t, srv.HTTPAddr(), "registrar_connected_agents") }
	if n := streams(); n != 0 {
		t.Fatalf("no page open: %v watch streams, want 0", n)
	}
	open := func() (context.CancelFunc, *bufio.Reader) {
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/ui/api/events", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
			t.Fatalf("events: Content-Type %q", ct)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return cancel, bufio.NewReader(resp.Body)
	}
	close1, r1 := open()
	close2, _ := open()
	waitFor(t, "one subscription for two pages", 5*time.Second, func() bool { return streams() == 1 })

	// The stream says "change" when the replica's stream delivers.
	aether(t, "register", "--registrar="+srv.GRPCAddr(), "--service", "web", "--ip", "10.0.9.9", "--port", "8080")
	deadline := time.Now().Add(5 * time.Second)
	changes := 0
	for changes < 2 && time.Now().Before(deadline) { // one at the start, one for the write
		line, err := r1.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(line) == "event: change" {
			changes++
		}
	}
	if changes < 2 {
		t.Fatalf("saw %d change events, want the initial one and one for the write", changes)
	}

	close1()
	close2()
	waitFor(t, "no subscription once the pages closed", 5*time.Second, func() bool { return streams() == 0 })
}

// TestOverviewReplicationPeers: with --peer-etcd the overview lists the
// peer region as the replicator sees it, this replica leading (it is the
// region's only one), and `aether status` prints the peer.
func TestOverviewReplicationPeers(t *testing.T) {
	peer := etcdtest.Start(t)
	srv := plane(t, func(o *server.Config) {
		o.PeerEtcd = []string{"us-east=" + peer.Endpoints()[0]}
		o.ReplicationLeaseTTL = 5 * time.Second
	})
	base := "http://" + srv.HTTPAddr()
	var ov console.Overview
	wait.ForState(t, "the peer synced in the overview", 20*time.Second, func() (bool, string) {
		ov = overview(t, base)
		p := ov.Replication.Peers
		return ov.Replication.Enabled && len(p) == 1 && p[0].Region == "us-east" && p[0].Reachable && p[0].Synced && p[0].IsLeader,
			fmt.Sprintf("%+v", ov.Replication)
	})
	if p := ov.Replication.Peers[0]; p.KeysMirrored == 0 || p.LeaseTTLRemainingSeconds <= 0 {
		t.Errorf("peer %+v: want mirrored keys and a live lease", p)
	}
	ctx := browser(t, time.Minute)
	if err := chromedp.Do(ctx, chromedp.Navigate(base+"/ui/")); err != nil {
		t.Fatal(err)
	}
	waitPage(t, ctx, "peer row", liveBound, text("#peers tbody tr td:nth-child(1)"), "us-east")
	waitPage(t, ctx, "peer synced", liveBound, text("#peers tbody tr td:nth-child(3)"), "yes")

	out := aether(t, "status", "--http-addr="+srv.HTTPAddr())
	if !regexp.MustCompile(`(?m)^us-east +yes +yes +this replica `).MatchString(out) {
		t.Errorf("aether status shows no synced peer row:\n%s", out)
	}
}

// TestPropagationLatency: two replicas of one cluster on one etcd. A write
// acknowledged by A reaches B through etcd (A's flush, B's watch); B's
// open page shows it as a cross-replica propagation sample, with a
// latency between A's acknowledgement and B's event. A's own writes are
// not propagation: A's console, open too, measures none.
func TestPropagationLatency(t *testing.T) {
	etcd := etcdtest.Start(t)
	o := server.Config{EtcdEndpoints: etcd.Endpoints(), Options: registrar.Options{ClusterName: "c1", Region: "eu-west"}}
	a, b := regtest.Start(t, o), regtest.Start(t, o)

	// A's console follows its stream while this stream is open.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+a.HTTPAddr()+"/ui/api/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()

	page := browser(t, time.Minute)
	if err := chromedp.Do(page, chromedp.Navigate("http://"+b.HTTPAddr()+"/ui/")); err != nil {
		t.Fatal(err)
	}
	waitPage(t, page, "B's page live", liveBound, text("#live"), "live")
	waitFor(t, "both consoles subscribed", liveBound, func() bool {
		return regtest.MetricValue(t, a.HTTPAddr(), "registrar_connected_agents") == 1 &&
			regtest.MetricValue(t, b.HTTPAddr(), "registrar_connected_agents") == 1
	})

	start := time.Now()
	if _, _, err := a.Registrar().Register(regtest.EP("web", "10.0.0.1", 8080)); err != nil {
		t.Fatal(err)
	}
	waitPage(t, page, "B measured A's write", 10*time.Second, text("#prop-samples"), "1")
	bound := time.Since(start)
	ov := overview(t, "http://"+b.HTTPAddr())
	peak := 0.0
	for _, v := range ov.Propagation.MaxMillis {
		peak = max(peak, v)
	}
	// Some time (the write goes from A through etcd to B), and no more
	// than the test waited for it.
	if peak < 1 || peak > float64(bound.Milliseconds())+1 {
		t.Fatalf("B's propagation latency %.1fms, want within (1ms, %s]", peak, bound)
	}
	t.Logf("propagation A -> B: %.1fms (write-behind flush every %s)", peak, a.Options().WriteBatchInterval)
	waitPage(t, page, "chart", liveBound, count("#prop-chart polyline"), "1")
	if n := overview(t, "http://"+a.HTTPAddr()).Propagation.Samples; n != 0 {
		t.Errorf("A measured %d propagation samples of its own write", n)
	}
}

// TestOverviewClusterReplicas: with --peer-watch, each replica's overview
// lists the cluster's other replica (found through its member record) with
// its peer-watch stream connected and the writes received from it; the page
// and `aether status` show the row. Without --peer-watch there is no
// replicas section.
func TestOverviewClusterReplicas(t *testing.T) {
	etcd := etcdtest.Start(t)
	o := server.Config{EtcdEndpoints: etcd.Endpoints(), Options: registrar.Options{ClusterName: "c1", Region: "eu-west",
		PeerWatch: true, PeerDiscoveryInterval: 100 * time.Millisecond, PeerMemberTTL: 2 * time.Second}}
	a, b := regtest.Start(t, o), regtest.Start(t, o)
	aEpoch := a.Registrar().Version().Epoch
	var ov console.Overview
	wait.ForState(t, "B lists A, connected", 20*time.Second, func() (bool, string) {
		ov = overview(t, "http://"+b.HTTPAddr())
		p := ov.Replicas.Peers
		return ov.Replicas.PeerWatch && len(p) == 1 && p[0].Epoch == aEpoch && p[0].Connected, fmt.Sprintf("%+v", ov.Replicas)
	})
	// A write on A once its stream to B is open reaches B through it.
	if _, _, err := a.Registrar().Register(regtest.EP("web", "10.0.0.1", 8080)); err != nil {
		t.Fatal(err)
	}
	wait.ForState(t, "B counts the write it received from A", 20*time.Second, func() (bool, string) {
		ov = overview(t, "http://"+b.HTTPAddr())
		p := ov.Replicas.Peers
		return ov.Replicas.PeerWatch && len(p) == 1 && p[0].Epoch == aEpoch && p[0].Connected && p[0].Writes == 1,
			fmt.Sprintf("%+v", ov.Replicas)
	})
	addr := ov.Replicas.Peers[0].Addr

	ctx := browser(t, time.Minute)
	if err := chromedp.Do(ctx, chromedp.Navigate("http://"+b.HTTPAddr()+"/ui/")); err != nil {
		t.Fatal(err)
	}
	waitPage(t, ctx, "replica row", liveBound, text("#replicas tbody tr td:nth-child(1)"), addr)
	waitPage(t, ctx, "replica connected", liveBound, text("#replicas tbody tr td:nth-child(3)"), "connected")

	out := aether(t, "status", "--http-addr="+b.HTTPAddr())
	if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(addr) + ` +` + regexp.QuoteMeta(aEpoch) + ` +connected +1$`).MatchString(out) {
		t.Errorf("aether status shows no connected replica row for %s:\n%s", addr, out)
	}

	plain := plane(t)
	if ov := overview(t, "http://"+plain.HTTPAddr()); ov.Replicas.PeerWatch || len(ov.Replicas.Peers) != 0 {
		t.Errorf("without --peer-watch: replicas %+v, want none", ov.Replicas)
	}
}
