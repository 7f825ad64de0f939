package kubernetes

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/registry"
)

// The API group and version of the backend's custom resources.
const (
	Group   = "aether.dev"
	Version = "v1alpha1"
)

// CRDRevision is the schema revision this code writes (the
// aether.dev/crd-revision annotation of the CRDs in crds/). A cluster whose
// CRDs carry an older revision is refused: the API server prunes fields an
// older schema does not know, so writing through it would lose them.
const CRDRevision = 1

// crdRevisionAnnotation names the schema revision on a CRD.
const crdRevisionAnnotation = "aether.dev/crd-revision"

// The resources of the backend.
var (
	EndpointsResource = schema.GroupVersionResource{Group: Group, Version: Version, Resource: "aetherendpoints"}
	NodesResource     = schema.GroupVersionResource{Group: Group, Version: Version, Resource: "aethernodes"}
	crdResource       = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
)

// crdFiles are the CRDs, as the manifests apply them too.
//
//go:embed crds/*.yaml
var crdFiles embed.FS

// CRDFiles returns the CRD manifests by file name (crds/<name>.yaml), the
// exact bytes the registrar installs: deployment manifests include the same
// files, and a test can compare copies against these.
func CRDFiles() (map[string][]byte, error) {
	out := map[string][]byte{}
	err := fs.WalkDir(crdFiles, "crds", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := crdFiles.ReadFile(path)
		if err != nil {
			return err
		}
		out[path] = b
		return nil
	})
	return out, err
}

// CRDs returns the CustomResourceDefinitions the backend needs, decoded,
// in name order.
func CRDs() ([]*unstructured.Unstructured, error) {
	files, err := CRDFiles()
	if err != nil {
		return nil, fmt.Errorf("reading the embedded CRDs: %w", err)
	}
	var out []*unstructured.Unstructured
	for path, b := range files {
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
		for {
			u := &unstructured.Unstructured{}
			if err := dec.Decode(&u.Object); err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				return nil, fmt.Errorf("decoding %s: %w", path, err)
			}
			if len(u.Object) == 0 {
				continue
			}
			out = append(out, u)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetName() < out[j].GetName() })
	return out, nil
}

// crdPollInterval is how often installCRDs looks for the Established
// condition; the API server sets it within a second of the create.
const crdPollInterval = 100 * time.Millisecond

// installCRDs applies the CRDs (server-side apply, field manager "aether",
// forced: the registrar's copy is the authority on its own schema) and
// waits until the API server serves them.
func installCRDs(ctx context.Context, dyn dynamic.Interface) error {
	crds, err := CRDs()
	if err != nil {
		return err
	}
	for _, crd := range crds {
		_, err := dyn.Resource(crdResource).Apply(ctx, crd.GetName(), crd, metav1.ApplyOptions{FieldManager: fieldManager, Force: true})
		if err != nil {
			return fmt.Errorf("installing CustomResourceDefinition %s (server-side apply): %w; the registrar needs create/patch on customresourcedefinitions.apiextensions.k8s.io to install them, or install them beforehand with kubectl apply -f backend/kubernetes/crds/", crd.GetName(), err)
		}
	}
	for _, crd := range crds {
		if err := waitEstablished(ctx, dyn, crd.GetName()); err != nil {
			return err
		}
	}
	return nil
}

func waitEstablished(ctx context.Context, dyn dynamic.Interface, name string) error {
	t := time.NewTicker(crdPollInterval)
	defer t.Stop()
	for {
		u, err := dyn.Resource(crdResource).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("reading CustomResourceDefinition %s after installing it: %w", name, err)
		}
		if established(u) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("CustomResourceDefinition %s was installed but the API server has not established it: %w", name, ctx.Err())
		case <-t.C:
		}
	}
}

