package xds

import (
	"fmt"
	"math"
	"net"
	"slices"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
)

func ep(svc, ip, region, zone string, ports ...string) *registryv1.ServiceEndpoint {
	e := &registryv1.ServiceEndpoint{Service: svc, Protocol: registryv1.Protocol_PROTOCOL_GRPC, Ip: ip,
		Region: region, Cluster: "c1", Zone: zone, State: registryv1.State_STATE_SERVING, Weight: 1}
	if len(ports) == 0 {
		ports = []string{"grpc=8080"}
	}
	for _, p := range ports {
		name, num, _ := strings.Cut(p, "=")
		var n uint32
		fmt.Sscan(num, &n)
		e.Ports = append(e.Ports, &registryv1.Port{Name: name, Port: n})
	}
	return e
}

func draining(e *registryv1.ServiceEndpoint) *registryv1.ServiceEndpoint {
	e.State = registryv1.State_STATE_DRAINING
	return e
}

func weighted(e *registryv1.ServiceEndpoint, w uint32) *registryv1.ServiceEndpoint {
	e.Weight = w
	return e
}

// claString renders a load assignment as "p<prio> region/zone
// w<locality weight>: ip:port(H|D)w<endpoint weight>", one locality per
// line, for comparisons. The sub-zone is left out: checkShape checks that
// it is the address of the locality's one endpoint.
func claString(cla *endpointv3.ClusterLoadAssignment) string {
	var b strings.Builder
	for _, l := range cla.GetEndpoints() {
		fmt.Fprintf(&b, "p%d %s/%s w%d:", l.GetPriority(), l.GetLocality().GetRegion(), l.GetLocality().GetZone(), l.GetLoadBalancingWeight().GetValue())
		for _, e := range l.GetLbEndpoints() {
			a := e.GetEndpoint().GetAddress().GetSocketAddress()
			h := "H"
			if e.GetHealthStatus() == corev3.HealthStatus_DRAINING {
				h = "D"
			}
			fmt.Fprintf(&b, " %s:%d%sw%d", a.GetAddress(), a.GetPortValue(), h, e.GetLoadBalancingWeight().GetValue())
		}
		b.WriteString("\n")
	}
	return b.String()
}

