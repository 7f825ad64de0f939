package registry

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
)

const (
	locServing  = registryv1.State_STATE_SERVING
	locDraining = registryv1.State_STATE_DRAINING
	locGRPC     = registryv1.Protocol_PROTOCOL_GRPC
	locHTTP1    = registryv1.Protocol_PROTOCOL_HTTP1
)

// lep builds an endpoint of service web (unless changed) for locality tests.
func lep(ip, region, zone string, state registryv1.State) *registryv1.ServiceEndpoint {
	return &registryv1.ServiceEndpoint{
		Service: "web", Protocol: locHTTP1, Ip: ip, Cluster: "c1",
		Region: region, Zone: zone, State: state, Weight: 1,
		Ports: []*registryv1.Port{{Name: "http", Port: 80}},
	}
}

func TestPriority(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name                 string
		epRegion, epZone     string
		fromRegion, fromZone string
		want                 int
	}{
		{"same zone", "eu", "eu-1a", "eu", "eu-1a", PriorityLocalZone},
		{"other zone", "eu", "eu-1b", "eu", "eu-1a", PriorityLocalRegion},
		{"endpoint zone unknown", "eu", "", "eu", "eu-1a", PriorityLocalRegion},
		{"consumer zone unknown, endpoint zoned", "eu", "eu-1b", "eu", "", PriorityLocalZone},
		{"consumer zone unknown, endpoint unzoned", "eu", "", "eu", "", PriorityLocalZone},
		{"other region", "us", "us-1a", "eu", "eu-1a", PriorityFailover},
		{"other region, same zone string", "us", "zone-1", "eu", "zone-1", PriorityFailover},
		{"other region, consumer zone unknown", "us", "", "eu", "", PriorityFailover},
		{"region compared exactly", "EU", "eu-1a", "eu", "eu-1a", PriorityFailover},
		{"zone compared exactly", "eu", "EU-1A", "eu", "eu-1a", PriorityLocalRegion},
		{"consumer region unknown", "eu", "eu-1a", "", "eu-1a", PriorityFailover},
		{"endpoint region unknown", "", "eu-1a", "eu", "eu-1a", PriorityFailover},
		{"both regions unknown", "", "", "", "", PriorityFailover},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ep := lep("10.0.0.1", tc.epRegion, tc.epZone, locServing)
			if got := Priority(ep, tc.fromRegion, tc.fromZone); got != tc.want {
				t.Errorf("Priority(endpoint %s/%s, consumer %s/%s) = %d, want %d",
					tc.epRegion, tc.epZone, tc.fromRegion, tc.fromZone, got, tc.want)
			}
		})
	}
	// A nil endpoint has no region, so it is not local.
	if got := Priority(nil, "eu", "eu-1a"); got != PriorityFailover {
		t.Errorf("Priority(nil) = %d, want %d", got, PriorityFailover)
	}
}

// summary renders a ByLocality result as "prio:service/proto/ip@region/zone".
func locSummary(ps []Prioritized) string {
	parts := make([]string, len(ps))
	for i, p := range ps {
		ep := p.Endpoint
		parts[i] = fmt.Sprintf("%d:%s/%s/%s@%s/%s", p.Priority, ep.GetService(), ProtocolName(ep.GetProtocol()), ep.GetIp(), ep.GetRegion(), ep.GetZone())
	}
	return strings.Join(parts, " ")
}