// checkCRDs makes sure the CRDs exist, are established, and are of this
// code's schema revision or later; each failure names the fix.
func checkCRDs(ctx context.Context, dyn dynamic.Interface) error {
	crds, err := CRDs()
	if err != nil {
		return err
	}
	fix := "install them with kubectl apply -f backend/kubernetes/crds/ (the deploy/ manifests include them), or let the registrar install them (Config.InstallCRDs, which needs create/patch on customresourcedefinitions.apiextensions.k8s.io)"
	for _, crd := range crds {
		name := crd.GetName()
		u, err := dyn.Resource(crdResource).Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return fmt.Errorf("the kubernetes backend needs CustomResourceDefinition %s, which the cluster does not have: %s", name, fix)
		case apierrors.IsForbidden(err):
			return fmt.Errorf("cannot read CustomResourceDefinition %s to check it is installed (%v): grant get on customresourcedefinitions.apiextensions.k8s.io, or %s", name, err, fix)
		case err != nil:
			return fmt.Errorf("reading CustomResourceDefinition %s: %w", name, err)
		}
		rev, _ := strconv.Atoi(u.GetAnnotations()[crdRevisionAnnotation])
		if rev < CRDRevision {
			return fmt.Errorf("CustomResourceDefinition %s is of schema revision %d, this registrar needs %d (an older schema would prune fields it writes): %s", name, rev, CRDRevision, fix)
		}
		if !established(u) {
			return fmt.Errorf("CustomResourceDefinition %s exists but is not established (see kubectl describe crd %s)", name, name)
		}
	}
	return nil
}

func established(u *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}

// The Go side of the schemas in crds/: what the backend writes into and
// reads out of its objects. Fields follow registryv1's messages one for
// one, so a record read back is proto.Equal to the one written; enums are
// their value names without the type prefix (SERVING, not STATE_SERVING),
// timestamps are RFC 3339 with nanoseconds.

// endpointObject is an AetherEndpoint.
type endpointObject struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              endpointSpec `json:"spec"`
}

type endpointSpec struct {
	Fence     *fenceSpec `json:"fence,omitempty"`
	Key       string     `json:"key,omitempty"`
	Region    string     `json:"region,omitempty"`
	Cluster   string     `json:"cluster,omitempty"`
	Service   string     `json:"service,omitempty"`
	Protocol  string     `json:"protocol,omitempty"`
	IP        string     `json:"ip,omitempty"`
	Tombstone bool       `json:"tombstone,omitempty"`
	// DeletedLive is set on a tombstone whose write deleted a live
	// endpoint: only that write is a delete to a watcher.
	DeletedLive bool              `json:"deletedLive,omitempty"`
	DeletedAt   string            `json:"deletedAt,omitempty"`
	Ports       []portSpec        `json:"ports,omitempty"`
	Node        string            `json:"node,omitempty"`
	Zone        string            `json:"zone,omitempty"`
	State       string            `json:"state,omitempty"`
	Weight      uint32            `json:"weight,omitempty"`
	Metadata    map[string]string `json:"metadata,omitempty"`
	CreatedAt   string            `json:"createdAt,omitempty"`
	UpdatedAt   string            `json:"updatedAt,omitempty"`
	Stamp       *stampSpec        `json:"stamp,omitempty"`
}

type portSpec struct {
	Name string `json:"name,omitempty"`
	Port uint32 `json:"port"`
}

type stampSpec struct {
	HLC    int64  `json:"hlc"`
	Writer string `json:"writer,omitempty"`
}

// fenceSpec marks a watch fence (watch.go): not a record.
type fenceSpec struct {
	Writer string `json:"writer"`
	Seq    int64  `json:"seq,omitempty"`
}

// nodeObject is an AetherNode.
type nodeObject struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              nodeSpec `json:"spec"`
}