func TestLoadAssignmentPriorities(t *testing.T) {
	here := Locality{Region: "r1", Zone: "z1"}
	for _, tc := range []struct {
		name     string
		eps      []*registryv1.ServiceEndpoint
		consumer Locality
		want     string
	}{
		{
			name: "zone, region, other region",
			eps: []*registryv1.ServiceEndpoint{
				ep("web", "10.0.0.2", "r1", "z1"), ep("web", "10.0.0.1", "r1", "z1"),
				ep("web", "10.0.1.1", "r1", "z2"), ep("web", "10.1.0.1", "r2", "z1"),
			},
			consumer: here,
			want: "p0 r1/z1 w1: 10.0.0.1:8080Hw1\n" +
				"p0 r1/z1 w1: 10.0.0.2:8080Hw1\n" +
				"p1 r1/z2 w1: 10.0.1.1:8080Hw1\n" +
				"p2 r2/z1 w1: 10.1.0.1:8080Hw1\n",
		},
		{
			name:     "no endpoint in the zone: the region is priority 0",
			eps:      []*registryv1.ServiceEndpoint{ep("web", "10.0.1.1", "r1", "z2"), ep("web", "10.1.0.1", "r2", "z1")},
			consumer: here,
			want:     "p0 r1/z2 w1: 10.0.1.1:8080Hw1\np1 r2/z1 w1: 10.1.0.1:8080Hw1\n",
		},
		{
			name:     "only other regions",
			eps:      []*registryv1.ServiceEndpoint{ep("web", "10.1.0.1", "r2", "z1"), ep("web", "10.2.0.1", "r3", "z9")},
			consumer: here,
			want:     "p0 r2/z1 w1: 10.1.0.1:8080Hw1\np0 r3/z9 w1: 10.2.0.1:8080Hw1\n",
		},
		{
			name:     "zone and other region, no other zone: no gap",
			eps:      []*registryv1.ServiceEndpoint{ep("web", "10.0.0.1", "r1", "z1"), ep("web", "10.1.0.1", "r2", "z1")},
			consumer: here,
			want:     "p0 r1/z1 w1: 10.0.0.1:8080Hw1\np1 r2/z1 w1: 10.1.0.1:8080Hw1\n",
		},
		{
			name:     "a consumer with no zone has its region first",
			eps:      []*registryv1.ServiceEndpoint{ep("web", "10.0.0.1", "r1", "z1"), ep("web", "10.0.1.1", "r1", "z2"), ep("web", "10.1.0.1", "r2", "z1")},
			consumer: Locality{Region: "r1"},
			want:     "p0 r1/z1 w1: 10.0.0.1:8080Hw1\np0 r1/z2 w1: 10.0.1.1:8080Hw1\np1 r2/z1 w1: 10.1.0.1:8080Hw1\n",
		},
		{
			name: "a draining endpoint is sent as DRAINING in its serving zone's priority",
			eps: []*registryv1.ServiceEndpoint{
				ep("web", "10.0.0.1", "r1", "z1"), draining(ep("web", "10.0.0.2", "r1", "z1")), ep("web", "10.0.1.1", "r1", "z2"),
			},
			consumer: here,
			want:     "p0 r1/z1 w1: 10.0.0.1:8080Hw1\np0 r1/z1 w1: 10.0.0.2:8080Dw1\np1 r1/z2 w1: 10.0.1.1:8080Hw1\n",
		},
		{
			name: "an all-draining zone goes after the serving tiers",
			eps: []*registryv1.ServiceEndpoint{
				draining(ep("web", "10.0.0.1", "r1", "z1")), draining(ep("web", "10.0.0.2", "r1", "z1")),
				ep("web", "10.0.1.1", "r1", "z2"), ep("web", "10.1.0.1", "r2", "z1"),
			},
			consumer: here,
			want: "p0 r1/z2 w1: 10.0.1.1:8080Hw1\np1 r2/z1 w1: 10.1.0.1:8080Hw1\n" +
				"p2 r1/z1 w1: 10.0.0.1:8080Dw1\np2 r1/z1 w1: 10.0.0.2:8080Dw1\n",
		},
		{
			name:     "everything draining: one priority 0",
			eps:      []*registryv1.ServiceEndpoint{draining(ep("web", "10.0.0.1", "r1", "z1")), draining(ep("web", "10.1.0.1", "r2", "z1"))},
			consumer: here,
			want:     "p0 r1/z1 w1: 10.0.0.1:8080Dw1\np0 r2/z1 w1: 10.1.0.1:8080Dw1\n",
		},
		{
			name: "each endpoint's weight is its locality's weight (grpc-go honours those) and its own (Envoy's)",
			eps: []*registryv1.ServiceEndpoint{
				weighted(ep("web", "10.0.0.1", "r1", "z1"), 3), weighted(ep("web", "10.0.0.2", "r1", "z1"), 5),
				weighted(draining(ep("web", "10.0.0.3", "r1", "z1")), 7), weighted(ep("web", "10.0.0.4", "r1", "z1"), 0),
				weighted(ep("web", "10.0.1.1", "r1", "z2"), 2),
			},
			consumer: here,
			want: "p0 r1/z1 w3: 10.0.0.1:8080Hw3\np0 r1/z1 w5: 10.0.0.2:8080Hw5\n" +
				"p0 r1/z1 w7: 10.0.0.3:8080Dw7\np0 r1/z1 w1: 10.0.0.4:8080Hw1\n" +
				"p1 r1/z2 w2: 10.0.1.1:8080Hw2\n",
		},
		{
			name: "one address on two ports: two localities, each named by its address",
			eps: []*registryv1.ServiceEndpoint{
				ep("web", "10.0.0.1", "r1", "z1", "grpc=8080"),
				func() *registryv1.ServiceEndpoint {
					e := ep("web", "10.0.0.1", "r1", "z1", "grpc=8081")
					e.Protocol = registryv1.Protocol_PROTOCOL_HTTP2
					return e
				}(),
			},
			consumer: here,
			want:     "p0 r1/z1 w1: 10.0.0.1:8080Hw1\np0 r1/z1 w1: 10.0.0.1:8081Hw1\n",
		},
		{
			name:     "IPv6: the sub-zone is [ip]:port",
			eps:      []*registryv1.ServiceEndpoint{ep("web", "2001:db8::1", "r1", "z1")},
			consumer: here,
			want:     "p0 r1/z1 w1: 2001:db8::1:8080Hw1\n",
		},
		{
			name: "the same address under two protocols is sent once, serving if either is",
			eps: func() []*registryv1.ServiceEndpoint {
				a, b := ep("web", "10.0.0.1", "r1", "z1"), draining(ep("web", "10.0.0.1", "r1", "z1"))
				b.Protocol = registryv1.Protocol_PROTOCOL_HTTP2
				return []*registryv1.ServiceEndpoint{b, a}
			}(),
			consumer: here,
			want:     "p0 r1/z1 w1: 10.0.0.1:8080Hw1\n",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := Targets("web", tc.eps)
			if len(ts) != 1 {
				t.Fatalf("targets: %v", ts)
			}
			cla := LoadAssignment(ts[0], tc.consumer)
			if got := claString(cla); got != tc.want {
				t.Errorf("got\n%swant\n%s", got, tc.want)
			}
			if err := cla.Validate(); err != nil {
				t.Errorf("Validate: %v", err)
			}
			checkShape(t, cla)
		})
	}
}

