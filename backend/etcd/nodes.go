package etcd

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/registry"
)

// ErrLeaseNotFound means a lease has expired or was revoked: the node it
// kept alive is gone and must announce itself again. It is
// backend.ErrLeaseNotFound, so callers may test for either.
var ErrLeaseNotFound = backend.ErrLeaseNotFound

// Node liveness is an etcd lease per node. The node record is put under the
// lease; whichever registrar replica receives the node's heartbeat renews
// it. When the heartbeats stop, etcd itself deletes the record once the
// lease runs out: no registrar ever decides on its own that a node is dead.

// GrantLease creates a lease of the given TTL (rounded up to whole seconds,
// at least 1).
func (s *Store) GrantLease(ctx context.Context, ttl time.Duration) (int64, error) {
	secs := max(int64((ttl+time.Second-1)/time.Second), 1)
	resp, err := s.cli.Grant(ctx, secs)
	if err != nil {
		return 0, fmt.Errorf("etcd lease grant (%ds): %w", secs, err)
	}
	return int64(resp.ID), nil
}

// KeepAliveOnce renews a lease and returns its TTL, or ErrLeaseNotFound.
func (s *Store) KeepAliveOnce(ctx context.Context, lease int64) (time.Duration, error) {
	resp, err := s.cli.KeepAliveOnce(ctx, clientv3.LeaseID(lease))
	if err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return 0, fmt.Errorf("lease %x: %w", lease, ErrLeaseNotFound)
		}
		return 0, fmt.Errorf("etcd lease keepalive %x: %w", lease, err)
	}
	if resp.TTL <= 0 {
		return 0, fmt.Errorf("lease %x: %w", lease, ErrLeaseNotFound)
	}
	return time.Duration(resp.TTL) * time.Second, nil
}

// LeaseTTL reports a lease's remaining and granted TTL, or ErrLeaseNotFound.
func (s *Store) LeaseTTL(ctx context.Context, lease int64) (remaining, granted time.Duration, err error) {
	resp, err := s.cli.TimeToLive(ctx, clientv3.LeaseID(lease))
	if err != nil {
		return 0, 0, fmt.Errorf("etcd lease time-to-live %x: %w", lease, err)
	}
	if resp.TTL < 0 {
		return 0, 0, fmt.Errorf("lease %x: %w", lease, ErrLeaseNotFound)
	}
	return time.Duration(resp.TTL) * time.Second, time.Duration(resp.GrantedTTL) * time.Second, nil
}

// RevokeLease ends a lease now, deleting every key attached to it, and
// returns the revision of the deletion. Revoking a lease that is already
// gone is not an error (the revision is then 0).
func (s *Store) RevokeLease(ctx context.Context, lease int64) (int64, error) {
	resp, err := s.cli.Revoke(ctx, clientv3.LeaseID(lease))
	if err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return 0, nil
		}
		return 0, fmt.Errorf("etcd lease revoke %x: %w", lease, err)
	}
	return resp.Header.GetRevision(), nil
}

// PutNode writes a node record attached to lease and returns the revision.
// A lease that no longer exists fails with ErrLeaseNotFound, so a record is
// never written outside a live lease.
func (s *Store) PutNode(ctx context.Context, n *registryv1.Node, lease int64) (int64, error) {
	key, err := registry.NodeIDOf(n).Key()
	if err != nil {
		return 0, fmt.Errorf("node record: %w", err)
	}
	val, err := registry.EncodeNode(n)
	if err != nil {
		return 0, fmt.Errorf("encode %s: %w", key, err)
	}
	resp, err := s.cli.Put(ctx, key, string(val), clientv3.WithLease(clientv3.LeaseID(lease)))
	if err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return 0, fmt.Errorf("put %s: lease %x: %w", key, lease, ErrLeaseNotFound)
		}
		return 0, fmt.Errorf("etcd put %s: %w", key, err)
	}
	return resp.Header.GetRevision(), nil
}
