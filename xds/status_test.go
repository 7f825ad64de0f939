package xds

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/wait"
	"github.com/aethermesh/aether/internal/testutil/xdstest"
	"github.com/aethermesh/aether/registrar/replica"
	"github.com/aethermesh/aether/registry"
)

// nackBound is how long a change may take to reach grpc-go's picks or
// the status; on loopback it is milliseconds, the rest is for -race.
const nackBound = 10 * time.Second

// backendEP is a real backend as service web's gRPC endpoint in r1/z1.
func backendEP(b *xdstest.Backend) *registryv1.ServiceEndpoint {
	return &registryv1.ServiceEndpoint{Service: "web", Protocol: registryv1.Protocol_PROTOCOL_GRPC, Ip: b.Host(),
		Ports: []*registryv1.Port{{Name: "grpc", Port: b.Port()}}, Region: "r1", Cluster: "c1", Zone: "z1",
		State: registryv1.State_STATE_SERVING, Weight: 1}
}

func sample(t *testing.T, m prometheus.Metric) *dto.Metric {
	t.Helper()
	var out dto.Metric
	if err := m.Write(&out); err != nil {
		t.Fatal(err)
	}
	return &out
}

// edsOf is the status of the EDS type of the one stream of node.
func edsOf(s *Server, node string) (TypeStatus, bool) {
	for _, c := range s.Status() {
		if c.Node == node {
			ts, ok := c.Types[resourcev3.EndpointType]
			return ts, ok
		}
	}
	return TypeStatus{}, false
}

// injectPriorityGap sets, in loc's EDS cache, web's assignment to one
// grpc-go rejects ("priority 1 missing": priorities 0 and 2), sending all
// traffic to to: the test-only way to make a real client NACK, since the
// feed never builds such an assignment. It returns the version the
// update carries. The feed's own record of web's assignment stays the
// good one, so the next real change of web is put again.
func injectPriorityGap(t *testing.T, f *Feed, loc Locality, to, other *xdstest.Backend) string {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.eds[loc]
	good := f.cla[loc]["web"]
	if l == nil || good == nil {
		t.Fatalf("no assignment of web for %s", loc)
	}
	bad := proto.Clone(good).(*endpointv3.ClusterLoadAssignment)
	first := bad.GetEndpoints()[0]
	at := func(b *xdstest.Backend, prio uint32, region string) *endpointv3.LocalityLbEndpoints {
		l := proto.Clone(first).(*endpointv3.LocalityLbEndpoints)
		l.Priority = prio
		l.Locality = &corev3.Locality{Region: region, Zone: region + "-a"}
		sa := l.GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
		sa.Address, sa.PortSpecifier = b.Host(), &corev3.SocketAddress_PortValue{PortValue: b.Port()}
		l.LbEndpoints = l.LbEndpoints[:1]
		return l
	}
	bad.Endpoints = []*endpointv3.LocalityLbEndpoints{at(to, 0, "r1"), at(other, 2, "r9")}
	f.updateLocked(l, map[string]types.Resource{"web": bad}, nil, time.Now())
	return l.version()
}

// own is the locality of the scripted servers, and of their clients.
var own = Locality{Region: "r1", Zone: "z1"}

// serveScripted serves xDS on loopback from a scripted source that starts
// with eps; the subscription is for pushing changes.
func serveScripted(t *testing.T, eps ...*registryv1.ServiceEndpoint) (*Server, string, *scriptSub) {
	t.Helper()
	src := newScript(replica.Start{Snapshot: eps, At: registry.Position{Epoch: "E1", Seq: 1}})
	s, err := New(Config{Source: src, Locality: own, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, lis) }()
	t.Cleanup(func() { cancel(); <-served })
	return s, lis.Addr().String(), <-src.subs
}

