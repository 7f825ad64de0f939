package registry

import (
	"net/netip"
	"slices"
	"strings"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
)

// Locality priorities: the order in which a consumer should use a service's
// endpoints, nearest first. Lower is preferred. A consumer sends all
// traffic to the lowest priority that has healthy endpoints and moves to the
// next only when that tier cannot carry it.
//
// These are tiers, not necessarily contiguous levels: when a consumer has no
// endpoint in its own zone, its best tier is PriorityLocalRegion. The xDS feed
// will turn them into EDS priorities (LocalityLbEndpoints.priority); Envoy
// expects levels 0..N without gaps, so the feed renumbers the tiers that are
// present (e.g. tiers {1, 2} become levels {0, 1}).
const (
	// Same region and same zone as the consumer.
	PriorityLocalZone = 0
	// Same region, another zone, or a zone that is unknown on either side
	// (see Priority for a consumer with no zone).
	PriorityLocalRegion = 1
	// Another region: failover only.
	PriorityFailover = 2
)

// Prioritized is one endpoint of the serving set with its locality priority
// for a given consumer.
type Prioritized struct {
	// Endpoint is the caller's endpoint, shared rather than copied; do not
	// modify it.
	Endpoint *registryv1.ServiceEndpoint
	Priority int
}

// Priority is the locality priority of ep for a consumer in region and zone.
// Names are compared exactly (they are validated names, see ValidateName).
//
//   - An endpoint in another region is PriorityFailover, whatever its zone:
//     zone names are only meaningful within a region, so "zone-1" in two
//     regions are two different places.
//   - An endpoint in the consumer's region is PriorityLocalZone when its zone
//     is the consumer's zone, and PriorityLocalRegion when it is in another
//     zone or has no zone (an endpoint of unknown zone is not assumed local).
//   - A consumer with no zone (zone == "") knows only its region, so it cannot
//     prefer one zone of it over another: every endpoint in its region is
//     PriorityLocalZone, i.e. the region is its nearest tier. This is what a
//     consumer that was never told its zone expects: its own region first,
//     other regions only as failover.
//   - A consumer with no region (region == "") has no locality: every
//     endpoint is PriorityFailover. An endpoint with no region is never
//     local either. (The registrar rejects endpoints without a region.)
//
// Priority does not look at the endpoint's state; ByLocality does.
func Priority(ep *registryv1.ServiceEndpoint, region, zone string) int {
	epRegion := ep.GetRegion()
	if region == "" || epRegion == "" || epRegion != region {
		return PriorityFailover
	}
	if zone == "" {
		return PriorityLocalZone
	}
	if ep.GetZone() == zone {
		return PriorityLocalZone
	}
	return PriorityLocalRegion
}

// ByLocality orders a service's endpoints for a consumer in region and zone:
// the serving set, nearest tier first (see Priority).
//
// Only endpoints whose state is STATE_SERVING are returned. DRAINING
// endpoints must not get new requests, and anything else (UNSPECIFIED, a
// state this build does not know) is left out as well, so that traffic only
// goes where an endpoint said it is accepted. Stored endpoints are normalized,
// so their state is never UNSPECIFIED. Nil entries are skipped.
//
// Within a priority the order is deterministic: service, protocol (by its
// short name, as "aether list" sorts), IP (numerically), then region and
// cluster, which completes the endpoint identity. Endpoints with the same
// identity keep their input order. The input slice and its endpoints are not
// modified.
//
// The xDS feed will use this to build EDS priorities; see the Priority*
// constants for how tiers map to EDS levels.
func ByLocality(eps []*registryv1.ServiceEndpoint, region, zone string) []Prioritized {
	out := make([]Prioritized, 0, len(eps))
	for _, ep := range eps {
		if ep == nil || ep.GetState() != registryv1.State_STATE_SERVING {
			continue
		}
		out = append(out, Prioritized{Endpoint: ep, Priority: Priority(ep, region, zone)})
	}
	slices.SortStableFunc(out, func(a, b Prioritized) int {
		if a.Priority != b.Priority {
			return a.Priority - b.Priority
		}
		return compareIdentity(a.Endpoint, b.Endpoint)
	})
	return out
}

// compareIdentity orders endpoints by service, protocol name, IP, region and
// cluster.
func compareIdentity(a, b *registryv1.ServiceEndpoint) int {
	if c := strings.Compare(a.GetService(), b.GetService()); c != 0 {
		return c
	}
	if c := strings.Compare(ProtocolName(a.GetProtocol()), ProtocolName(b.GetProtocol())); c != 0 {
		return c
	}
	if c := compareIPText(a.GetIp(), b.GetIp()); c != 0 {
		return c
	}
	if c := strings.Compare(a.GetRegion(), b.GetRegion()); c != 0 {
		return c
	}
	return strings.Compare(a.GetCluster(), b.GetCluster())
}

// compareIPText orders addresses numerically (IPv4 before IPv6); text that is
// not an address sorts after all addresses, by its text.
func compareIPText(a, b string) int {
	pa, errA := netip.ParseAddr(a)
	pb, errB := netip.ParseAddr(b)
	switch {
	case errA == nil && errB == nil:
		return pa.Compare(pb)
	case errA == nil:
		return -1
	case errB == nil:
		return 1
	}
	return strings.Compare(a, b)
}
