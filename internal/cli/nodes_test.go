package cli

import (
	"context"
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
)

func TestNodesAgainstRegistrar(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	r := startRegistrar(t, etcd)

	// Before any node announced itself.
	res := runCLI(t, nil, nil, "nodes", "--registrar", r.addr())
	if res.err != nil || res.stdout != "NODE  SITE  REGION  CLUSTER  ADDRESS  SERVICES  HEALTH  LAST HEARTBEAT\n" {
		t.Errorf("no nodes: %v, %q", res.err, res.stdout)
	}
	res = runCLI(t, nil, map[string]string{"AETHER_OUTPUT": "json"}, "nodes", "--registrar", r.addr())
	if res.err != nil || res.stdout != "{\n  \"nodes\": []\n}\n" {
		t.Errorf("no nodes, json: %v, %q", res.err, res.stdout)
	}

	// Announced in the order n2, n3, n1; listed by name.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, n := range []*registryv1.Node{
		{Name: "n2", Zone: "z2", Address: "FD00::7", Services: []string{"web"},
			Health: &registryv1.HealthSummary{Status: registryv1.Health_HEALTH_DEGRADED, Message: "1/2 endpoints serving"}},
		{Name: "n3"},
		{Name: "n1", Zone: "z1", Address: "10.9.0.1", Services: []string{"web", "api", "web"}, Labels: map[string]string{"rack": "r7"}},
	} {
		if _, err := r.c.AnnounceNode(ctx, &registrarv1.AnnounceNodeRequest{Node: n}); err != nil {
			t.Fatalf("announce %s: %v", n.GetName(), err)
		}
	}

	res = runCLI(t, nil, nil, "nodes", "--registrar", r.addr())
	if res.err != nil {
		t.Fatal(res.err)
	}
	lines := strings.Split(strings.TrimSuffix(res.stdout, "\n"), "\n")
	if len(lines) != 4 {
		t.Fatalf("table:\n%s", res.stdout)
	}
	cols := regexp.MustCompile(`\s{2,}`)
	if got := strings.Join(cols.Split(lines[0], -1), "|"); got != "NODE|SITE|REGION|CLUSTER|ADDRESS|SERVICES|HEALTH|LAST HEARTBEAT" {
		t.Errorf("header %q", lines[0])
	}
	ageRE := regexp.MustCompile(`^(\d+)s ago$`)
	for i, want := range []string{
		"n1|z1|eu|c1|10.9.0.1|api,web|HEALTHY",
		"n2|z2|eu|c1|fd00::7|web|DEGRADED (1/2 endpoints serving)",
		"n3|-|eu|c1|-|-|HEALTHY",
	} {
		f := cols.Split(lines[i+1], -1)
		if len(f) != 8 || strings.Join(f[:7], "|") != want {
			t.Errorf("row %d = %q, want %s and a heartbeat age", i, lines[i+1], want)
			continue
		}
		// Just announced: the lease was renewed moments ago.
		if m := ageRE.FindStringSubmatch(f[7]); m == nil {
			t.Errorf("row %d heartbeat %q", i, f[7])
		} else if age, _ := strconv.Atoi(m[1]); age > 5 {
			t.Errorf("row %d: last heartbeat %ds ago, just after announcing", i, age)
		}
	}

	// JSON: the API's field names, nodes in the same order.
	res = runCLI(t, nil, nil, "nodes", "--registrar", r.addr(), "-o", "json")
	if res.err != nil {
		t.Fatal(res.err)
	}
	var doc struct {
		Nodes []struct {
			Node map[string]json.RawMessage `json:"node"`
			Age  *float64                   `json:"last_heartbeat_age_seconds"`
		} `json:"nodes"`
	}
	if err := json.Unmarshal([]byte(res.stdout), &doc); err != nil {
		t.Fatalf("%v\n%s", err, res.stdout)
	}
	if len(doc.Nodes) != 3 {
		t.Fatalf("json has %d nodes:\n%s", len(doc.Nodes), res.stdout)
	}
	for _, n := range doc.Nodes {
		if n.Age == nil {
			t.Errorf("a node lacks last_heartbeat_age_seconds (0 is a real age):\n%s", res.stdout)
		}
	}
	for _, k := range []string{"name", "cluster", "region", "zone", "address", "services", "health", "labels", "lease_id", "lease_ttl_seconds", "announced_at"} {
		if _, ok := doc.Nodes[0].Node[k]; !ok {
			t.Errorf("node n1 lacks %q in json:\n%s", k, res.stdout)
		}
	}
	var resp registrarv1.ListNodesResponse
	if err := protojson.Unmarshal([]byte(res.stdout), &resp); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, st := range resp.GetNodes() {
		names = append(names, st.GetNode().GetName())
		if age := st.GetLastHeartbeatAgeSeconds(); age < 0 || age > 5 {
			t.Errorf("%s: last heartbeat %vs ago", st.GetNode().GetName(), age)
		}
		if rem := st.GetLeaseRemainingSeconds(); rem <= 0 || rem > 30 {
			t.Errorf("%s: lease remaining %vs, want within the 30s TTL", st.GetNode().GetName(), rem)
		}
	}
	n1, n2 := resp.GetNodes()[0].GetNode(), resp.GetNodes()[1].GetNode()
	if strings.Join(names, ",") != "n1,n2,n3" ||
		n1.GetZone() != "z1" || strings.Join(n1.GetServices(), ",") != "api,web" || n1.GetLabels()["rack"] != "r7" ||
		n1.GetHealth().GetStatus() != registryv1.Health_HEALTH_HEALTHY || n1.GetLeaseTtlSeconds() != 30 || n1.GetLeaseId() == 0 ||
		n2.GetAddress() != "fd00::7" || n2.GetHealth().GetMessage() != "1/2 endpoints serving" {
		t.Errorf("json nodes:\n%s", res.stdout)
	}
}

