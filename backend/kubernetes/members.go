package kubernetes

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/aethermesh/aether/backend"
)

// Peer-watch membership (backend.Members) on the same Leases as node
// liveness: a replica's member record is carried by the Lease it renews
// (one per replica), as a label that makes the Lease listable by
// (region, cluster) and an annotation holding the Member. A member lives
// exactly as long as its lease by construction: revoked, the Lease is
// deleted; lapsed, ListMembers leaves it out by the rule (leases.go) and
// the reaper deletes it. Nothing is in registry.Root's records, so no
// listing, digest or watch of the registry sees members, and the RBAC is
// that of the Leases.

var (
	_ backend.Leases  = (*Store)(nil)
	_ backend.Members = (*Store)(nil)
)

// memberPrefix is the label and annotation key prefix of member records.
const memberPrefix = "members.aether.dev/"

// memberKey is the label (and annotation) key of (region, cluster)'s
// member records: a hash, since region and cluster names need not fit a
// label name (63 characters of [A-Za-z0-9._-]).
func memberKey(region, cluster string) string {
	sum := sha256.Sum256([]byte(region + "/" + cluster))
	return memberPrefix + "m-" + hex.EncodeToString(sum[:])[:24]
}

// memberRecord is a member as the annotation holds it: with its region
// and cluster, so that a reader need not trust the hash.
type memberRecord struct {
	Region  string `json:"region"`
	Cluster string `json:"cluster"`
	backend.Member
}

// PutMember puts m for (region, cluster) on lease's Lease, written with
// the resourceVersion its liveness was judged on.
func (s *Store) PutMember(ctx context.Context, region, cluster string, m backend.Member, lease int64) error {
	key := memberKey(region, cluster)
	val, err := json.Marshal(memberRecord{Region: region, Cluster: cluster, Member: m})
	if err != nil {
		return fmt.Errorf("kubernetes: put member %s: %w", m.Epoch, err)
	}
	for attempt := 0; ; attempt++ {
		l, err := s.liveLease(ctx, lease, "put member "+m.Epoch)
		if err != nil {
			return err
		}
		if l.Labels == nil {
			l.Labels = map[string]string{}
		}
		if l.Annotations == nil {
			l.Annotations = map[string]string{}
		}
		l.Labels[key] = ""
		l.Annotations[key] = string(val)
		_, err = s.leases().Update(ctx, l, metav1.UpdateOptions{})
		switch {
		case err == nil:
			return nil
		case apierrors.IsNotFound(err):
			return fmt.Errorf("kubernetes: put member %s: lease %x ended meanwhile: %w", m.Epoch, lease, backend.ErrLeaseNotFound)
		case apierrors.IsConflict(err) && attempt < 4:
			continue // renewed in between: read again
		default:
			return fmt.Errorf("kubernetes: put member %s: %w", m.Epoch, classify(err))
		}
	}
}

// ListMembers lists (region, cluster)'s member Leases with a quorum read
// and keeps those alive by the rule, in epoch order.
func (s *Store) ListMembers(ctx context.Context, region, cluster string) ([]backend.Member, error) {
	key := memberKey(region, cluster)
	list, err := s.leases().List(ctx, metav1.ListOptions{LabelSelector: key})
	if err != nil {
		return nil, fmt.Errorf("kubernetes: list members of %s/%s: %w", region, cluster, classify(err))
	}
	var out []backend.Member
	for i := range list.Items {
		l := &list.Items[i]
		if s.lapsed(l) {
			continue
		}
		var rec memberRecord
		if err := json.Unmarshal([]byte(l.Annotations[key]), &rec); err != nil || rec.Region != region || rec.Cluster != cluster {
			s.log.Warn("member record that does not decode, or of another cluster, left out", "lease", l.Name, "err", err)
			continue
		}
		out = append(out, rec.Member)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Epoch < out[j].Epoch })
	return out, nil
}