type nodeSpec struct {
	Fence           *fenceSpec        `json:"fence,omitempty"`
	Key             string            `json:"key,omitempty"`
	Region          string            `json:"region,omitempty"`
	Cluster         string            `json:"cluster,omitempty"`
	Name            string            `json:"name,omitempty"`
	Zone            string            `json:"zone,omitempty"`
	Address         string            `json:"address,omitempty"`
	Services        []string          `json:"services,omitempty"`
	Health          *healthSpec       `json:"health,omitempty"`
	Labels          map[string]string `json:"labels,omitempty"`
	LeaseID         int64             `json:"leaseID,omitempty"`
	LeaseTTLSeconds int64             `json:"leaseTTLSeconds,omitempty"`
	AnnouncedAt     string            `json:"announcedAt,omitempty"`
	// Lease names the coordination.k8s.io Lease that keeps the record
	// alive (nodes.go).
	Lease string     `json:"lease,omitempty"`
	Stamp *stampSpec `json:"stamp,omitempty"`
}

type healthSpec struct {
	Status               string `json:"status,omitempty"`
	Message              string `json:"message,omitempty"`
	EndpointsServing     uint32 `json:"endpointsServing,omitempty"`
	EndpointsTotal       uint32 `json:"endpointsTotal,omitempty"`
	EndpointsHeld        uint32 `json:"endpointsHeld,omitempty"`
	EndpointsHeldServing uint32 `json:"endpointsHeldServing,omitempty"`
}

// annotationKey carries the record's registry key in the object's
// metadata too, so that a metadata-only listing (digest.go) has it.
const annotationKey = "aether.dev/key"

func enumName(names map[int32]string, prefix string, v int32) (string, error) {
	if v == 0 {
		return "", nil
	}
	n, ok := names[v]
	if !ok {
		return "", fmt.Errorf("unknown %s value %d", strings.TrimSuffix(strings.ToLower(prefix), "_"), v)
	}
	return strings.TrimPrefix(n, prefix), nil
}

func enumValue(values map[string]int32, prefix, s string) (int32, error) {
	if s == "" {
		return 0, nil
	}
	v, ok := values[prefix+s]
	if !ok {
		return 0, fmt.Errorf("unknown %s %q", strings.TrimSuffix(strings.ToLower(prefix), "_"), s)
	}
	return v, nil
}

func formatTime(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return ""
	}
	return ts.AsTime().Format(time.RFC3339Nano)
}

func parseTime(s string) (*timestamppb.Timestamp, error) {
	if s == "" {
		return nil, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return nil, err
	}
	return timestamppb.New(t), nil
}

func toStamp(s *registryv1.WriteStamp) *stampSpec {
	if s == nil {
		return nil
	}
	return &stampSpec{HLC: int64(s.GetHlc()), Writer: s.GetWriter()}
}

func fromStamp(s *stampSpec) *registryv1.WriteStamp {
	if s == nil {
		return nil
	}
	return &registryv1.WriteStamp{Hlc: uint64(s.HLC), Writer: s.Writer}
}

// endpointSpecOf is ep as an AetherEndpoint's spec. key is ep's key.
func endpointSpecOf(key string, ep *registryv1.ServiceEndpoint) (endpointSpec, error) {
	proto, err := enumName(registryv1.Protocol_name, "PROTOCOL_", int32(ep.GetProtocol()))
	if err != nil {
		return endpointSpec{}, err
	}
	state, err := enumName(registryv1.State_name, "STATE_", int32(ep.GetState()))
	if err != nil {
		return endpointSpec{}, err
	}
	if ep.GetStamp().GetHlc() > math.MaxInt64 {
		return endpointSpec{}, fmt.Errorf("stamp %d does not fit the schema's int64", ep.GetStamp().GetHlc())
	}
	spec := endpointSpec{
		Key: key, Region: ep.GetRegion(), Cluster: ep.GetCluster(), Service: ep.GetService(),
		Protocol: proto, IP: ep.GetIp(), Node: ep.GetNode(), Zone: ep.GetZone(), State: state,
		Weight: ep.GetWeight(), Metadata: ep.GetMetadata(),
		CreatedAt: formatTime(ep.GetCreatedAt()), UpdatedAt: formatTime(ep.GetUpdatedAt()),
		Stamp: toStamp(ep.GetStamp()),
	}
	for _, p := range ep.GetPorts() {
		spec.Ports = append(spec.Ports, portSpec{Name: p.GetName(), Port: p.GetPort()})
	}
	return spec, nil
}

