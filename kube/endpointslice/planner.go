// Package endpointslice maintains discovery.k8s.io/v1 EndpointSlices for
// the services a registrar owns, so that Kubernetes-native consumers
// (kube-proxy, CoreDNS, Cilium, Istio) see Aether's endpoints without
// knowing Aether.
//
// It has two halves. The planner (this file, Config.Plan) is pure: from
// one service's endpoints and the slices that already exist for it, it
// computes the creates, updates and deletes that make the slices match,
// following the rules of Kubernetes' own EndpointSlice controller
// (k8s.io/endpointslice, reconciler.go): at most MaxEndpointsPerSlice
// endpoints per slice, slices grouped by address type and port set,
// endpoints kept in the slice they already are in, changed slices filled
// before untouched ones, creates turned into updates of slices about to be
// deleted. The reconciler (reconciler.go) is the shell around it: it
// follows the registrar's in-process subscription, lists the slices it
// manages and writes the plan with resourceVersion preconditions; with an
// Election (election.go) only the replica holding the origin's Lease
// writes. Each Aether service is published as the Kubernetes Service of
// the same name, or of its ReconcilerConfig.ServiceNames entry; the
// Services themselves (selector-less, with matching port names) are the
// operator's: the registrar reads and writes no Service.
//
// Where it departs from the controller, and why:
//   - Deterministic order. The controller pops endpoints from a map; the
//     planner takes them in address order and visits slices by name, so
//     two registrar replicas planning from the same state write the same
//     slices instead of fighting.
//   - Deterministic names (<service>-<origin hash>-<n>) instead of
//     generateName: a create that timed out and is retried, or the same
//     create by a second replica, meets AlreadyExists instead of making a
//     duplicate slice.
//   - No placeholder slice: a service whose last endpoint goes has no
//     slices left (the controller keeps an empty one while its Service
//     exists; the registrar does not know the Service).
//   - Overfull slices are trimmed: a slice holding more endpoints than
//     MaxEndpointsPerSlice (the limit was lowered) gives the excess back to
//     be placed elsewhere; the controller leaves such a slice alone.
//   - Zone hints follow the controller's PreferClose heuristic
//     (trafficdist.go): every ready endpoint with a zone is hinted for its
//     own zone; there is no Service to read trafficDistribution from, so
//     Config.ZoneHints switches them for all services.
//   - Weight has no field in EndpointSlice v1 and is not published.
package endpointslice

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
)

// Labels and defaults.
const (
	// ManagedBy is the endpointslice.kubernetes.io/managed-by value of the
	// slices the registrar writes; Kubernetes' own controller uses
	// endpointslice-controller.k8s.io and leaves slices with any other
	// value alone, as this package does with theirs.
	ManagedBy = "endpointslice.aether.dev"
	// LabelRegion and LabelCluster name the origin whose endpoints a slice
	// holds: two Aether clusters may publish the same service into one
	// namespace (consumers merge every slice of a service), and each
	// manages only its own slices.
	LabelRegion  = "endpointslice.aether.dev/region"
	LabelCluster = "endpointslice.aether.dev/cluster"
	// DefaultMaxEndpointsPerSlice is the controller's default
	// (--max-endpoints-per-slice).
	DefaultMaxEndpointsPerSlice = 100
	// MaxMaxEndpointsPerSlice is the API server's limit (validation.go,
	// maxEndpoints).
	MaxMaxEndpointsPerSlice = 1000
)

// Config is what the planner plans for: where the slices go, whose
// endpoints they hold, and how they are packed.
type Config struct {
	Namespace string
	// Region and Cluster are the origin whose endpoints the slices hold.
	Region, Cluster string
	// MaxEndpointsPerSlice bounds a slice; 0 means
	// DefaultMaxEndpointsPerSlice.
	MaxEndpointsPerSlice int
	// ZoneHints hints every ready endpoint with a zone for that zone (see
	// the package comment).
	ZoneHints bool
}

