package xds_test

// The xDS protocol as hand-built streams over real gRPC: a delta
// (incremental) ADS stream subscribing and unsubscribing names, a
// state-of-the-world stream on a per-type service, a NACK logged and
// counted, and the metrics checked by promtool.

import (
	"bytes"
	"context"
	"log/slog"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointservice "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/internal/testutil/logbuf"
	"github.com/aethermesh/aether/internal/testutil/regtest"
	"github.com/aethermesh/aether/internal/testutil/wait"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/server"
)

// received runs a stream's Recv loop into a channel; the loop ends with
// the stream (its context is cancelled when the test ends) and is joined.
func received[T any](t *testing.T, recv func() (T, error)) <-chan T {
	out := make(chan T, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(out)
		for {
			m, err := recv()
			if err != nil {
				return
			}
			out <- m
		}
	}()
	t.Cleanup(func() { <-done })
	return out
}

func next[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case m, ok := <-ch:
		if !ok {
			t.Fatalf("%s: stream ended", what)
		}
		return m
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: no response in 5s", what)
	}
	panic("unreachable")
}

func dialXDS(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	return cc
}

func startOne(t *testing.T, log *logbuf.Buffer) *server.Server {
	t.Helper()
	etcd := etcdtest.Start(t)
	o := server.Config{EtcdEndpoints: etcd.Endpoints(), XDSAddr: "127.0.0.1:0",
		Options: registrar.Options{ClusterName: "c1", Region: "r1", Zone: "z1"}}
	if log != nil {
		o.Logger = slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	return regtest.Start(t, o)
}

func deltaNames(r *discoverygrpc.DeltaDiscoveryResponse) []string {
	var out []string
	for _, x := range r.GetResources() {
		out = append(out, x.GetName())
	}
	slices.Sort(out)
	return out
}

func lbAddrs(t *testing.T, r *discoverygrpc.Resource) []string {
	t.Helper()
	var cla endpointv3.ClusterLoadAssignment
	if err := r.GetResource().UnmarshalTo(&cla); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range cla.GetEndpoints() {
		for _, e := range l.GetLbEndpoints() {
			out = append(out, e.GetEndpoint().GetAddress().GetSocketAddress().GetAddress())
		}
	}
	slices.Sort(out)
	return out
}

// TestDeltaADSSubscribesAndUnsubscribes: a delta ADS stream gets the
// resources it subscribes to and only those, updates of them, none of a
// name it unsubscribed, and the removal of one that is gone.
func TestDeltaADSSubscribesAndUnsubscribes(t *testing.T) {
	t.Parallel()
	srv := startOne(t, nil)
	c := regtest.Dial(t, srv.GRPCAddr())
	bs := backends(t, "127.0.0.41", "127.0.0.42", "127.0.0.43", "127.0.0.44", "127.0.0.45")
	a, b, cc2, d := bs[0], bs[1], bs[2], bs[3]
	register(t, c, endpoint(a, "web", "z1"))
	register(t, c, endpoint(b, "api", "z1"))
	register(t, c, endpoint(bs[4], "db", "z1"))

	cc := dialXDS(t, srv.XDSAddr())
	defer cc.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(cc).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	resps := received(t, stream.Recv)
	send := func(req *discoverygrpc.DeltaDiscoveryRequest) {
		t.Helper()
		req.TypeUrl = resourcev3.EndpointType
		if err := stream.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	ack := func(r *discoverygrpc.DeltaDiscoveryResponse) {
		send(&discoverygrpc.DeltaDiscoveryRequest{ResponseNonce: r.GetNonce()})
	}

	send(&discoverygrpc.DeltaDiscoveryRequest{
		Node:                   &corev3.Node{Id: "delta-1", Locality: &corev3.Locality{Region: "r1", Zone: "z1"}},
		ResourceNamesSubscribe: []string{"web"},
	})
	r := next(t, resps, "subscribe web")
	if got := deltaNames(r); !slices.Equal(got, []string{"web"}) {
		t.Fatalf("subscribed to web, got %q", got)
	}
	if got := lbAddrs(t, r.GetResources()[0]); !slices.Equal(got, []string{a.Host()}) {
		t.Fatalf("web's endpoints: %q, want %s", got, a.Host())
	}
	ack(r)

	register(t, c, endpoint(cc2, "web", "z1"))
	r = next(t, resps, "web updated")
	if got := deltaNames(r); !slices.Equal(got, []string{"web"}) {
		t.Fatalf("after web changed, got %q", got)
	}
	if got := lbAddrs(t, r.GetResources()[0]); !slices.Equal(got, []string{a.Host(), cc2.Host()}) {
		t.Fatalf("web's endpoints: %q", got)
	}
	ack(r)

	send(&discoverygrpc.DeltaDiscoveryRequest{ResourceNamesSubscribe: []string{"api"}, ResponseNonce: r.GetNonce()})
	r = next(t, resps, "subscribe api")
	if got := deltaNames(r); !slices.Equal(got, []string{"api"}) {
		t.Fatalf("subscribed to api as well, got %q (only the new name is sent)", got)
	}
	ack(r)

	// The unsubscription gets no answer of its own; subscribing to db in
	// the same request does, which says the server has applied both
	// before web changes.
	send(&discoverygrpc.DeltaDiscoveryRequest{ResourceNamesUnsubscribe: []string{"web"}, ResourceNamesSubscribe: []string{"db"}, ResponseNonce: r.GetNonce()})
	r = next(t, resps, "unsubscribe web, subscribe db")
	if got := deltaNames(r); !slices.Equal(got, []string{"db"}) {
		t.Fatalf("subscribed to db, got %q", got)
	}
	ack(r)
	register(t, c, endpoint(d, "web", "z1")) // not to be sent: unsubscribed
	drain(t, c, endpoint(b, "api", "z1"))
	r = next(t, resps, "api drained")
	if got := deltaNames(r); !slices.Equal(got, []string{"api"}) {
		t.Fatalf("after unsubscribing web, got %q, want api alone", got)
	}
	ack(r)

	deregister(t, c, endpoint(b, "api", "z1"))
	r = next(t, resps, "api gone")
	if len(r.GetResources()) != 0 || !slices.Equal(r.GetRemovedResources(), []string{"api"}) {
		t.Fatalf("after api's last endpoint went: resources %q, removed %q; want api removed", deltaNames(r), r.GetRemovedResources())
	}
}

// TestSotwPerTypeServiceAndNACK: the EDS service (not ADS) answers a
// state-of-the-world request with the named resource alone; a NACK is
// logged with its error detail and counted; the metrics pass promtool.
func TestSotwPerTypeServiceAndNACK(t *testing.T) {
	t.Parallel()
	var log logbuf.Buffer
	srv := startOne(t, &log)
	c := regtest.Dial(t, srv.GRPCAddr())
	register(t, c, endpoint(backends(t, "127.0.0.51")[0], "web", "z1"))
	register(t, c, endpoint(backends(t, "127.0.0.52")[0], "api", "z1"))
	// The feed learns the writes from the registrar's subscription a moment
	// after they are acknowledged; the first response must already have
	// web, so wait until the feed serves both targets.
	wait.For(t, "the feed to hold web and api", 10*time.Second, func() bool {
		return regtest.MetricValue(t, srv.HTTPAddr(), "xds_targets") >= 2
	})

	cc := dialXDS(t, srv.XDSAddr())
	defer cc.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := endpointservice.NewEndpointDiscoveryServiceClient(cc).StreamEndpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	resps := received(t, stream.Recv)
	node := &corev3.Node{Id: "sotw-1"}
	if err := stream.Send(&discoverygrpc.DiscoveryRequest{Node: node, TypeUrl: resourcev3.EndpointType, ResourceNames: []string{"web"}}); err != nil {
		t.Fatal(err)
	}
	r := next(t, resps, "EDS web")
	if len(r.GetResources()) != 1 || r.GetVersionInfo() == "" {
		t.Fatalf("EDS for web: %d resources, version %q; want web alone, versioned", len(r.GetResources()), r.GetVersionInfo())
	}
	var cla endpointv3.ClusterLoadAssignment
	if err := r.GetResources()[0].UnmarshalTo(&cla); err != nil || cla.GetClusterName() != "web" {
		t.Fatalf("EDS for web: %v, %v", cla.GetClusterName(), err)
	}

	// Reject it, as a client whose validation failed would.
	if err := stream.Send(&discoverygrpc.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: []string{"web"},
		ResponseNonce: r.GetNonce(), ErrorDetail: &status.Status{Code: 3, Message: "test: endpoint rejected"}}); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "the NACK to be counted", 5*time.Second, func() bool {
		return metric(t, srv, "xds_nacks_total", "type", "endpoint") == 1
	})
	if s := log.String(); !strings.Contains(s, "NACK") || !strings.Contains(s, "test: endpoint rejected") || !strings.Contains(s, "sotw-1") {
		t.Errorf("the NACK's log line lacks the node or the error detail:\n%s", s)
	}
	if n := metric(t, srv, "xds_connected_clients", "service", "eds"); n != 1 {
		t.Errorf("xds_connected_clients{service=eds} = %v, want 1", n)
	}
	if n := metric(t, srv, "xds_pushes_total", "type", "endpoint"); n < 1 {
		t.Errorf("xds_pushes_total{type=endpoint} = %v, want at least 1", n)
	}
	if n := metric(t, srv, "xds_targets", "", ""); n != 2 {
		t.Errorf("xds_targets = %v, want 2", n)
	}

	tool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not found (%v): install it, e.g. apt-get install -y prometheus", err)
	}
	_, page := regtest.Get(t, "http://"+srv.HTTPAddr()+"/metrics")
	cmd := exec.Command(tool, "check", "metrics")
	cmd.Stdin = strings.NewReader(page)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil || out.Len() > 0 {
		t.Errorf("promtool check metrics: %v\n%s", err, out.String())
	}
}

// metric sums the samples of a family on the registrar's registry whose
// label (when named) has the value.
func metric(t *testing.T, srv *server.Server, name, label, value string) float64 {
	t.Helper()
	fams, err := srv.Registrar().MetricsRegistry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if label != "" && !hasLabel(m, label, value) {
				continue
			}
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

func hasLabel(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name && l.GetValue() == value {
			return true
		}
	}
	return false
}
