package registrar_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
)

func TestSubscribeChangesServicesOnALiveStream(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	s := startRegistrar(t, etcd.Endpoints())
	c := dial(t, s.GRPCAddr())
	register(t, c, ep("web", "10.0.0.1", 80))
	register(t, c, ep("db", "10.0.0.2", 5432))
	register(t, c, ep("db", "10.0.0.3", 5432))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := c.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&registrarv1.SubscribeRequest{Request: &registrarv1.SubscribeRequest_Start{Start: &registrarv1.WatchEndpointsRequest{Services: []string{"web"}}}}); err != nil {
		t.Fatal(err)
	}
	recv := func() *registrarv1.EndpointEvent {
		t.Helper()
		ev, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return ev
	}
	if ev := recv(); ev.Type != registrarv1.EndpointEvent_FULL_SNAPSHOT || len(ev.Endpoints) != 1 {
		t.Fatalf("first message %v", ev)
	}
	// Add db: a SERVICES_SNAPSHOT of exactly db's endpoints, then db's events.
	if err := st.Send(&registrarv1.SubscribeRequest{Request: &registrarv1.SubscribeRequest_Update{Update: &registrarv1.SubscriptionUpdate{Add: []string{"db", "web"}}}}); err != nil {
		t.Fatal(err)
	}
	ev := recv()
	if ev.Type != registrarv1.EndpointEvent_SERVICES_SNAPSHOT || strings.Join(ev.Services, ",") != "db" || len(ev.Endpoints) != 2 {
		t.Fatalf("after adding db: %v", ev)
	}
	snapSeq := ev.Sequence
	register(t, c, ep("db", "10.0.0.4", 5432))
	if ev := recv(); ev.Type != registrarv1.EndpointEvent_ENDPOINT_ADDED || ev.Endpoint.Ip != "10.0.0.4" || ev.Sequence <= snapSeq {
		t.Fatalf("db event after subscribing: %v", ev)
	}
	// Remove web: its events stop, db's keep coming, on the same stream.
	if err := st.Send(&registrarv1.SubscribeRequest{Request: &registrarv1.SubscribeRequest_Update{Update: &registrarv1.SubscriptionUpdate{Remove: []string{"web"}}}}); err != nil {
		t.Fatal(err)
	}
	// The update takes effect asynchronously. Each round writes one web and
	// then one db endpoint and reads up to the db event; once a round shows
	// no web event, no later round may show one.
	effective := false
	for round := 1; round <= 50; round++ {
		register(t, c, ep("web", fmt.Sprintf("10.0.9.%d", round), 80))
		register(t, c, ep("db", fmt.Sprintf("10.0.8.%d", round), 5432))
		sawWeb := false
		for {
			ev := recv()
			if ev.Type == registrarv1.EndpointEvent_PROGRESS {
				continue
			}
			if ev.Endpoint.Service == "web" {
				sawWeb = true
				continue
			}
			if ev.Endpoint.Ip == fmt.Sprintf("10.0.8.%d", round) {
				break
			}
		}
		if effective && sawWeb {
			t.Fatalf("round %d: a web event arrived after unsubscribing took effect", round)
		}
		if !sawWeb {
			if effective {
				break
			}
			effective = true
		}
	}
	if !effective {
		t.Fatal("web events kept arriving after unsubscribing")
	}
	if err := st.Send(&registrarv1.SubscribeRequest{Request: &registrarv1.SubscribeRequest_Update{Update: &registrarv1.SubscriptionUpdate{Add: []string{"bad/name"}}}}); err != nil {
		t.Fatal(err)
	}
	for {
		_, err := st.Recv()
		if err != nil {
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "update.add") {
				t.Fatalf("bad update ended the stream with %v", err)
			}
			break
		}
	}
}

func TestDrainKeepsEndpointListedAsDraining(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	s := startRegistrar(t, etcd.Endpoints())
	c := dial(t, s.GRPCAddr())
	e := ep("web", "10.0.0.1", 80)
	e.Metadata = map[string]string{"v": "1"}
	register(t, c, e)
	w := watch(t, c, &registrarv1.WatchEndpointsRequest{Services: []string{"web"}})
	w.waitSnapshot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.DrainEndpoint(ctx, &registrarv1.DrainEndpointRequest{Service: "web", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: "10.0.0.1"})
	if err != nil || resp.Endpoint.State != registryv1.State_STATE_DRAINING || resp.Endpoint.Metadata["v"] != "1" {
		t.Fatalf("drain = %v, %v", resp, err)
	}
	waitFor(t, "UPDATED to DRAINING", 5*time.Second, func() bool {
		for _, ev := range w.snapshot() {
			if ev.Type == registrarv1.EndpointEvent_ENDPOINT_UPDATED && ev.Endpoint.State == registryv1.State_STATE_DRAINING {
				return true
			}
		}
		return false
	})
	waitFor(t, "DRAINING persisted", 10*time.Second, func() bool {
		_, v := etcdKey(t, cli, e)
		return v != nil && v.State == registryv1.State_STATE_DRAINING
	})
	if _, err := c.DrainEndpoint(ctx, &registrarv1.DrainEndpointRequest{Service: "web", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: "10.0.0.9"}); status.Code(err) != codes.NotFound {
		t.Fatalf("drain of unknown endpoint: %v", err)
	}
}