// Plan is what makes one service's slices match its endpoints: creates
// (named, without resourceVersion), updates and deletes (each carrying
// the resourceVersion it was planned from, for a precondition), in the
// order the reconciler writes them. Skipped are the endpoints that could
// not be published, each with its reason.
type Plan struct {
	Create, Update, Delete []*discoveryv1.EndpointSlice
	Skipped                []Skip
}

// Empty reports whether the plan writes nothing.
func (p Plan) Empty() bool { return len(p.Create)+len(p.Update)+len(p.Delete) == 0 }

// Skip is an endpoint (or a part of one) left out of the slices.
type Skip struct {
	IP       string
	Protocol registryv1.Protocol
	Reason   Reason
	Detail   string
}

// Reason is why an endpoint or service is not published; the values are
// metric labels.
type Reason string

const (
	// ReasonAddress: not an IP address the API server accepts in a slice
	// (unparsable, unspecified, loopback, link-local).
	ReasonAddress Reason = "address"
	// ReasonPortName: a port whose name is not a DNS-1123 label, which
	// the API server refuses (and no Service port could match); the
	// endpoint is published without it.
	ReasonPortName Reason = "port_name"
	// ReasonNoPorts: every port of the endpoint was left out.
	ReasonNoPorts Reason = "no_valid_ports"
	// ReasonDuplicate: another endpoint of the service has the same
	// address and port set (the same IP under two protocols that map to
	// the same appProtocol); one of them is published.
	ReasonDuplicate Reason = "duplicate_address"
	// ReasonServiceName: the service name is not a Kubernetes Service name
	// (a DNS-1035 label); the whole service is skipped.
	ReasonServiceName Reason = "service_name"
)

// ServiceName checks that an Aether service name can be a Kubernetes
// Service name (a DNS-1035 label: lowercase letters, digits and '-',
// starting with a letter, at most 63 characters), which is what the
// kubernetes.io/service-name label of a slice must name.
func ServiceName(svc string) error {
	if errs := validation.IsDNS1035Label(svc); len(errs) > 0 {
		return fmt.Errorf("service %q is not a Kubernetes Service name: %s", svc, strings.Join(errs, "; "))
	}
	return nil
}

func (c Config) max() int {
	if c.MaxEndpointsPerSlice <= 0 {
		return DefaultMaxEndpointsPerSlice
	}
	return c.MaxEndpointsPerSlice
}

// Labels are the labels that select the slices of svc managed for this
// origin (and that every such slice carries).
func (c Config) Labels(svc string) map[string]string {
	l := c.OriginLabels()
	l[discoveryv1.LabelServiceName] = svc
	return l
}

// OriginLabels select every slice managed for this origin.
func (c Config) OriginLabels() map[string]string {
	return map[string]string{
		discoveryv1.LabelManagedBy: ManagedBy,
		LabelRegion:                labelValue(c.Region),
		LabelCluster:               labelValue(c.Cluster),
	}
}

// labelValue is name as a label value: as it is when it is one (Aether
// names are [A-Za-z0-9._-], starting and ending with a letter or digit, as
// label values are), else, when longer than 63 characters, a prefix and a
// hash of the whole.
func labelValue(name string) string {
	if len(validation.IsValidLabelValue(name)) == 0 {
		return name
	}
	h := fnv.New64a()
	h.Write([]byte(name))
	sum := strconv.FormatUint(h.Sum64(), 16)
	prefix := strings.TrimRight(name[:min(len(name), 63-len(sum)-1)], "._-")
	return prefix + "-" + sum
}

// namePrefix is the prefix of the slices created for svc: the service,
// then a hash of the origin, so two origins' slices of one service do not
// collide in a namespace.
func (c Config) namePrefix(svc string) string {
	h := fnv.New32a()
	h.Write([]byte(c.Region + "/" + c.Cluster))
	return fmt.Sprintf("%s-%08x-", svc, h.Sum32())
}

