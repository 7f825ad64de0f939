// Package xds serves what the registrar knows as xDS, the discovery
// protocol of Envoy and of gRPC's proxyless clients (grpc-go's xds:///
// resolver), on go-control-plane's server.
//
// It has three parts:
//
//   - translate.go, pure: the endpoints of a service become the resources
//     a proxyless gRPC client needs (Listener, RouteConfiguration,
//     Cluster, ClusterLoadAssignment), the last one ordered for a
//     consumer's locality;
//   - feed.go: an in-process subscription to the registrar (no polling)
//     keeps go-control-plane LinearCaches current (per-resource
//     versions), the load assignments one cache per consumer locality;
//   - server.go: go-control-plane's server (ADS and the per-type services,
//     state-of-the-world and delta) on a grpc.Server, with the callbacks
//     that count and log clients, pushes and NACKs.
package xds

import (
	"cmp"
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/registry"
)

// Locality is where a consumer (or an endpoint) is: its region and zone.
type Locality struct {
	Region, Zone string
}

func (l Locality) String() string { return l.Region + "/" + l.Zone }

// Target is one thing a client can dial, xds:///<Name>: a service when
// all its endpoints together name one port, else one named port of it.
//
// Naming: a service whose endpoints name a single port (whatever its
// name) is the target "<service>"; a service whose endpoints name several
// ports is one target per port name, "<service>:<port>", and no target
// "<service>", because a client that asked for "web" would otherwise get
// one of several ports picked by a rule it cannot see. The port set is
// the union over the service's endpoints, so a service gaining a second
// port name renames its target: clients of such services should dial the
// "<service>:<port>" form from the start. ':' cannot occur in a service or
// port name (registry.ValidateName), so the two forms never collide. The
// Listener, RouteConfiguration, Cluster and ClusterLoadAssignment of a
// target all carry its name.
type Target struct {
	Name      string
	Service   string
	Port      string // the port name
	Endpoints []Endpoint
}

// Endpoint is one address of a target, with what its load assignment
// needs.
type Endpoint struct {
	IP       string
	Port     uint32
	Locality Locality
	Draining bool
	Weight   uint32 // at least 1
}

// Targets are the targets of one service's endpoints (see Target for the
// naming), sorted by name, each with its endpoints sorted by locality,
// then address. An address that appears twice in a target (the same IP
// registered under two protocols with the same port) is sent once:
// serving if either is, with the larger weight. Endpoints of other
// services and nil entries are ignored.
func Targets(service string, eps []*registryv1.ServiceEndpoint) []Target {
	ports := map[string]bool{}
	for _, ep := range eps {
		if ep == nil || ep.GetService() != service {
			continue
		}
		for _, p := range ep.GetPorts() {
			ports[p.GetName()] = true
		}
	}
	names := make([]string, 0, len(ports))
	for p := range ports {
		names = append(names, p)
	}
	slices.Sort(names)
	out := make([]Target, 0, len(names))
	for _, port := range names {
		t := Target{Name: service, Service: service, Port: port}
		if len(names) > 1 {
			t.Name = service + ":" + port
		}
		byAddr := map[string]int{}
		for _, ep := range eps {
			if ep == nil || ep.GetService() != service {
				continue
			}
			for _, p := range ep.GetPorts() {
				if p.GetName() != port {
					continue
				}
				e := Endpoint{
					IP: ep.GetIp(), Port: p.GetPort(),
					Locality: Locality{Region: ep.GetRegion(), Zone: ep.GetZone()},
					Draining: ep.GetState() != registryv1.State_STATE_SERVING,
					Weight:   max(ep.GetWeight(), 1),
				}
				key := fmt.Sprintf("%s|%d", e.IP, e.Port)
				if i, dup := byAddr[key]; dup {
					prev := &t.Endpoints[i]
					prev.Draining = prev.Draining && e.Draining
					prev.Weight = max(prev.Weight, e.Weight)
					continue
				}
				byAddr[key] = len(t.Endpoints)
				t.Endpoints = append(t.Endpoints, e)
			}
		}
		slices.SortFunc(t.Endpoints, func(a, b Endpoint) int {
			return cmp.Or(
				strings.Compare(a.Locality.Region, b.Locality.Region),
				strings.Compare(a.Locality.Zone, b.Locality.Zone),
				strings.Compare(a.IP, b.IP),
				cmp.Compare(a.Port, b.Port))
		})
		out = append(out, t)
	}
	return out
}

// ads is "fetch it on the ADS stream", the config source of every
// reference between the resources: a client on one ADS stream gets
// everything there.
func ads() *corev3.ConfigSource {
	return &corev3.ConfigSource{
		ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
		ResourceApiVersion:    corev3.ApiVersion_V3,
	}
}

