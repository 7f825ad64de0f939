package kubernetes

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"sort"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
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
	Fence     *fenceSpec        `json:"fence,omitempty"`
	Key       string            `json:"key,omitempty"`
	Region    string            `json:"region,omitempty"`
	Cluster   string            `json:"cluster,omitempty"`
	Service   string            `json:"service,omitempty"`
	Protocol  string            `json:"protocol,omitempty"`
	IP        string            `json:"ip,omitempty"`
	Tombstone bool              `json:"tombstone,omitempty"`
	DeletedAt string            `json:"deletedAt,omitempty"`
	Ports     []portSpec        `json:"ports,omitempty"`
	Node      string            `json:"node,omitempty"`
	Zone      string            `json:"zone,omitempty"`
	State     string            `json:"state,omitempty"`
	Weight    uint32            `json:"weight,omitempty"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	CreatedAt string            `json:"createdAt,omitempty"`
	UpdatedAt string            `json:"updatedAt,omitempty"`
	Stamp     *stampSpec        `json:"stamp,omitempty"`
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