// Plan computes what makes svc's slices match eps. eps are the service's
// endpoints of the configured origin; existing are the slices that carry
// this origin's Labels(svc) (any other is ignored, never changed). The
// inputs are not modified.
func (c Config) Plan(svc string, eps []*registryv1.ServiceEndpoint, existing []*discoveryv1.EndpointSlice) Plan {
	var plan Plan
	want := c.Labels(svc)
	var mine []*discoveryv1.EndpointSlice
	for _, s := range existing {
		if s.Labels[discoveryv1.LabelManagedBy] == ManagedBy && s.Labels[discoveryv1.LabelServiceName] == svc &&
			s.Labels[LabelRegion] == want[LabelRegion] && s.Labels[LabelCluster] == want[LabelCluster] {
			mine = append(mine, s)
		}
	}
	slices.SortFunc(mine, func(a, b *discoveryv1.EndpointSlice) int { return cmp.Compare(a.Name, b.Name) })

	groups, skipped := c.desired(eps)
	plan.Skipped = skipped

	byType := map[discoveryv1.AddressType][]*discoveryv1.EndpointSlice{}
	types := map[discoveryv1.AddressType]bool{}
	for _, s := range mine {
		byType[s.AddressType] = append(byType[s.AddressType], s)
		types[s.AddressType] = true
	}
	for k := range groups {
		types[k.addressType] = true
	}
	names := newNamer(c.namePrefix(svc), mine)
	for _, at := range sortedKeys(types) {
		create, update, del := c.planAddressType(svc, at, groups, byType[at], names)
		plan.Create = append(plan.Create, create...)
		plan.Update = append(plan.Update, update...)
		plan.Delete = append(plan.Delete, del...)
	}
	return plan
}

// group is the key of a set of endpoints that share a slice: the
// controller's endpointMeta (address type and port set).
type group struct {
	addressType discoveryv1.AddressType
	ports       string // portsKey
}

// endpointSet is the desired endpoints of a group, by address, and their
// ports.
type endpointSet struct {
	ports []discoveryv1.EndpointPort
	eps   map[string]*discoveryv1.Endpoint
}

// popN takes up to n endpoints in address order: deterministic, where
// the controller's PopAny is not.
func (s *endpointSet) popN(n int) []discoveryv1.Endpoint {
	ks := keys(s.eps)
	slices.Sort(ks)
	if len(ks) > n {
		ks = ks[:n]
	}
	out := make([]discoveryv1.Endpoint, 0, len(ks))
	for _, k := range ks {
		out = append(out, *s.eps[k])
		delete(s.eps, k)
	}
	return out
}

// desired converts the registry's endpoints into the slices' endpoints,
// grouped as the controller groups them.
func (c Config) desired(eps []*registryv1.ServiceEndpoint) (map[group]*endpointSet, []Skip) {
	var skipped []Skip
	// A stable order, so that which of two duplicates is published does
	// not depend on the caller's.
	eps = slices.Clone(eps)
	slices.SortFunc(eps, func(a, b *registryv1.ServiceEndpoint) int {
		return cmp.Or(cmp.Compare(a.GetIp(), b.GetIp()), cmp.Compare(a.GetProtocol(), b.GetProtocol()))
	})
	groups := map[group]*endpointSet{}
	for _, ep := range eps {
		skip := func(r Reason, detail string) {
			skipped = append(skipped, Skip{IP: ep.GetIp(), Protocol: ep.GetProtocol(), Reason: r, Detail: detail})
		}
		addr, at, err := address(ep.GetIp())
		if err != nil {
			skip(ReasonAddress, err.Error())
			continue
		}
		ports, bad := endpointPorts(ep)
		for _, name := range bad {
			skip(ReasonPortName, fmt.Sprintf("port %q is not a DNS-1123 label", name))
		}
		if len(ports) == 0 && len(ep.GetPorts()) > 0 {
			skip(ReasonNoPorts, "no port left to publish")
			continue
		}
		g := group{addressType: at, ports: portsKey(ports)}
		set := groups[g]
		if set == nil {
			set = &endpointSet{ports: ports, eps: map[string]*discoveryv1.Endpoint{}}
			groups[g] = set
		}
		e := c.endpoint(ep, addr)
		if old, dup := set.eps[addr]; dup {
			// Keep a ready one over one that is draining.
			if !*old.Conditions.Ready && *e.Conditions.Ready {
				set.eps[addr] = e
			}
			skip(ReasonDuplicate, "another endpoint has the same address and ports")
			continue
		}
		set.eps[addr] = e
	}
	return groups, skipped
}