// TestDeltaNACKIsNotResent: a delta NACK shows in the status and nothing
// is sent again: go-control-plane's delta server counts what it sent,
// NACKed or not, as the client's, so no hold is needed there.
func TestDeltaNACKIsNotResent(t *testing.T) {
	t.Parallel()
	b := xdstest.StartBackends(t, 2)
	s, addr, _ := serveScripted(t, backendEP(b[0]))
	d := xdstest.DeltaProbe(t, addr, xdstest.Node("delta-nack", xdstest.Locality{Region: "r1", Zone: "z1"}))
	d.Subscribe(resourcev3.EndpointType, "web")
	d.Next(nackBound)
	wait.ForState(t, "delta EDS SYNCED", nackBound, func() (bool, string) {
		ts, _ := edsOf(s, "delta-nack")
		return ts.State == Synced, string(ts.State)
	})
	rejected := injectPriorityGap(t, s.feed, own, b[1], b[0])
	d.NextNACK(nackBound, "test: rejected")
	var ts TypeStatus
	wait.ForState(t, "delta EDS NACKED", nackBound, func() (bool, string) {
		ts, _ = edsOf(s, "delta-nack")
		return ts.State == NACKed, string(ts.State)
	})
	if ts.LastNACK == nil || ts.LastNACK.Version != rejected || ts.LastNACK.Detail != "test: rejected" {
		t.Fatalf("delta NACK in the status: %+v", ts.LastNACK)
	}
	pushes := sample(t, s.m.pushes.WithLabelValues("endpoint")).GetCounter().GetValue()
	time.Sleep(500 * time.Millisecond)
	if n := sample(t, s.m.pushes.WithLabelValues("endpoint")).GetCounter().GetValue(); n != pushes {
		t.Fatalf("EDS pushes went from %v to %v after the delta NACK; want none", pushes, n)
	}
}

// TestGRPCNACKHeldAndShownInStatus: a real grpc-go client NACKs an
// invalid assignment; it keeps routing to the endpoints it had, the
// rejected version is not pushed to it again (the NACK count stays at
// one over a second, where go-control-plane alone re-sends it on every
// NACK), Status says NACKED with grpc-go's error detail, and the next
// real change brings the client back to SYNCED.
func TestGRPCNACKHeldAndShownInStatus(t *testing.T) {
	t.Parallel()
	bs := xdstest.StartBackends(t, 2)
	a, b := bs[0], bs[1]
	s, addr, sub := serveScripted(t, backendEP(a))

	const node = "client-nack"
	cc := xdstest.Client(t, "web", xdstest.Bootstrap(addr, node, xdstest.Locality{Region: "r1", Zone: "z1"}))
	xdstest.WaitSpread(t, cc, xdstest.Only(a), nackBound)
	wait.ForState(t, "EDS SYNCED", nackBound, func() (bool, string) {
		ts, _ := edsOf(s, node)
		return ts.State == Synced, string(ts.State)
	})
	good, _ := edsOf(s, node)

	rejected := injectPriorityGap(t, s.feed, own, b, a)
	var ts TypeStatus
	wait.ForState(t, "EDS NACKED", nackBound, func() (bool, string) {
		ts, _ = edsOf(s, node)
		return ts.State == NACKed, string(ts.State)
	})
	if ts.LastNACK == nil || ts.LastNACK.Version != rejected || !strings.Contains(ts.LastNACK.Detail, "priority 1 missing") ||
		ts.AckedVersion != good.AckedVersion || ts.SentVersion != rejected {
		t.Fatalf("status after the NACK: %+v (NACK %+v); want version %s rejected for the missing priority, %s kept", ts, ts.LastNACK, rejected, good.AckedVersion)
	}
	// The client keeps the config it accepted: all traffic on a, none on
	// b where the rejected assignment would have sent it.
	if got := xdstest.Spread(t, cc, 20); !xdstest.Only(a)(got) {
		t.Fatalf("after the NACK traffic went to %s, want only %s", xdstest.Format(got), a.Addr)
	}
	time.Sleep(time.Second)
	nacks := sample(t, s.m.nacks.WithLabelValues("endpoint")).GetCounter().GetValue()
	t.Logf("NACKs of the rejected version over the second after it: %v", nacks)
	if nacks < 1 || nacks > 2 {
		t.Fatalf("xds_nacks_total{type=endpoint} = %v a second after one rejected version; want 1 (2 at most: a request crossing the push)", nacks)
	}

	// A real change is a new version: accepted. Both backends are on
	// 127.0.0.1, and an endpoint's identity is its IP, so moving the
	// endpoint to b's port is the update of one endpoint.
	sub.push(&registrarv1.EndpointEvent{Type: registrarv1.EndpointEvent_ENDPOINT_UPDATED, Endpoint: backendEP(b), Sequence: 2, Version: "E1:2"})
	xdstest.WaitSpread(t, cc, xdstest.Only(b), nackBound)
	wait.ForState(t, "EDS SYNCED again", nackBound, func() (bool, string) {
		ts, _ = edsOf(s, node)
		return ts.State == Synced && ts.AckedVersion == ts.SentVersion && ts.SentVersion != rejected, string(ts.State) + " " + ts.SentVersion
	})
	if ts.LastNACK == nil || ts.LastNACK.Version != rejected {
		t.Errorf("the last NACK is gone from the status once SYNCED: %+v", ts)
	}
	for _, c := range s.Status() {
		if c.Node != node {
			continue
		}
		if c.Variant != "sotw" || c.Service != "ads" || c.Locality == nil || c.Locality.Zone != "z1" {
			t.Errorf("client %+v: want sotw over ads from r1/z1", c)
		}
		for _, typ := range []string{resourcev3.ListenerType, resourcev3.RouteType, resourcev3.ClusterType} {
			if c.Types[typ].State != Synced {
				t.Errorf("%s: %+v, want SYNCED", typ, c.Types[typ])
			}
		}
	}
	if n := sample(t, s.m.latency.WithLabelValues("endpoint").(prometheus.Metric)).GetHistogram().GetSampleCount(); n == 0 {
		t.Error("no push latency observed for the pushed change")
	}

	// A closed stream leaves the status.
	cc.Close()
	wait.For(t, "the stream to leave the status", nackBound, func() bool { return len(s.Status()) == 0 })
}