// checkShape is grpc-go's rules (priorities 0..n-1, none missing, every
// locality weighted, no locality twice in a priority, no address twice)
// and the mapping's: one endpoint per locality, its sub-zone the
// endpoint's address, the locality's weight the endpoint's.
func checkShape(t *testing.T, cla *endpointv3.ClusterLoadAssignment) {
	t.Helper()
	seen := map[uint32]bool{}
	ids := map[string]bool{}
	for _, l := range cla.GetEndpoints() {
		seen[l.GetPriority()] = true
		if l.GetLoadBalancingWeight().GetValue() == 0 {
			t.Errorf("locality %v without weight", l.GetLocality())
		}
		if len(l.GetLbEndpoints()) != 1 {
			t.Errorf("locality %v has %d endpoints, want 1", l.GetLocality(), len(l.GetLbEndpoints()))
			continue
		}
		e := l.GetLbEndpoints()[0]
		a := e.GetEndpoint().GetAddress().GetSocketAddress()
		addr := net.JoinHostPort(a.GetAddress(), fmt.Sprint(a.GetPortValue()))
		if l.GetLocality().GetSubZone() != addr {
			t.Errorf("locality %v holds %s: sub-zone is not the address", l.GetLocality(), addr)
		}
		if ids[addr] {
			t.Errorf("%s twice", addr)
		}
		ids[addr] = true
		if l.GetLoadBalancingWeight().GetValue() != e.GetLoadBalancingWeight().GetValue() {
			t.Errorf("locality %v weighs %d, its endpoint %d", l.GetLocality(), l.GetLoadBalancingWeight().GetValue(), e.GetLoadBalancingWeight().GetValue())
		}
	}
	for p := range uint32(len(seen)) {
		if !seen[p] {
			t.Errorf("priority %d missing from %v", p, seen)
		}
	}
}