// address is ip in the form the API server stores and its address type,
// or why a slice cannot hold it (the API server's ValidateEndpointIP).
func address(ip string) (string, discoveryv1.AddressType, error) {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return "", "", fmt.Errorf("%q is not an IP address", ip)
	}
	a = a.Unmap().WithZone("")
	switch {
	case a.IsUnspecified():
		return "", "", fmt.Errorf("%s is unspecified", a)
	case a.IsLoopback():
		return "", "", fmt.Errorf("%s is a loopback address", a)
	case a.IsLinkLocalUnicast(), a.IsLinkLocalMulticast():
		return "", "", fmt.Errorf("%s is a link-local address", a)
	}
	if a.Is4() {
		return a.String(), discoveryv1.AddressTypeIPv4, nil
	}
	return a.String(), discoveryv1.AddressTypeIPv6, nil
}

// appProtocols are the appProtocol values of Aether's protocols: the IANA
// service names (and Istio's http2) that meshes read; plain TCP sets none,
// Kubernetes' own assumption.
var appProtocols = map[registryv1.Protocol]string{
	registryv1.Protocol_PROTOCOL_HTTP1: "http",
	registryv1.Protocol_PROTOCOL_HTTP2: "http2",
	registryv1.Protocol_PROTOCOL_GRPC:  "grpc",
}

// endpointPorts are ep's ports as slice ports, in name order, and the
// names of those left out.
func endpointPorts(ep *registryv1.ServiceEndpoint) ([]discoveryv1.EndpointPort, []string) {
	ports := []discoveryv1.EndpointPort{}
	var bad []string
	for _, p := range ep.GetPorts() {
		if p.GetName() != "" && len(validation.IsDNS1123Label(p.GetName())) > 0 {
			bad = append(bad, p.GetName())
			continue
		}
		port := discoveryv1.EndpointPort{
			Name:     ptr(p.GetName()),
			Port:     ptr(int32(p.GetPort())),
			Protocol: ptr(corev1.ProtocolTCP),
		}
		if ap, ok := appProtocols[ep.GetProtocol()]; ok {
			port.AppProtocol = ptr(ap)
		}
		ports = append(ports, port)
	}
	slices.SortFunc(ports, func(a, b discoveryv1.EndpointPort) int { return cmp.Compare(*a.Name, *b.Name) })
	return ports, bad
}

// portsKey identifies a port set: the controller's PortMapKey.
func portsKey(ports []discoveryv1.EndpointPort) string {
	var b strings.Builder
	ps := slices.Clone(ports)
	slices.SortFunc(ps, func(a, b discoveryv1.EndpointPort) int { return cmp.Compare(deref(a.Name), deref(b.Name)) })
	for _, p := range ps {
		fmt.Fprintf(&b, "%s/%d/%s/%s;", deref(p.Name), deref(p.Port), deref(p.Protocol), deref(p.AppProtocol))
	}
	return b.String()
}

