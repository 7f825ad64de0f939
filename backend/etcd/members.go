package etcd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/aethermesh/aether/backend"
)

var _ backend.Members = (*Store)(nil)

// PutMember writes a replica's member record under its lease: a key per
// incarnation below backend.MembersPrefix, so etcd deletes it when the
// replica stops renewing, and the registry's watch (under registry.Root)
// never sees it.
func (s *Store) PutMember(ctx context.Context, region, cluster string, m backend.Member, lease int64) error {
	if m.Epoch == "" {
		return errors.New("member record without an epoch")
	}
	val, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("encode member %s: %w", m.Epoch, err)
	}
	key := backend.MembersPrefix(region, cluster) + m.Epoch
	if _, err := s.cli.Put(ctx, key, string(val), clientv3.WithLease(clientv3.LeaseID(lease))); err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return fmt.Errorf("put %s: lease %x: %w", key, lease, ErrLeaseNotFound)
		}
		return fmt.Errorf("etcd put %s: %w", key, err)
	}
	return nil
}

// ListMembers reads the member records of (region, cluster); one that does
// not decode is skipped (a record of a newer version, say).
func (s *Store) ListMembers(ctx context.Context, region, cluster string) ([]backend.Member, error) {
	prefix := backend.MembersPrefix(region, cluster)
	resp, err := s.cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("etcd list %s: %w", prefix, err)
	}
	out := make([]backend.Member, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var m backend.Member
		if json.Unmarshal(kv.Value, &m) != nil || m.Epoch == "" {
			continue
		}
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Epoch < out[j].Epoch })
	return out, nil
}