func mustAny(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		// Only a message type unknown to the registry fails, and these
		// are all generated types linked into this binary.
		panic(fmt.Sprintf("xds: marshal %T: %v", m, err))
	}
	return a
}

// Listener is the API listener of a target: what grpc-go's xds resolver
// asks for when it dials xds:///<name>. Its HttpConnectionManager takes
// the routes from RDS over ADS and ends in the router filter, which
// grpc-go requires as the last filter.
func Listener(name string) *listenerv3.Listener {
	hcm := &hcmv3.HttpConnectionManager{
		StatPrefix: name,
		RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{
			ConfigSource:    ads(),
			RouteConfigName: name,
		}},
		HttpFilters: []*hcmv3.HttpFilter{{
			Name:       "envoy.filters.http.router",
			ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&routerv3.Router{})},
		}},
	}
	return &listenerv3.Listener{
		Name:        name,
		ApiListener: &listenerv3.ApiListener{ApiListener: mustAny(hcm)},
	}
}

// RouteConfig routes every request for a target to its cluster. The
// virtual host matches any authority: grpc-go matches it against the
// dialled target, which is the listener's name already.
func RouteConfig(name string) *routev3.RouteConfiguration {
	return &routev3.RouteConfiguration{
		Name: name,
		VirtualHosts: []*routev3.VirtualHost{{
			Name:    name,
			Domains: []string{"*"},
			Routes: []*routev3.Route{{
				Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: ""}},
				Action: &routev3.Route_Route{Route: &routev3.RouteAction{
					ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: name},
				}},
			}},
		}},
	}
}

// Cluster is a target's cluster: its endpoints from EDS over ADS,
// ROUND_ROBIN, which grpc-go runs as a weighted pick among the localities
// of a priority and round robin within one; LoadAssignment gives each
// endpoint a locality of its own so that the pick is by endpoint weight.
func Cluster(name string) *clusterv3.Cluster {
	return &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{
			EdsConfig:   ads(),
			ServiceName: name,
		},
		LbPolicy: clusterv3.Cluster_ROUND_ROBIN,
	}
}