func TestByLocality(t *testing.T) {
	t.Parallel()
	// Deliberately out of order.
	mixed := func() []*registryv1.ServiceEndpoint {
		return []*registryv1.ServiceEndpoint{
			lep("10.0.1.1", "us", "eu-1a", locServing),  // foreign region, zone name equal to the consumer's
			lep("10.0.0.10", "eu", "eu-1a", locServing), // local zone; sorts after .9 numerically
			lep("10.0.0.3", "eu", "eu-1a", locDraining), // excluded
			lep("10.0.0.9", "eu", "eu-1a", locServing),  // local zone
			lep("10.0.0.5", "eu", "eu-1b", locServing),  // other zone
			lep("10.0.0.4", "eu", "", locServing),       // zone unknown
			lep("10.0.2.1", "us", "us-1a", locDraining), // excluded even as failover
			lep("10.0.0.6", "eu", "eu-1b", 0),           // UNSPECIFIED: excluded
			lep("10.0.0.7", "eu", "eu-1a", 7),           // unknown state: excluded
			lep("fd00::1", "eu", "eu-1a", locServing),   // IPv6 after IPv4
			lep("10.0.0.2", "ap", "ap-1a", locServing),  // failover, region sorts first but priority wins
			{Service: "api", Protocol: locGRPC, Ip: "10.0.0.8", Region: "eu", Zone: "eu-1b", State: locServing},
			{Service: "web", Protocol: locGRPC, Ip: "10.0.0.9", Region: "eu", Zone: "eu-1a", State: locServing},
			nil,
		}
	}
	tests := []struct {
		name         string
		eps          []*registryv1.ServiceEndpoint
		region, zone string
		want         string
	}{
		{"empty input", nil, "eu", "eu-1a", ""},
		{"only draining", []*registryv1.ServiceEndpoint{lep("10.0.0.1", "eu", "eu-1a", locDraining)}, "eu", "eu-1a", ""},
		{"consumer in a zone", mixed(), "eu", "eu-1a",
			"0:web/grpc/10.0.0.9@eu/eu-1a 0:web/http/10.0.0.9@eu/eu-1a 0:web/http/10.0.0.10@eu/eu-1a 0:web/http/fd00::1@eu/eu-1a " +
				"1:api/grpc/10.0.0.8@eu/eu-1b 1:web/http/10.0.0.4@eu/ 1:web/http/10.0.0.5@eu/eu-1b " +
				"2:web/http/10.0.0.2@ap/ap-1a 2:web/http/10.0.1.1@us/eu-1a"},
		{"consumer without a zone: whole region is the nearest tier", mixed(), "eu", "",
			"0:api/grpc/10.0.0.8@eu/eu-1b 0:web/grpc/10.0.0.9@eu/eu-1a 0:web/http/10.0.0.4@eu/ 0:web/http/10.0.0.5@eu/eu-1b " +
				"0:web/http/10.0.0.9@eu/eu-1a 0:web/http/10.0.0.10@eu/eu-1a 0:web/http/fd00::1@eu/eu-1a " +
				"2:web/http/10.0.0.2@ap/ap-1a 2:web/http/10.0.1.1@us/eu-1a"},
		{"consumer in a zone with no endpoints", mixed(), "eu", "eu-1c",
			"1:api/grpc/10.0.0.8@eu/eu-1b 1:web/grpc/10.0.0.9@eu/eu-1a 1:web/http/10.0.0.4@eu/ 1:web/http/10.0.0.5@eu/eu-1b " +
				"1:web/http/10.0.0.9@eu/eu-1a 1:web/http/10.0.0.10@eu/eu-1a 1:web/http/fd00::1@eu/eu-1a " +
				"2:web/http/10.0.0.2@ap/ap-1a 2:web/http/10.0.1.1@us/eu-1a"},
		{"consumer in a region with no endpoints", mixed(), "sa", "eu-1a",
			"2:api/grpc/10.0.0.8@eu/eu-1b 2:web/grpc/10.0.0.9@eu/eu-1a 2:web/http/10.0.0.2@ap/ap-1a 2:web/http/10.0.0.4@eu/ " +
				"2:web/http/10.0.0.5@eu/eu-1b 2:web/http/10.0.0.9@eu/eu-1a 2:web/http/10.0.0.10@eu/eu-1a 2:web/http/10.0.1.1@us/eu-1a " +
				"2:web/http/fd00::1@eu/eu-1a"},
		{"foreign region with the consumer's zone name stays failover",
			[]*registryv1.ServiceEndpoint{lep("10.0.0.1", "us", "zone-1", locServing), lep("10.0.0.2", "eu", "zone-2", locServing)}, "eu", "zone-1",
			"1:web/http/10.0.0.2@eu/zone-2 2:web/http/10.0.0.1@us/zone-1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := ByLocality(tc.eps, tc.region, tc.zone)
			if s := locSummary(got); s != tc.want {
				t.Errorf("ByLocality(%s, %s):\ngot  %s\nwant %s", tc.region, tc.zone, s, tc.want)
			}
			for _, p := range got {
				if p.Endpoint.GetState() != locServing {
					t.Errorf("non-locServing endpoint %s in the locServing set", p.Endpoint.GetIp())
				}
				if want := Priority(p.Endpoint, tc.region, tc.zone); p.Priority != want {
					t.Errorf("%s: priority %d, Priority says %d", p.Endpoint.GetIp(), p.Priority, want)
				}
			}
		})
	}
}

