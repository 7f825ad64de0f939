package registrar_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
)

func unregisterReq(ip, owner string) *registrarv1.UnregisterEndpointRequest {
	return &registrarv1.UnregisterEndpointRequest{Service: "web", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: ip, OwnerNode: owner}
}

func listedIPs(t *testing.T, c registrarv1.RegistrarClient) map[string]bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.ListAllEndpoints(ctx, &registrarv1.ListAllEndpointsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, e := range resp.GetEndpoints() {
		out[e.GetIp()] = true
	}
	return out
}

// An endpoint of a live node is removed only for that node: anyone else
// gets FAILED_PRECONDITION naming the node and the fix, and nothing
// changes. Once the node is gone, anyone may remove it. Endpoints without
// a node are anyone's.
func TestUnregisterOfALiveNodesEndpointIsTheNodesAlone(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	s := startRegistrar(t, etcd.Endpoints())
	c := dial(t, s.GRPCAddr())
	announce(t, c, "n1")
	for _, ip := range []string{"10.0.0.1", "10.0.0.2"} {
		register(t, c, ep("web", ip, 80)) // node n1
	}
	static := ep("web", "10.0.0.3", 80)
	static.Node = ""
	register(t, c, static)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	for _, owner := range []string{"", "n2"} {
		_, err := c.UnregisterEndpoint(ctx, unregisterReq("10.0.0.1", owner))
		if status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("unregister with owner_node %q: %v, want FAILED_PRECONDITION", owner, err)
		}
		msg := status.Convert(err).Message()
		for _, want := range []string{"10.0.0.1", `belongs to live node "n1"`, "--endpoint/--endpoints-file", "stop the agent", "once the node is gone it can be removed"} {
			if !strings.Contains(msg, want) {
				t.Errorf("refusal %q lacks %q", msg, want)
			}
		}
	}
	_, err := c.UnregisterEndpoint(ctx, unregisterReq("10.0.0.1", "a/b"))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "owner_node") {
		t.Errorf("owner_node a/b: %v, want INVALID_ARGUMENT naming owner_node", err)
	}
	if got := metricValue(t, s.HTTPAddr(), `registrar_requests_rejected_total{reason="owned"}`); got != 2 {
		t.Errorf(`rejected{reason="owned"} = %v, want 2`, got)
	}
	if !listedIPs(t, c)["10.0.0.1"] {
		t.Fatal("a refused unregister removed the endpoint")
	}

	// The node's own removal, and anyone's of a static endpoint.
	if _, err := c.UnregisterEndpoint(ctx, unregisterReq("10.0.0.2", "n1")); err != nil {
		t.Fatalf("unregister for its node: %v", err)
	}
	if _, err := c.UnregisterEndpoint(ctx, unregisterReq("10.0.0.3", "")); err != nil {
		t.Fatalf("unregister of an endpoint without a node: %v", err)
	}
	// An unknown endpoint is NOT_FOUND, whoever asks.
	if _, err := c.UnregisterEndpoint(ctx, unregisterReq("10.0.0.9", "")); status.Code(err) != codes.NotFound {
		t.Errorf("unregister of an unknown endpoint: %v, want NOT_FOUND", err)
	}

	// The node leaves: its endpoint, within the sweep's grace, is anyone's
	// to remove now, and stays removed.
	if _, err := c.LeaveNode(ctx, &registrarv1.LeaveNodeRequest{Node: "n1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.UnregisterEndpoint(ctx, unregisterReq("10.0.0.1", "")); err != nil {
		t.Fatalf("unregister after the node left: %v", err)
	}
	waitFor(t, "the removals persisted", 10*time.Second, func() bool { return s.Registrar().PendingWrites() == 0 })
	if l := listedIPs(t, c); len(l) != 0 {
		t.Errorf("endpoints left: %v", l)
	}
	if n := countKeys(t, cli); n != 0 {
		t.Errorf("etcd holds %d keys, want none", n)
	}
}

// ListNodes reports, next to each node's own claim, what the registrar
// holds of its endpoints and how many of those serve, as of the call.
func TestListNodesReportsHeldEndpoints(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	s := startRegistrar(t, etcd.Endpoints())
	c := dial(t, s.GRPCAddr())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	claim := &registryv1.HealthSummary{Status: registryv1.Health_HEALTH_HEALTHY, EndpointsServing: 3, EndpointsTotal: 3, Message: "3/3 endpoints serving"}
	for _, n := range []string{"n1", "n2"} {
		if _, err := c.AnnounceNode(ctx, &registrarv1.AnnounceNodeRequest{Node: &registryv1.Node{Name: n, Health: claim}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, ip := range []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"} {
		register(t, c, ep("web", ip, 80)) // node n1
	}
	if _, err := c.DrainEndpoint(ctx, &registrarv1.DrainEndpointRequest{Service: "web", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: "10.0.0.3"}); err != nil {
		t.Fatal(err)
	}
	held := func() map[string][2]uint32 {
		resp, err := c.ListNodes(ctx, &registrarv1.ListNodesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string][2]uint32{}
		for _, st := range resp.GetNodes() {
			h := st.GetNode().GetHealth()
			if h.GetEndpointsTotal() != 3 || h.GetEndpointsServing() != 3 || h.GetMessage() != claim.Message {
				t.Errorf("%s: the node's claim changed: %v", st.GetNode().GetName(), h)
			}
			out[st.GetNode().GetName()] = [2]uint32{h.GetEndpointsHeld(), h.GetEndpointsHeldServing()}
		}
		return out
	}
	if got := held(); got["n1"] != [2]uint32{3, 2} || got["n2"] != [2]uint32{0, 0} {
		t.Fatalf("held (total, serving) = %v, want n1 3 and 2, n2 none", got)
	}
	if _, err := c.UnregisterEndpoint(ctx, unregisterReq("10.0.0.1", "n1")); err != nil {
		t.Fatal(err)
	}
	if got := held(); got["n1"] != [2]uint32{2, 1} {
		t.Fatalf("after a removal held = %v, want n1 2 and 1", got)
	}
}