// LoadAssignment is a target's endpoints for a consumer at consumer: one
// locality per endpoint, its sub-zone the endpoint's address, under the
// endpoint's own region and zone.
//
// Weights: why one locality per endpoint. A Cluster's ROUND_ROBIN is, in
// grpc-go's xDS client (A52), xds_wrr_locality: a weighted_target over
// the localities of a priority, picking a locality at random in
// proportion to its load_balancing_weight, then round_robin over that
// locality's endpoints, and round_robin ignores endpoint weights (parsed,
// never used). So an endpoint weight counts only as the weight of a
// locality holding that endpoint alone: its locality carries weight =
// the endpoint's weight, and grpc-go splits traffic between the endpoints
// of a priority in proportion to their weights (internal/testutil/xdstest
// TestWeights proves it; the e2e TestXDSWeights through a registrar).
// Region and zone stay the endpoint's, so the priorities below are those
// of its zone; sub_zone is IP:port, unique within a target (Targets sends
// each address once), as grpc-go refuses two localities of one priority
// with the same ID ("duplicate locality"). Every endpoint also carries
// its weight as its own load_balancing_weight: Envoy's default (no
// locality_weighted_lb_config) ignores locality weights and weighs hosts
// by it, and grpc-go's RING_HASH and weighted policies read it. The
// alternatives were worse: RING_HASH weighs endpoints too, but with no
// hash policy it is a random pick on a ring of finite resolution that
// connects to an endpoint only when a pick first lands on it, and WRR
// (client_side_weighted_round_robin) weighs by the load reports (ORCA)
// backends would have to send, not by the registry's weight.
// Every locality has a weight of at least 1, since grpc-go drops one
// without ("Ignoring locality with weight 0") and Validate refuses 0; a
// weight of 0 in the registry is sent as 1 (Targets).
//
// Priorities: each endpoint's tier is registry.Priority of its zone for
// the consumer (same zone, same region, other region: 0, 1, 2; a
// consumer with no zone has its whole region as tier 0). The tiers that
// hold at least one SERVING endpoint are then numbered 0, 1, ... in that
// order, because grpc-go refuses priorities with gaps ("priority N
// missing"): with no endpoint in the consumer's zone, its region is
// priority 0. A DRAINING endpoint keeps its zone's priority while the
// zone has a SERVING endpoint; the endpoints of zones that are all
// DRAINING take the priority after the last serving one, whatever their
// tier: they are sent so that a client sees them draining, but a
// priority that can take no request must not stand before one that can
// (grpc-go would fail over past it only once it had seen it fail).
//
// Health: SERVING is HEALTHY, DRAINING is DRAINING, which grpc-go and
// Envoy send no new requests to (grpc-go drops it from the locality, so a
// draining endpoint's locality is left empty and weighted_target has no
// child for it: its weight takes no share of the traffic).
func LoadAssignment(t Target, consumer Locality) *endpointv3.ClusterLoadAssignment {
	type zone struct {
		tier    int
		serving bool
	}
	zones := map[Locality]*zone{}
	for _, e := range t.Endpoints {
		z := zones[e.Locality]
		if z == nil {
			probe := &registryv1.ServiceEndpoint{Region: e.Locality.Region, Zone: e.Locality.Zone}
			z = &zone{tier: registry.Priority(probe, consumer.Region, consumer.Zone)}
			zones[e.Locality] = z
		}
		z.serving = z.serving || !e.Draining
	}
	// Number the serving tiers densely; all-draining zones go last.
	rank := map[int]uint32{}
	for _, z := range zones {
		if z.serving {
			rank[z.tier] = 0
		}
	}
	tiers := make([]int, 0, len(rank))
	for tier := range rank {
		tiers = append(tiers, tier)
	}
	slices.Sort(tiers)
	for i, tier := range tiers {
		rank[tier] = uint32(i)
	}
	prioOf := func(e Endpoint) uint32 {
		if z := zones[e.Locality]; z.serving {
			return rank[z.tier]
		}
		return uint32(len(tiers))
	}
	// grpc-go refuses an assignment whose locality weights sum to more
	// than 2^32-1 within a priority; that takes tens of thousands of
	// endpoints at the largest weight, and is then scaled down (ratios
	// kept, each at least 1) rather than refused by every client. An
	// endpoint's own weight is alone in its locality, so it always fits.
	sums := map[uint32]uint64{}
	for _, e := range t.Endpoints {
		sums[prioOf(e)] += uint64(e.Weight)
	}
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: t.Name}
	for _, e := range t.Endpoints { // sorted by region, zone, address
		health := corev3.HealthStatus_HEALTHY
		if e.Draining {
			health = corev3.HealthStatus_DRAINING
		}
		prio := prioOf(e)
		cla.Endpoints = append(cla.Endpoints, &endpointv3.LocalityLbEndpoints{
			Locality: &corev3.Locality{
				Region: e.Locality.Region, Zone: e.Locality.Zone,
				SubZone: net.JoinHostPort(e.IP, strconv.FormatUint(uint64(e.Port), 10)),
			},
			LbEndpoints: []*endpointv3.LbEndpoint{{
				HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
					Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
						Address:       e.IP,
						PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: e.Port},
					}}},
				}},
				HealthStatus:        health,
				LoadBalancingWeight: wrapperspb.UInt32(e.Weight),
			}},
			LoadBalancingWeight: wrapperspb.UInt32(scale(uint64(e.Weight), sums[prio])),
			Priority:            prio,
		})
	}
	slices.SortStableFunc(cla.Endpoints, func(a, b *endpointv3.LocalityLbEndpoints) int {
		return cmp.Compare(a.Priority, b.Priority)
	})
	return cla
}

// scale is w out of a total that may exceed what grpc-go accepts, as a
// weight whose sum with the others' fits 2^32-1: w itself when it fits,
// else w shrunk by the factor the total exceeds it by (at least 1, so
// the sum may overshoot by at most one per weight, far below the slack
// the integer division leaves).
func scale(w, total uint64) uint32 {
	if total <= math.MaxUint32 {
		return uint32(w)
	}
	factor := total/math.MaxUint32 + 1
	return uint32(max(w/factor, 1))
}

// Resources are the xDS resources of a set of services for one consumer
// locality, each list in order of service, then port name.
type Resources struct {
	Listeners []*listenerv3.Listener
	Routes    []*routev3.RouteConfiguration
	Clusters  []*clusterv3.Cluster
	Endpoints []*endpointv3.ClusterLoadAssignment
}

// Translate builds the resources of every service in services (service
// name → its endpoints) for a consumer at consumer: per target (see
// Target) a Listener, a RouteConfiguration, a Cluster and a
// ClusterLoadAssignment of the same name. A service with no endpoints has
// no target and so no resources: a client dialling it learns that the
// resource does not exist and fails its RPCs as UNAVAILABLE.
func Translate(services map[string][]*registryv1.ServiceEndpoint, consumer Locality) Resources {
	names := make([]string, 0, len(services))
	for s := range services {
		names = append(names, s)
	}
	slices.Sort(names)
	var r Resources
	for _, s := range names {
		for _, t := range Targets(s, services[s]) {
			r.Listeners = append(r.Listeners, Listener(t.Name))
			r.Routes = append(r.Routes, RouteConfig(t.Name))
			r.Clusters = append(r.Clusters, Cluster(t.Name))
			r.Endpoints = append(r.Endpoints, LoadAssignment(t, consumer))
		}
	}
	return r
}