// endpoint is ep as a slice endpoint: the conditions follow its state
// (SERVING: ready, serving; DRAINING: serving and terminating, not ready,
// as the controller marks a terminating pod that still passes its
// readiness probe), its zone, its node when that is a name a Kubernetes
// node could have, and its zone hint.
func (c Config) endpoint(ep *registryv1.ServiceEndpoint, addr string) *discoveryv1.Endpoint {
	draining := ep.GetState() == registryv1.State_STATE_DRAINING
	e := &discoveryv1.Endpoint{
		Addresses: []string{addr},
		Conditions: discoveryv1.EndpointConditions{
			Ready:       ptr(!draining),
			Serving:     ptr(true),
			Terminating: ptr(draining),
		},
	}
	if n := ep.GetNode(); n != "" && len(validation.IsDNS1123Subdomain(n)) == 0 {
		e.NodeName = ptr(n)
	}
	if z := ep.GetZone(); z != "" {
		e.Zone = ptr(z)
		// A hint names a zone as a label value (validateHints).
		if c.ZoneHints && !draining && len(validation.IsValidLabelValue(z)) == 0 {
			e.Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: z}}}
		}
	}
	return e
}

// planAddressType is the controller's reconcileByAddressType and
// finalize for one address type: the existing slices of that type, the
// desired groups of it.
func (c Config) planAddressType(svc string, at discoveryv1.AddressType, groups map[group]*endpointSet, existing []*discoveryv1.EndpointSlice, names *namer) (create, update, del []*discoveryv1.EndpointSlice) {
	byPorts := map[string][]*discoveryv1.EndpointSlice{}
	for _, s := range existing {
		k := portsKey(s.Ports)
		byPorts[k] = append(byPorts[k], s)
	}
	var keysOfType []string
	for g := range groups {
		if g.addressType == at {
			keysOfType = append(keysOfType, g.ports)
		}
	}
	slices.Sort(keysOfType)
	for _, k := range keysOfType {
		cr, up, de := c.planPorts(svc, at, groups[group{at, k}], byPorts[k], names)
		create, update, del = append(create, cr...), append(update, up...), append(del, de...)
	}
	for _, k := range sortedKeys(byPorts) {
		if _, ok := groups[group{at, k}]; !ok {
			del = append(del, byPorts[k]...)
		}
	}

	// finalize: a create becomes an update of a slice about to be deleted
	// (the same address type: it is immutable), one write instead of two.
	for len(create) > 0 && len(del) > 0 {
		s, d := create[len(create)-1], del[0]
		create, del = create[:len(create)-1], del[1:]
		s.ObjectMeta = *d.ObjectMeta.DeepCopy()
		s.Labels = c.mergeLabels(svc, d.Labels)
		update = append(update, s)
	}
	slices.SortFunc(update, func(a, b *discoveryv1.EndpointSlice) int { return cmp.Compare(a.Name, b.Name) })
	slices.SortFunc(del, func(a, b *discoveryv1.EndpointSlice) int { return cmp.Compare(a.Name, b.Name) })
	return create, update, del
}

// mergeLabels are a slice's labels with this origin's set: labels someone
// else added are kept.
func (c Config) mergeLabels(svc string, have map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range have {
		out[k] = v
	}
	for k, v := range c.Labels(svc) {
		out[k] = v
	}
	return out
}

