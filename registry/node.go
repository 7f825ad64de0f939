package registry

import (
	"fmt"
	"sort"
	"strings"

	"google.golang.org/protobuf/proto"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
)

// NodeID is a node record's identity, and so its key.
type NodeID struct {
	Region  string
	Cluster string
	Name    string
}

// NodeIDOf returns the identity of a node record without validating it.
func NodeIDOf(n *registryv1.Node) NodeID {
	return NodeID{Region: n.GetRegion(), Cluster: n.GetCluster(), Name: n.GetName()}
}

// Validate checks every part of the identity that goes into the key.
func (id NodeID) Validate() error {
	if err := ValidateName("region", id.Region); err != nil {
		return err
	}
	if err := ValidateName("cluster", id.Cluster); err != nil {
		return err
	}
	return ValidateName("node", id.Name)
}

// Key builds the node record's key, next to the cluster's services:
// /aether/v1/regions/<region>/clusters/<cluster>/nodes/<node>.
func (id NodeID) Key() (string, error) {
	if err := id.Validate(); err != nil {
		return "", err
	}
	return NodesPrefix(id.Region, id.Cluster) + id.Name, nil
}

func (id NodeID) String() string {
	if k, err := id.Key(); err == nil {
		return k
	}
	return fmt.Sprintf("%s/%s/nodes/%s", id.Region, id.Cluster, id.Name)
}

// NodesPrefix holds a cluster's node records.
func NodesPrefix(region, cluster string) string { return ClusterPrefix(region, cluster) + "nodes/" }

// IsNodeKey reports cheaply whether key has the shape of a node record key:
// <region>/clusters/<cluster>/nodes/<node> under Root. Counting the
// segments keeps an endpoint of a service named "nodes" (whose key also
// contains "/nodes/") from passing for one.
func IsNodeKey(key string) bool {
	rest, ok := strings.CutPrefix(key, Root)
	return ok && strings.Count(rest, "/") == 4 && strings.Contains(rest, "/nodes/")
}

// ParseNodeKey inverts NodeID.Key.
func ParseNodeKey(key string) (NodeID, error) {
	rest, ok := strings.CutPrefix(key, Root)
	if !ok {
		return NodeID{}, fmt.Errorf("key %q is not under %s", key, Root)
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 5 || parts[1] != "clusters" || parts[3] != "nodes" {
		return NodeID{}, fmt.Errorf("key %q is not a node key of schema v1", key)
	}
	id := NodeID{Region: parts[0], Cluster: parts[2], Name: parts[4]}
	if err := id.Validate(); err != nil {
		return NodeID{}, fmt.Errorf("key %q: %w", key, err)
	}
	return id, nil
}

// EncodeNode serializes a node record for storage.
func EncodeNode(n *registryv1.Node) ([]byte, error) {
	return proto.MarshalOptions{Deterministic: true}.Marshal(n)
}

// DecodeNode parses a stored node record and checks it is the node its key
// names.
func DecodeNode(key string, value []byte) (*registryv1.Node, error) {
	id, err := ParseNodeKey(key)
	if err != nil {
		return nil, err
	}
	n := &registryv1.Node{}
	if err := proto.Unmarshal(value, n); err != nil {
		return nil, fmt.Errorf("value at %q: %w", key, err)
	}
	if got := NodeIDOf(n); got != id {
		return nil, fmt.Errorf("value at %q names a different node (%s)", key, got)
	}
	return n, nil
}

// MaxNodeServices bounds the services one node may announce.
const MaxNodeServices = 256

// NormalizeNode validates a node record from a request and returns the
// canonical copy to store: canonical address, services sorted and
// de-duplicated, health defaulted, no unknown fields (see DiscardUnknown),
// an encoding of at most lim.MaxNodeBytes. Lease fields, announced_at and
// the stamp are cleared; the registrar owns them.
func NormalizeNode(in *registryv1.Node, lim Limits) (*registryv1.Node, error) {
	if in == nil {
		return nil, &FieldError{Field: "node", Reason: "must be set"}
	}
	n := proto.Clone(in).(*registryv1.Node)
	n.LeaseId, n.LeaseTtlSeconds, n.AnnouncedAt, n.Stamp = 0, 0, nil, nil
	DiscardUnknown(n)
	if err := ValidateName("node", n.Name); err != nil {
		return nil, fieldErr("node.name", err)
	}
	if err := ValidateName("region", n.Region); err != nil {
		return nil, fieldErr("node.region", err)
	}
	if err := ValidateName("cluster", n.Cluster); err != nil {
		return nil, fieldErr("node.cluster", err)
	}
	if n.Zone != "" {
		if err := ValidateName("zone", n.Zone); err != nil {
			return nil, fieldErr("node.zone", err)
		}
	}
	if n.Address != "" {
		a, err := CanonicalIP(n.Address)
		if err != nil {
			return nil, fieldErr("node.address", err)
		}
		n.Address = a
	}
	if len(n.Services) > MaxNodeServices {
		return nil, &FieldError{Field: "node.services", Reason: fmt.Sprintf("%d services exceed the limit of %d", len(n.Services), MaxNodeServices)}
	}
	seen := map[string]bool{}
	var svcs []string
	for i, s := range n.Services {
		if err := ValidateName("service", s); err != nil {
			return nil, fieldErr(fmt.Sprintf("node.services[%d]", i), err)
		}
		if !seen[s] {
			seen[s] = true
			svcs = append(svcs, s)
		}
	}
	sort.Strings(svcs)
	n.Services = svcs
	if err := validateMetadata(n.Labels, lim); err != nil {
		fe := err.(*FieldError)
		fe.Field = "node.labels"
		return nil, fe
	}
	if n.Health == nil {
		n.Health = &registryv1.HealthSummary{}
	}
	switch n.Health.Status {
	case registryv1.Health_HEALTH_UNSPECIFIED:
		n.Health.Status = registryv1.Health_HEALTH_HEALTHY
	case registryv1.Health_HEALTH_HEALTHY, registryv1.Health_HEALTH_DEGRADED, registryv1.Health_HEALTH_UNHEALTHY:
	default:
		return nil, &FieldError{Field: "node.health.status", Reason: fmt.Sprintf("unknown health %d", int32(n.Health.Status))}
	}
	if len(n.Health.Message) > lim.MaxMetadataValueLen {
		return nil, &FieldError{Field: "node.health.message", Reason: fmt.Sprintf("%d bytes; the limit is %d", len(n.Health.Message), lim.MaxMetadataValueLen)}
	}
	if size, max := proto.Size(n), lim.nodeBytes(); size > max {
		return nil, &FieldError{Field: "node", Reason: fmt.Sprintf(
			"encodes to %d bytes, more than the limit of %d for one stored node record (it must fit a backend request); carry fewer labels or services", size, max)}
	}
	return n, nil
}