// tombstoneSpecOf is the spec of id's tombstone: its identity and the
// delete's stamp.
func tombstoneSpecOf(key string, id registry.EndpointID, stamp *registryv1.WriteStamp, deletedLive bool, at time.Time) (endpointSpec, error) {
	proto, err := enumName(registryv1.Protocol_name, "PROTOCOL_", int32(id.Protocol))
	if err != nil {
		return endpointSpec{}, err
	}
	if stamp.GetHlc() > math.MaxInt64 {
		return endpointSpec{}, fmt.Errorf("stamp %d does not fit the schema's int64", stamp.GetHlc())
	}
	return endpointSpec{
		Key: key, Region: id.Region, Cluster: id.Cluster, Service: id.Service, Protocol: proto, IP: id.IP,
		Tombstone: true, DeletedLive: deletedLive, DeletedAt: at.UTC().Format(time.RFC3339Nano),
		Stamp: toStamp(stamp),
	}, nil
}

// endpointOf decodes a live endpoint's spec, and checks that it is the
// endpoint its key names, as registry.DecodeEndpoint does for etcd.
func endpointOf(spec *endpointSpec) (*registryv1.ServiceEndpoint, error) {
	proto, err := enumValue(registryv1.Protocol_value, "PROTOCOL_", spec.Protocol)
	if err != nil {
		return nil, err
	}
	state, err := enumValue(registryv1.State_value, "STATE_", spec.State)
	if err != nil {
		return nil, err
	}
	ep := &registryv1.ServiceEndpoint{
		Service: spec.Service, Protocol: registryv1.Protocol(proto), Ip: spec.IP, Node: spec.Node,
		Cluster: spec.Cluster, Region: spec.Region, Zone: spec.Zone, State: registryv1.State(state),
		Weight: spec.Weight, Stamp: fromStamp(spec.Stamp),
	}
	if len(spec.Metadata) > 0 {
		ep.Metadata = spec.Metadata
	}
	for _, p := range spec.Ports {
		ep.Ports = append(ep.Ports, &registryv1.Port{Name: p.Name, Port: p.Port})
	}
	if ep.CreatedAt, err = parseTime(spec.CreatedAt); err != nil {
		return nil, fmt.Errorf("createdAt: %w", err)
	}
	if ep.UpdatedAt, err = parseTime(spec.UpdatedAt); err != nil {
		return nil, fmt.Errorf("updatedAt: %w", err)
	}
	id, err := registry.ParseEndpointKey(spec.Key)
	if err != nil {
		return nil, err
	}
	if got := registry.IDOf(ep); got != id {
		return nil, fmt.Errorf("object of key %q holds a different endpoint (%s)", spec.Key, got)
	}
	return ep, nil
}

// nodeSpecOf is n as an AetherNode's spec, kept alive by the named Lease.
func nodeSpecOf(key string, n *registryv1.Node, lease string) (nodeSpec, error) {
	spec := nodeSpec{
		Key: key, Region: n.GetRegion(), Cluster: n.GetCluster(), Name: n.GetName(), Zone: n.GetZone(),
		Address: n.GetAddress(), Services: n.GetServices(), Labels: n.GetLabels(),
		LeaseID: n.GetLeaseId(), LeaseTTLSeconds: n.GetLeaseTtlSeconds(),
		AnnouncedAt: formatTime(n.GetAnnouncedAt()), Lease: lease, Stamp: toStamp(n.GetStamp()),
	}
	if h := n.GetHealth(); h != nil {
		status, err := enumName(registryv1.Health_name, "HEALTH_", int32(h.GetStatus()))
		if err != nil {
			return nodeSpec{}, err
		}
		spec.Health = &healthSpec{
			Status: status, Message: h.GetMessage(),
			EndpointsServing: h.GetEndpointsServing(), EndpointsTotal: h.GetEndpointsTotal(),
			EndpointsHeld: h.GetEndpointsHeld(), EndpointsHeldServing: h.GetEndpointsHeldServing(),
		}
	}
	return spec, nil
}

