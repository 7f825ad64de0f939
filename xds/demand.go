package xds

import (
	"strings"
	"sync"

	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"

	"github.com/aethermesh/aether/registry"
)

// Demand is told which services the connected xDS clients ask for, so
// that a server fed from a partial cache (the agent's) can make the cache
// hold them. Want is called when a first stream names a service, Unwant
// when no stream names it any more. Calls are serialized and in order
// (never Want and Unwant of one service out of order), and are made from
// the stream's goroutine: they must not block.
type Demand interface {
	Want(service string)
	Unwant(service string)
}

// demand keeps, per stream, the resource names it asks for by type, and
// counts the streams naming each service.
//
// A name is a target (translate.go): <service> or <service>:<port>, the
// same for the Listener (what grpc-go asks for xds:///<service>), the
// RouteConfiguration, the Cluster and the ClusterLoadAssignment; so its
// service is what comes before the first ':' (a service name cannot hold
// one). An "xds:///" prefix is taken off (a listener_resource_name_template
// of "xds:///%s"). Names that are no service name (the wildcard "*",
// xdstp:// names) name nothing: a wildcard request is answered with what
// the cache holds, and never makes it watch the whole mesh.
type demand struct {
	to Demand

	mu      sync.Mutex
	streams map[int64]map[string]map[string]bool // stream → type URL → names
	count   map[string]int                       // service → streams naming it
}

func newDemand(to Demand) *demand {
	if to == nil {
		return nil
	}
	return &demand{to: to, streams: map[int64]map[string]map[string]bool{}, count: map[string]int{}}
}

// serviceOf is the service a resource name names, or "".
func serviceOf(name string) string {
	name = strings.TrimPrefix(name, "xds:///")
	if strings.Contains(name, "/") {
		return "" // a URL (xdstp://...): no target of ours
	}
	svc, _, _ := strings.Cut(name, ":")
	if registry.ValidateName("service", svc) != nil {
		return ""
	}
	return svc
}

// sotw records a state-of-the-world request: its names are the stream's
// whole set for the type (an ACK repeats them).
func (d *demand) sotw(id int64, req *discoverygrpc.DiscoveryRequest) {
	if d == nil {
		return
	}
	names := map[string]bool{}
	for _, n := range req.GetResourceNames() {
		names[n] = true
	}
	d.update(id, func(byType map[string]map[string]bool) { byType[req.GetTypeUrl()] = names })
}

// delta records a delta request: subscriptions add to the stream's set,
// unsubscriptions take away, and the initial versions of a stream that
// reconnects name what it already holds (and so still wants).
func (d *demand) delta(id int64, req *discoverygrpc.DeltaDiscoveryRequest) {
	if d == nil {
		return
	}
	d.update(id, func(byType map[string]map[string]bool) {
		names := byType[req.GetTypeUrl()]
		if names == nil {
			names = map[string]bool{}
			byType[req.GetTypeUrl()] = names
		}
		for n := range req.GetInitialResourceVersions() {
			names[n] = true
		}
		for _, n := range req.GetResourceNamesSubscribe() {
			names[n] = true
		}
		for _, n := range req.GetResourceNamesUnsubscribe() {
			delete(names, n)
		}
	})
}

// closed forgets a stream: the services only it named are unwanted.
func (d *demand) closed(id int64) {
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	before := d.servicesLocked(id)
	delete(d.streams, id)
	d.moveLocked(before, nil)
}

func (d *demand) update(id int64, change func(map[string]map[string]bool)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	before := d.servicesLocked(id)
	byType := d.streams[id]
	if byType == nil {
		byType = map[string]map[string]bool{}
		d.streams[id] = byType
	}
	change(byType)
	d.moveLocked(before, d.servicesLocked(id))
}

// servicesLocked are the services a stream names, over all its types.
func (d *demand) servicesLocked(id int64) map[string]bool {
	out := map[string]bool{}
	for _, names := range d.streams[id] {
		for n := range names {
			if svc := serviceOf(n); svc != "" {
				out[svc] = true
			}
		}
	}
	return out
}

// moveLocked adjusts the counts from a stream's old set to its new one.
// Want and Unwant are called under d.mu, which keeps them in the order
// the counts moved in, across streams.
func (d *demand) moveLocked(before, after map[string]bool) {
	for svc := range after {
		if before[svc] {
			continue
		}
		d.count[svc]++
		if d.count[svc] == 1 {
			d.to.Want(svc)
		}
	}
	for svc := range before {
		if after[svc] {
			continue
		}
		d.count[svc]--
		if d.count[svc] == 0 {
			delete(d.count, svc)
			d.to.Unwant(svc)
		}
	}
}