func TestTargetsNaming(t *testing.T) {
	for _, tc := range []struct {
		name string
		eps  []*registryv1.ServiceEndpoint
		want []string // name=port: addresses
	}{
		{"one port: the service's name", []*registryv1.ServiceEndpoint{ep("web", "10.0.0.1", "r1", "z1")}, []string{"web=grpc: 10.0.0.1:8080"}},
		{
			"several ports on one endpoint: one target per port",
			[]*registryv1.ServiceEndpoint{ep("web", "10.0.0.1", "r1", "z1", "admin=9000", "grpc=8080")},
			[]string{"web:admin=admin: 10.0.0.1:9000", "web:grpc=grpc: 10.0.0.1:8080"},
		},
		{
			"ports differing between endpoints: the union, each with the endpoints that have it",
			[]*registryv1.ServiceEndpoint{ep("web", "10.0.0.1", "r1", "z1", "grpc=8080"), ep("web", "10.0.0.2", "r1", "z1", "http=80")},
			[]string{"web:grpc=grpc: 10.0.0.1:8080", "web:http=http: 10.0.0.2:80"},
		},
		{"no endpoints: no target", nil, nil},
		{"other services' endpoints are ignored", []*registryv1.ServiceEndpoint{ep("api", "10.0.0.1", "r1", "z1"), nil}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, tg := range Targets("web", tc.eps) {
				var addrs []string
				for _, e := range tg.Endpoints {
					addrs = append(addrs, fmt.Sprintf("%s:%d", e.IP, e.Port))
				}
				got = append(got, fmt.Sprintf("%s=%s: %s", tg.Name, tg.Port, strings.Join(addrs, " ")))
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// TestTranslateResourcesValidate checks every resource against its envoy
// proto's Validate (what Envoy itself checks on receipt: no Envoy binary
// is available here) and the snapshot's references with
// a check of every reference between them.
func TestTranslateResourcesValidate(t *testing.T) {
	services := map[string][]*registryv1.ServiceEndpoint{
		"web": {ep("web", "10.0.0.1", "r1", "z1"), draining(ep("web", "10.0.0.2", "r1", "z2")), ep("web", "2001:db8::1", "r2", "z1")},
		"api": {ep("api", "10.0.0.3", "r1", "z1", "grpc=8080", "admin=9000")},
	}
	r := Translate(services, Locality{Region: "r1", Zone: "z1"})
	names := func(rs []types.Resource) []string {
		var out []string
		for _, x := range rs {
			out = append(out, cachev3.GetResourceName(x))
		}
		return out
	}
	var lis, rts, cls, eds []types.Resource
	for _, x := range r.Listeners {
		lis = append(lis, x)
		if err := x.Validate(); err != nil {
			t.Errorf("listener %s: %v", x.Name, err)
		}
	}
	for _, x := range r.Routes {
		rts = append(rts, x)
		if err := x.Validate(); err != nil {
			t.Errorf("route %s: %v", x.Name, err)
		}
	}
	for _, x := range r.Clusters {
		cls = append(cls, x)
		if err := x.Validate(); err != nil {
			t.Errorf("cluster %s: %v", x.Name, err)
		}
	}
	for _, x := range r.Endpoints {
		eds = append(eds, x)
		if err := x.Validate(); err != nil {
			t.Errorf("endpoints %s: %v", x.ClusterName, err)
		}
	}
	want := []string{"api:admin", "api:grpc", "web"}
	for typ, rs := range map[string][]types.Resource{"listeners": lis, "routes": rts, "clusters": cls, "endpoints": eds} {
		if got := names(rs); !slices.Equal(got, want) {
			t.Errorf("%s: %q, want %q", typ, got, want)
		}
	}
	// go-control-plane's Snapshot.Consistent finds RDS names only in
	// filter chains, not in API listeners, so the references are checked
	// here: listener → route → cluster → load assignment, all present.
	have := map[string]bool{}
	for _, x := range r.Routes {
		have["route/"+x.Name] = true
		for _, vh := range x.VirtualHosts {
			for _, rt := range vh.Routes {
				if c := rt.GetRoute().GetCluster(); !slices.ContainsFunc(r.Clusters, func(cl *clusterv3.Cluster) bool { return cl.Name == c }) {
					t.Errorf("route %s names cluster %q, which is not served", x.Name, c)
				}
			}
		}
	}
	for _, x := range r.Endpoints {
		have["eds/"+x.ClusterName] = true
	}
	for _, x := range r.Listeners {
		var hcm hcmv3.HttpConnectionManager
		if err := x.GetApiListener().GetApiListener().UnmarshalTo(&hcm); err != nil {
			t.Fatalf("listener %s: %v", x.Name, err)
		}
		if n := hcm.GetRds().GetRouteConfigName(); !have["route/"+n] {
			t.Errorf("listener %s names route %q, which is not served", x.Name, n)
		}
		if hcm.GetRds().GetConfigSource().GetAds() == nil {
			t.Errorf("listener %s: RDS not over ADS", x.Name)
		}
	}
	for _, x := range r.Clusters {
		if n := x.GetEdsClusterConfig().GetServiceName(); !have["eds/"+n] {
			t.Errorf("cluster %s names load assignment %q, which is not served", x.Name, n)
		}
		if x.GetType() != clusterv3.Cluster_EDS || x.GetEdsClusterConfig().GetEdsConfig().GetAds() == nil || x.GetLbPolicy() != clusterv3.Cluster_ROUND_ROBIN {
			t.Errorf("cluster %s: not EDS over ADS, round robin: %v", x.Name, x)
		}
	}
}

// TestScaleKeepsSumsWithinGRPCsLimit: weights whose total exceeds
// 2^32-1 are shrunk so the total fits, keeping their ratios, none 0.
func TestScaleKeepsSumsWithinGRPCsLimit(t *testing.T) {
	if got := scale(7, 100); got != 7 {
		t.Errorf("scale(7, 100) = %d: a total that fits leaves weights alone", got)
	}
	ws := []uint64{math.MaxUint32, math.MaxUint32, math.MaxUint32 / 2, 1}
	var total, sum uint64
	for _, w := range ws {
		total += w
	}
	var out []uint32
	for _, w := range ws {
		s := scale(w, total)
		out = append(out, s)
		sum += uint64(s)
	}
	if sum > math.MaxUint32 || out[3] == 0 || out[0] != out[1] || out[0] < 2*out[2]-1 || out[0] > 2*out[2]+1 {
		t.Errorf("scaled %v to %v (sum %d): want the sum within 2^32-1, the ratios kept, nothing 0", ws, out, sum)
	}
}

// TestLoadAssignmentWeightsFitGRPCsLimit: endpoints whose weights sum to
// more than 2^32-1 in one priority have their localities' weights scaled
// so that grpc-go accepts the assignment ("sum of weights of localities
// at the same priority exceeded maximal value" otherwise), ratios kept;
// each endpoint's own weight, alone in its locality, is left as it is.
func TestLoadAssignmentWeightsFitGRPCsLimit(t *testing.T) {
	eps := []*registryv1.ServiceEndpoint{
		weighted(ep("web", "10.0.0.1", "r1", "z1"), math.MaxUint32), weighted(ep("web", "10.0.0.2", "r1", "z1"), math.MaxUint32/2),
		weighted(ep("web", "10.0.1.1", "r1", "z2"), math.MaxUint32),
	}
	cla := LoadAssignment(Targets("web", eps)[0], Locality{Region: "r1", Zone: "z1"})
	if err := cla.Validate(); err != nil {
		t.Fatal(err)
	}
	sums := map[uint32]uint64{}
	var w []uint32
	for _, l := range cla.GetEndpoints() {
		sums[l.GetPriority()] += uint64(l.GetLoadBalancingWeight().GetValue())
		w = append(w, l.GetLoadBalancingWeight().GetValue())
	}
	if sums[0] > math.MaxUint32 || w[0] < 2*w[1]-1 || w[0] > 2*w[1]+1 {
		t.Errorf("priority 0 locality weights %v (sum %d): want the sum within 2^32-1, 2:1 kept", w[:2], sums[0])
	}
	if w[2] != math.MaxUint32 {
		t.Errorf("priority 1, alone: weight %d, want it unscaled", w[2])
	}
	for _, l := range cla.GetEndpoints() {
		if e := l.GetLbEndpoints()[0]; e.GetLoadBalancingWeight().GetValue() < math.MaxUint32/2 {
			t.Errorf("endpoint weight %d scaled", e.GetLoadBalancingWeight().GetValue())
		}
	}
}