// TestByLocalityStable checks that the order does not depend on the input
// order, and that endpoints of the same identity keep their input order.
func TestByLocalityStable(t *testing.T) {
	t.Parallel()
	var eps []*registryv1.ServiceEndpoint
	for i := range 40 {
		ep := lep(fmt.Sprintf("10.0.%d.%d", i%3, i), []string{"eu", "us"}[i%2], fmt.Sprintf("eu-1%c", 'a'+i%3), locServing)
		ep.Cluster = fmt.Sprintf("c%d", i%2)
		eps = append(eps, ep)
	}
	want := locSummary(ByLocality(eps, "eu", "eu-1a"))
	rev := slices.Clone(eps)
	slices.Reverse(rev)
	if got := locSummary(ByLocality(rev, "eu", "eu-1a")); got != want {
		t.Errorf("reversed input gives another order:\ngot  %s\nwant %s", got, want)
	}
	rot := append(slices.Clone(eps[17:]), eps[:17]...)
	if got := locSummary(ByLocality(rot, "eu", "eu-1a")); got != want {
		t.Errorf("rotated input gives another order:\ngot  %s\nwant %s", got, want)
	}

	// Same identity twice (e.g. a stale and a fresh copy): input order kept.
	a := lep("10.0.0.1", "eu", "eu-1a", locServing)
	b := proto.Clone(a).(*registryv1.ServiceEndpoint)
	b.Weight = 2
	got := ByLocality([]*registryv1.ServiceEndpoint{b, a}, "eu", "eu-1a")
	if len(got) != 2 || got[0].Endpoint != b || got[1].Endpoint != a {
		t.Errorf("equal identities reordered: %v", got)
	}

	// Same service, protocol and IP in two clusters: cluster decides.
	c2 := lep("10.0.0.1", "eu", "eu-1a", locServing)
	c2.Cluster = "c2"
	c1 := lep("10.0.0.1", "eu", "eu-1a", locServing)
	got = ByLocality([]*registryv1.ServiceEndpoint{c2, c1}, "eu", "eu-1a")
	if got[0].Endpoint != c1 || got[1].Endpoint != c2 {
		t.Errorf("clusters not ordered: %s, %s", got[0].Endpoint.GetCluster(), got[1].Endpoint.GetCluster())
	}
}

func TestByLocalityDoesNotMutate(t *testing.T) {
	t.Parallel()
	eps := []*registryv1.ServiceEndpoint{
		lep("10.0.0.3", "us", "us-1a", locServing),
		lep("10.0.0.2", "eu", "eu-1a", locDraining),
		lep("10.0.0.1", "eu", "eu-1a", locServing),
	}
	orig := make([]*registryv1.ServiceEndpoint, len(eps))
	copies := make([]*registryv1.ServiceEndpoint, len(eps))
	for i, ep := range eps {
		orig[i] = ep
		copies[i] = proto.Clone(ep).(*registryv1.ServiceEndpoint)
	}
	got := ByLocality(eps, "eu", "eu-1a")
	if len(got) != 2 || got[0].Endpoint != eps[2] {
		t.Fatalf("got %s", locSummary(got))
	}
	for i := range eps {
		if eps[i] != orig[i] {
			t.Errorf("input slice reordered at %d", i)
		}
		if !proto.Equal(eps[i], copies[i]) {
			t.Errorf("endpoint %d modified: %v", i, eps[i])
		}
	}
}