// planPorts is the controller's reconcileByPortMapping for one group:
//  1. each existing slice keeps the desired endpoints it holds (updated
//     where they changed) and drops the others; one left empty is
//     deleted;
//  2. the slices changed in 1 are filled up with the endpoints still to
//     place, fullest first;
//  3. what is left goes, when it is less than a slice's worth, into the
//     unchanged slice it fills closest to full, else into new slices.
func (c Config) planPorts(svc string, at discoveryv1.AddressType, want *endpointSet, existing []*discoveryv1.EndpointSlice, names *namer) (create, update, del []*discoveryv1.EndpointSlice) {
	max := c.max()
	changed := map[string]*discoveryv1.EndpointSlice{} // by name
	var unchanged []*discoveryv1.EndpointSlice
	for _, s := range existing {
		var keep []discoveryv1.Endpoint
		differs := false
		for _, e := range s.Endpoints {
			k := endpointKey(e)
			d, ok := want.eps[k]
			if !ok {
				continue // not desired, or already placed in an earlier slice
			}
			if len(keep) == max {
				differs = true // overfull: the rest is placed elsewhere
				break
			}
			keep = append(keep, *d)
			if !apiequality.Semantic.DeepEqual(*d, e) {
				differs = true
			}
			delete(want.eps, k)
		}
		labels := c.mergeLabels(svc, s.Labels)
		switch {
		case len(keep) == 0:
			del = append(del, s)
		case differs || len(keep) != len(s.Endpoints) || !apiequality.Semantic.DeepEqual(labels, s.Labels):
			cp := s.DeepCopy()
			cp.Endpoints, cp.Labels = keep, labels
			changed[cp.Name] = cp
		default:
			unchanged = append(unchanged, s)
		}
	}

	// 2.
	filling := make([]*discoveryv1.EndpointSlice, 0, len(changed))
	for _, s := range changed {
		filling = append(filling, s)
	}
	slices.SortFunc(filling, func(a, b *discoveryv1.EndpointSlice) int {
		return cmp.Or(cmp.Compare(len(b.Endpoints), len(a.Endpoints)), cmp.Compare(a.Name, b.Name))
	})
	for _, s := range filling {
		if len(want.eps) == 0 {
			break
		}
		s.Endpoints = append(s.Endpoints, want.popN(max-len(s.Endpoints))...)
	}

	// 3.
	for len(want.eps) > 0 {
		var fill *discoveryv1.EndpointSlice
		if len(want.eps) < max {
			if i := sliceToFill(unchanged, len(want.eps), max); i >= 0 {
				fill = unchanged[i].DeepCopy()
				unchanged = slices.Delete(unchanged, i, i+1)
				changed[fill.Name] = fill
			}
		}
		if fill == nil {
			fill = &discoveryv1.EndpointSlice{
				ObjectMeta: metav1.ObjectMeta{
					Name:      names.next(),
					Namespace: c.Namespace,
					Labels:    c.Labels(svc),
				},
				AddressType: at,
				Ports:       slices.Clone(want.ports),
			}
			create = append(create, fill)
		}
		fill.Endpoints = append(fill.Endpoints, want.popN(max-len(fill.Endpoints))...)
	}
	for _, s := range changed {
		update = append(update, s)
	}
	return create, update, del
}

// sliceToFill is the controller's getSliceToFill: the slice that n more
// endpoints fill closest to full without going over, -1 for none.
func sliceToFill(ss []*discoveryv1.EndpointSlice, n, max int) int {
	best, bestDiff := -1, max
	for i, s := range ss {
		diff := max - (n + len(s.Endpoints))
		if diff >= 0 && diff < bestDiff {
			best, bestDiff = i, diff
			if diff == 0 {
				break
			}
		}
	}
	return best
}

// endpointKey identifies an endpoint within a group: its addresses (the
// controller hashes them with the hostname and target, which the
// registrar's endpoints do not have).
func endpointKey(e discoveryv1.Endpoint) string {
	a := slices.Clone(e.Addresses)
	slices.Sort(a)
	return strings.Join(a, ",")
}

// namer hands out the names of new slices: the prefix and the least
// number no slice of the service has.
type namer struct {
	prefix string
	used   map[string]bool
	n      int
}

func newNamer(prefix string, existing []*discoveryv1.EndpointSlice) *namer {
	used := map[string]bool{}
	for _, s := range existing {
		used[s.Name] = true
	}
	return &namer{prefix: prefix, used: used}
}

func (n *namer) next() string {
	for ; ; n.n++ {
		name := n.prefix + strconv.Itoa(n.n)
		if !n.used[name] {
			n.used[name] = true
			return name
		}
	}
}

func ptr[T any](v T) *T { return &v }

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

func keys[K cmp.Ordered, V any](m map[K]V) []K {
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

func sortedKeys[K cmp.Ordered, V any](m map[K]V) []K {
	out := keys(m)
	slices.Sort(out)
	return out
}
