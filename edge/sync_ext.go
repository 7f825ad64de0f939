package edge

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	edgev1 "github.com/aethermesh/aether/api/edge/v1"
	"github.com/aethermesh/aether/edge/internal/core"
)

// kick wakes WaitReplicated callers: what a peer is known to hold grew.
func (y *syncer) kick() {
	y.waitMu.Lock()
	close(y.waitCh)
	y.waitCh = make(chan struct{})
	y.waitMu.Unlock()
}

func (y *syncer) waiter() <-chan struct{} {
	y.waitMu.Lock()
	defer y.waitMu.Unlock()
	return y.waitCh
}

// WaitReplicated (extension API): see api/edge/v1/edge.proto.
func (e *extServer) WaitReplicated(ctx context.Context, r *edgev1.WaitReplicatedRequest) (*edgev1.WaitReplicatedResponse, error) {
	y := e.s.sync
	for _, h := range r.Hashes {
		if len(h) != len(core.Hash{}) {
			return nil, status.Errorf(codes.InvalidArgument, "edge: a change hash is %d bytes, got %d", len(core.Hash{}), len(h))
		}
	}
	if r.Replicas < 1 || int(r.Replicas) > 1+len(y.peers) {
		return nil, status.Errorf(codes.InvalidArgument, "edge: replicas must be 1 to %d (this replica and its peers), got %d", 1+len(y.peers), r.Replicas)
	}
	// Held here, and durable (read waits for what it observed).
	if _, err := e.s.read(ctx, func() error {
		for _, h := range r.Hashes {
			var id core.Hash
			copy(id[:], h)
			if _, _, ok := y.position(id); !ok {
				return status.Errorf(codes.NotFound, "edge: change %x is not on this replica", h)
			}
		}
		return nil
	}); err != nil {
		return nil, err
	}
	for {
		wake := y.waiter()
		var holders []uint64
		e.s.mu.RLock()
		ps := y.peerStatus(r.Hashes)
		e.s.mu.RUnlock()
		for _, p := range ps {
			all := true
			for _, ok := range p.Has {
				all = all && ok
			}
			if all {
				holders = append(holders, p.MemberId)
			}
		}
		if 1+len(holders) >= int(r.Replicas) {
			var resp *edgev1.WaitReplicatedResponse
			_, err := e.s.read(ctx, func() error {
				resp = &edgev1.WaitReplicatedResponse{Header: e.extHeader(), MemberIds: holders}
				return nil
			})
			return resp, err
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return nil, togRPC(ctx.Err())
		}
	}
}