// TestTrackerStates: the state machine on hand-fed callbacks, including
// the nonce rule (a request with an older nonce answers nothing) and a
// delta ACK, which carries no version.
func TestTrackerStates(t *testing.T) {
	tr := newTracker()
	tr.open(1, "sotw", "")
	n := &corev3.Node{Id: "n1", Locality: &corev3.Locality{Zone: "z"}}
	const eds = resourcev3.EndpointType
	state := func(id int64) TypeStatus {
		for _, c := range tr.status() {
			if c.Stream == id {
				return c.Types[eds]
			}
		}
		return TypeStatus{}
	}
	tr.request(1, n, eds, "", "", "", false)
	if s := state(1); s.State != NotSent {
		t.Fatalf("before any response: %+v", s)
	}
	tr.sent(1, eds, "v1", "1", time.Now())
	if s := state(1); s.State != Stale || s.SentVersion != "v1" {
		t.Fatalf("sent: %+v", s)
	}
	tr.request(1, n, eds, "v1", "1", "", false)
	if s := state(1); s.State != Synced || s.AckedVersion != "v1" {
		t.Fatalf("ACK: %+v", s)
	}
	tr.sent(1, eds, "v2", "2", time.Now())
	if _, held := tr.request(1, n, eds, "v1", "1", "", false); held != "" || state(1).State != Stale {
		t.Fatalf("an old nonce moved the state: %+v", state(1))
	}
	nack, held := tr.request(1, n, eds, "v1", "2", "bad", true)
	if nack == nil || !nack.first || nack.version != "v2" || held != "v2" || state(1).State != NACKed || state(1).AckedVersion != "v1" {
		t.Fatalf("NACK: %+v held %q, %+v", nack, held, state(1))
	}
	if nack, held := tr.request(1, n, eds, "v1", "2", "bad", true); nack == nil || nack.first || held != "v2" {
		t.Fatalf("second NACK of v2: %+v held %q, want counted, not logged, held", nack, held)
	}
	// A change of names after the NACK (same nonce, no error) is still
	// held, and not an ACK.
	if _, held := tr.request(1, n, eds, "v1", "2", "", false); held != "v2" || state(1).State != NACKed {
		t.Fatalf("request after the NACK: held %q, %+v", held, state(1))
	}

	tr.open(2, "delta", "")
	tr.node(2, &corev3.Node{Id: "a-delta"})
	tr.request(2, nil, eds, "", "", "", false)
	tr.sent(2, eds, "v7", "1", time.Now())
	tr.request(2, nil, eds, "", "1", "", false)
	if s := state(2); s.State != Synced || s.AckedVersion != "v7" {
		t.Fatalf("delta ACK: %+v", s)
	}
	if st := tr.status(); len(st) != 2 || st[0].Node != "a-delta" || st[1].Node != "n1" || st[1].Locality.Zone != "z" {
		t.Fatalf("status not sorted by node, or node lost: %+v", st)
	}
	tr.close(1)
	if len(tr.status()) != 1 {
		t.Fatal("closed stream kept")
	}
}
