package kubernetes

import (
	"context"
	"fmt"
	"sort"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/metadata"

	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/registry"
)

// The digest: a metadata-only listing (PartialObjectMetadataList, the
// Accept header kubectl uses for "get -o name"), which carries names,
// labels, annotations and resourceVersions but no specs. The key rides
// in the aether.dev/key annotation, tombstones and fences are told by
// their labels, so the digest reads a few hundred bytes per object where a
// listing reads the whole record.
//
// Objects are not stored in key order under their names (the names are
// hashes), so the parts cannot be key ranges read one by one; instead the
// listing, one snapshot at the first page's resourceVersion, is read in
// as many stretches of pages as there are parts, with p.Between between
// them, which spreads its cost the same way.

// ListRevisionsInParts returns the keys and mod revisions of every endpoint
// and node record at one revision (backend.Digester).
func (s *Store) ListRevisionsInParts(ctx context.Context, p backend.Parts) (backend.KeyRevisions, error) {
	var kr backend.KeyRevisions
	var err error
	for attempt := 0; attempt < maxListAttempts; attempt++ {
		kr, err = s.digest(ctx, p)
		if err == nil || !errorsIsCompacted(err) {
			return kr, err
		}
	}
	return kr, err
}

func (s *Store) digest(ctx context.Context, p backend.Parts) (backend.KeyRevisions, error) {
	var kr backend.KeyRevisions
	parts := len(p.Ranges())
	perPart := int64(0) // objects per part, once the first page tells the total
	betweens := 0
	seen := int64(0)
	between := func() error {
		if p.Between == nil || betweens >= parts-1 {
			return nil
		}
		betweens++
		return p.Between(ctx)
	}
	epsMeta := s.meta.Resource(EndpointsResource).Namespace(s.ns)
	rev, err := s.metaPages(ctx, epsMeta, metav1.ListOptions{}, func(l *metav1.PartialObjectMetadataList, page int) error {
		if page == 0 {
			total := int64(len(l.Items))
			if l.RemainingItemCount != nil {
				total += *l.RemainingItemCount
			}
			perPart = max((total+int64(parts)-1)/int64(parts), 1)
		}
		for i := range l.Items {
			m := &l.Items[i]
			seen++
			if m.Labels[LabelTombstone] == "true" || m.Labels[LabelFence] != "" {
				continue
			}
			id, err := registry.ParseEndpointKey(m.Annotations[annotationKey])
			if err != nil {
				continue // List skips it too (it does not decode)
			}
			r, err := parseRV(m.ResourceVersion)
			if err != nil {
				return err
			}
			kr.Endpoints = append(kr.Endpoints, backend.EndpointRevision{ID: id, ModRevision: r})
		}
		if l.Continue != "" && seen >= int64(betweens+1)*perPart {
			return between()
		}
		return nil
	})
	if err != nil {
		return kr, err
	}
	for betweens < parts-1 && p.Between != nil {
		if err := between(); err != nil {
			return kr, err
		}
	}
	kr.Revision = rev
	// Node records are few (one per node, against its many endpoints) and
	// written by PutNode without the key annotation's guarantee, so they
	// are read whole, at the same revision.
	nodes, nodeRevs, err := s.listNodes(ctx, metav1.ListOptions{ResourceVersion: formatRV(rev), ResourceVersionMatch: metav1.ResourceVersionMatchExact})
	if err != nil {
		return kr, err
	}
	for i, n := range nodes {
		kr.Nodes = append(kr.Nodes, backend.NodeRevision{ID: registry.NodeIDOf(n), ModRevision: nodeRevs[i]})
	}
	sort.Slice(kr.Endpoints, func(i, j int) bool { return epKey(kr.Endpoints[i].ID) < epKey(kr.Endpoints[j].ID) })
	return kr, nil
}

func epKey(id registry.EndpointID) string { k, _ := id.Key(); return k }

// metaPages is pages for metadata-only listings; fn may end the read with
// an error.
func (s *Store) metaPages(ctx context.Context, r metadata.ResourceInterface, opts metav1.ListOptions, fn func(*metav1.PartialObjectMetadataList, int) error) (int64, error) {
	opts.Limit = s.pageSize
	var rev int64
	for page := 0; ; page++ {
		if err := s.acquire(ctx); err != nil {
			return 0, err
		}
		l, err := r.List(ctx, opts)
		s.release()
		if err != nil {
			return 0, fmt.Errorf("kubernetes backend: metadata listing page %d: %w", page, classify(err))
		}
		if page == 0 {
			if rev, err = parseRV(l.ResourceVersion); err != nil {
				return 0, err
			}
		}
		if err := fn(l, page); err != nil {
			return 0, err
		}
		if l.Continue == "" {
			return rev, nil
		}
		opts = metav1.ListOptions{Limit: s.pageSize, Continue: l.Continue}
	}
}