// nodeOf decodes a node record's spec and checks it is the node its key
// names.
func nodeOf(spec *nodeSpec) (*registryv1.Node, error) {
	n := &registryv1.Node{
		Name: spec.Name, Cluster: spec.Cluster, Region: spec.Region, Zone: spec.Zone, Address: spec.Address,
		LeaseId: spec.LeaseID, LeaseTtlSeconds: spec.LeaseTTLSeconds, Stamp: fromStamp(spec.Stamp),
	}
	if len(spec.Services) > 0 {
		n.Services = spec.Services
	}
	if len(spec.Labels) > 0 {
		n.Labels = spec.Labels
	}
	if h := spec.Health; h != nil {
		status, err := enumValue(registryv1.Health_value, "HEALTH_", h.Status)
		if err != nil {
			return nil, err
		}
		n.Health = &registryv1.HealthSummary{
			Status: registryv1.Health(status), Message: h.Message,
			EndpointsServing: h.EndpointsServing, EndpointsTotal: h.EndpointsTotal,
			EndpointsHeld: h.EndpointsHeld, EndpointsHeldServing: h.EndpointsHeldServing,
		}
	}
	var err error
	if n.AnnouncedAt, err = parseTime(spec.AnnouncedAt); err != nil {
		return nil, fmt.Errorf("announcedAt: %w", err)
	}
	id, err := registry.ParseNodeKey(spec.Key)
	if err != nil {
		return nil, err
	}
	if got := registry.NodeIDOf(n); got != id {
		return nil, fmt.Errorf("object of key %q holds a different node (%s)", spec.Key, got)
	}
	return n, nil
}

// NodeObject is the AetherNode that stores n, kept alive by the Lease of
// id lease: spec.lease names it (what NodeOf reports), and the label
// labelLease carries its id, so the reaper lists a lease's records by
// selector. It is what PutNode writes (create, or update with a
// resourceVersion precondition set on the result).
func NodeObject(n *registryv1.Node, lease int64) (*unstructured.Unstructured, error) {
	id := registry.NodeIDOf(n)
	key, err := id.Key()
	if err != nil {
		return nil, err
	}
	spec, err := nodeSpecOf(key, n, leaseName(lease))
	if err != nil {
		return nil, err
	}
	meta := recordMeta(NodeObjectName(key, id.Name), key)
	meta.Labels[labelLease] = leaseHex(lease)
	obj := &nodeObject{
		TypeMeta:   metav1.TypeMeta{APIVersion: Group + "/" + Version, Kind: "AetherNode"},
		ObjectMeta: meta,
		Spec:       spec,
	}
	return toUnstructured(obj)
}

// NodeOf decodes an AetherNode into its node record, its lease's name and
// its mod revision.
func NodeOf(u *unstructured.Unstructured) (n *registryv1.Node, lease string, rev int64, err error) {
	var obj nodeObject
	if err := fromUnstructured(u, &obj); err != nil {
		return nil, "", 0, err
	}
	if obj.Spec.Fence != nil {
		return nil, "", 0, errFence
	}
	rev, err = parseRV(obj.ResourceVersion)
	if err != nil {
		return nil, "", 0, err
	}
	n, err = nodeOf(&obj.Spec)
	return n, obj.Spec.Lease, rev, err
}

// errFence is what decoding a watch fence object as a record reports.
var errFence = errors.New("a watch fence, not a record")

// recordMeta is the metadata of a record's object.
func recordMeta(name, key string) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name:        name,
		Labels:      map[string]string{LabelManagedBy: managedBy, LabelKeyHash: keyHash(key)},
		Annotations: map[string]string{annotationKey: key},
	}
}

func toUnstructured(obj any) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, err
	}
	return &unstructured.Unstructured{Object: m}, nil
}

func fromUnstructured(u *unstructured.Unstructured, obj any) error {
	return runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, obj)
}