// HEALTH is what the registrar holds of a node's endpoints, not the node's
// claim: every node here claims 3 endpoints, all serving, as an agent would
// that registered them; the registrar holds 3 of one, 2 of another (it lost
// one), and 3 of the third with one drained by an operator.
func TestNodesHealthCountsWhatTheRegistrarHolds(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	r := startRegistrar(t, etcd)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	held := map[string]int{"full": 3, "short": 2, "drained": 3}
	for name, n := range held {
		if _, err := r.c.AnnounceNode(ctx, &registrarv1.AnnounceNodeRequest{Node: &registryv1.Node{Name: name,
			Health: &registryv1.HealthSummary{Status: registryv1.Health_HEALTH_HEALTHY, Message: "3/3 endpoints serving", EndpointsServing: 3, EndpointsTotal: 3}}}); err != nil {
			t.Fatalf("announce %s: %v", name, err)
		}
		for i := range n {
			r.register(t, &registryv1.ServiceEndpoint{Service: "web-" + name, Protocol: registryv1.Protocol_PROTOCOL_HTTP1,
				Ip: "10.8.0." + strconv.Itoa(i+1), Ports: []*registryv1.Port{{Name: "http", Port: 80}}, Node: name})
		}
	}
	if _, err := r.c.DrainEndpoint(ctx, &registrarv1.DrainEndpointRequest{Service: "web-drained", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: "10.8.0.2"}); err != nil {
		t.Fatal(err)
	}
	// An endpoint of a node with no record counts for no node.
	r.register(t, &registryv1.ServiceEndpoint{Service: "web-full", Protocol: registryv1.Protocol_PROTOCOL_HTTP1,
		Ip: "10.8.1.1", Ports: []*registryv1.Port{{Name: "http", Port: 80}}, Node: "gone"})

	res := runCLI(t, nil, nil, "nodes", "--registrar", r.addr())
	if res.err != nil {
		t.Fatal(res.err)
	}
	cols := regexp.MustCompile(`\s{2,}`)
	var got []string
	for _, line := range strings.Split(strings.TrimSuffix(res.stdout, "\n"), "\n")[1:] {
		f := cols.Split(line, -1)
		got = append(got, f[0]+"|"+f[6])
	}
	want := []string{
		"drained|DEGRADED (2/3 endpoints serving)",
		"full|HEALTHY (3/3 endpoints serving)",
		"short|DEGRADED (2/3 held by the registrar)",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("NODE|HEALTH:\n%s\nwant\n%s\n\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"), res.stdout)
	}

	// JSON has the claim and the registrar's counts side by side.
	res = runCLI(t, nil, nil, "nodes", "--registrar", r.addr(), "-o", "json")
	if res.err != nil {
		t.Fatal(res.err)
	}
	var resp registrarv1.ListNodesResponse
	if err := protojson.Unmarshal([]byte(res.stdout), &resp); err != nil {
		t.Fatal(err)
	}
	wantHeld := map[string][2]uint32{"drained": {3, 2}, "full": {3, 3}, "short": {2, 2}}
	for _, st := range resp.GetNodes() {
		h := st.GetNode().GetHealth()
		w := wantHeld[st.GetNode().GetName()]
		if h.GetEndpointsTotal() != 3 || h.GetEndpointsServing() != 3 || h.GetEndpointsHeld() != w[0] || h.GetEndpointsHeldServing() != w[1] {
			t.Errorf("%s: health %v, want the claim 3/3 and held %d, %d serving", st.GetNode().GetName(), h, w[0], w[1])
		}
	}
	if !strings.Contains(res.stdout, `"endpoints_held": 2`) || !strings.Contains(res.stdout, `"endpoints_held_serving": 2`) {
		t.Errorf("json lacks endpoints_held and endpoints_held_serving:\n%s", res.stdout)
	}
}

