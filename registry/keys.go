package registry

import (
	"fmt"
	"strings"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
)

// Root is the prefix of every v1 key. The registrar watches all of it: its
// own region's keys plus whatever the replicator mirrors in from peers.
const Root = "/aether/v1/regions/"

// EndpointID is an endpoint's identity, and so its key. It is comparable and
// serves as a map key.
type EndpointID struct {
	Region   string
	Cluster  string
	Service  string
	Protocol registryv1.Protocol
	IP       string // canonical form
}

// IDOf returns the identity of an endpoint without validating it.
func IDOf(ep *registryv1.ServiceEndpoint) EndpointID {
	return EndpointID{
		Region:   ep.GetRegion(),
		Cluster:  ep.GetCluster(),
		Service:  ep.GetService(),
		Protocol: ep.GetProtocol(),
		IP:       ep.GetIp(),
	}
}

// Validate checks every part of the identity that goes into the key.
func (id EndpointID) Validate() error {
	if err := ValidateName("region", id.Region); err != nil {
		return err
	}
	if err := ValidateName("cluster", id.Cluster); err != nil {
		return err
	}
	if err := ValidateName("service", id.Service); err != nil {
		return err
	}
	if _, err := ProtocolSegment(id.Protocol); err != nil {
		return err
	}
	c, err := CanonicalIP(id.IP)
	if err != nil {
		return err
	}
	if c != id.IP {
		return fmt.Errorf("ip %q is not in canonical form %q", id.IP, c)
	}
	return nil
}

// Key builds the v1 key. It fails, rather than building a key, for an
// identity that does not validate.
func (id EndpointID) Key() (string, error) {
	if err := id.Validate(); err != nil {
		return "", err
	}
	proto, _ := ProtocolSegment(id.Protocol)
	return ServicePrefix(id.Region, id.Cluster, id.Service) + "protocols/" + proto + "/endpoints/" + id.IP, nil
}

// String is the key for a valid identity and a readable form otherwise; for
// logs and error messages.
func (id EndpointID) String() string {
	if k, err := id.Key(); err == nil {
		return k
	}
	return fmt.Sprintf("%s/%s/%s/%s/%s", id.Region, id.Cluster, id.Service, ProtocolName(id.Protocol), id.IP)
}

// RegionPrefix is the subtree a region owns. Names must be valid.
func RegionPrefix(region string) string { return Root + region + "/" }

// ClusterPrefix is the slice of its region's subtree a cluster owns.
func ClusterPrefix(region, cluster string) string {
	return RegionPrefix(region) + "clusters/" + cluster + "/"
}

// ServicesPrefix holds every service endpoint of a cluster.
func ServicesPrefix(region, cluster string) string {
	return ClusterPrefix(region, cluster) + "services/"
}

// ServicePrefix holds one service's endpoints in one cluster.
func ServicePrefix(region, cluster, service string) string {
	return ServicesPrefix(region, cluster) + service + "/"
}

// IsEndpointKey reports cheaply whether key has the shape of an endpoint key,
// so watchers can skip other records (node records, later) without an error.
func IsEndpointKey(key string) bool {
	return strings.HasPrefix(key, Root) && strings.Contains(key, "/services/") && strings.Contains(key, "/endpoints/")
}

// ParseEndpointKey inverts EndpointID.Key. It accepts only keys that Key
// would build.
func ParseEndpointKey(key string) (EndpointID, error) {
	rest, ok := strings.CutPrefix(key, Root)
	if !ok {
		return EndpointID{}, fmt.Errorf("key %q is not under %s", key, Root)
	}
	parts := strings.Split(rest, "/")
	// <region> clusters <cluster> services <service> protocols <proto> endpoints <ip>
	if len(parts) != 9 || parts[1] != "clusters" || parts[3] != "services" || parts[5] != "protocols" || parts[7] != "endpoints" {
		return EndpointID{}, fmt.Errorf("key %q is not an endpoint key of schema v1", key)
	}
	proto, ok := protocolFromSegment(parts[6])
	if !ok {
		return EndpointID{}, fmt.Errorf("key %q has unknown protocol segment %q", key, parts[6])
	}
	id := EndpointID{Region: parts[0], Cluster: parts[2], Service: parts[4], Protocol: proto, IP: parts[8]}
	if err := id.Validate(); err != nil {
		return EndpointID{}, fmt.Errorf("key %q: %w", key, err)
	}
	return id, nil
}