// The health column's rule, case by case, including summaries a node sent
// without endpoint counts (shown as sent) and an unhealthy node (never
// shown better than it says).
func TestNodeHealthRule(t *testing.T) {
	for _, c := range []struct {
		h    *registryv1.HealthSummary
		want string
	}{
		{nil, "UNSPECIFIED"},
		{&registryv1.HealthSummary{Status: registryv1.Health_HEALTH_DEGRADED, Message: "1/2 endpoints serving"}, "DEGRADED (1/2 endpoints serving)"},
		{&registryv1.HealthSummary{Status: registryv1.Health_HEALTH_HEALTHY, EndpointsTotal: 200, EndpointsServing: 200, EndpointsHeld: 200, EndpointsHeldServing: 200}, "HEALTHY (200/200 endpoints serving)"},
		{&registryv1.HealthSummary{Status: registryv1.Health_HEALTH_HEALTHY, EndpointsTotal: 200, EndpointsServing: 200, EndpointsHeld: 150, EndpointsHeldServing: 150}, "DEGRADED (150/200 held by the registrar)"},
		{&registryv1.HealthSummary{Status: registryv1.Health_HEALTH_HEALTHY, EndpointsTotal: 200, EndpointsServing: 200, EndpointsHeld: 0}, "DEGRADED (0/200 held by the registrar)"},
		{&registryv1.HealthSummary{Status: registryv1.Health_HEALTH_HEALTHY, EndpointsTotal: 200, EndpointsServing: 200, EndpointsHeld: 150, EndpointsHeldServing: 140}, "DEGRADED (150/200 held by the registrar, 140 serving)"},
		{&registryv1.HealthSummary{Status: registryv1.Health_HEALTH_DEGRADED, EndpointsTotal: 3, EndpointsServing: 2, EndpointsHeld: 3, EndpointsHeldServing: 2}, "DEGRADED (2/3 endpoints serving)"},
		{&registryv1.HealthSummary{Status: registryv1.Health_HEALTH_UNHEALTHY, EndpointsTotal: 3, EndpointsServing: 3, EndpointsHeld: 3, EndpointsHeldServing: 3}, "UNHEALTHY (3/3 endpoints serving)"},
		{&registryv1.HealthSummary{Status: registryv1.Health_HEALTH_HEALTHY, EndpointsHeld: 1, EndpointsHeldServing: 1}, "HEALTHY (1/1 endpoints serving)"},
	} {
		if got := nodeHealth(c.h); got != c.want {
			t.Errorf("nodeHealth(%v) = %q, want %q", c.h, got, c.want)
		}
	}
}
