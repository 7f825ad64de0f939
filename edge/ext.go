package edge

import (
	"bytes"
	"context"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	edgev1 "github.com/aethermesh/aether/api/edge/v1"
	"github.com/aethermesh/aether/edge/internal/core"
)

// extServer is the extension API (aether.edge.v1.Edge): the change DAG
// behind the revisions.
type extServer struct {
	edgev1.UnimplementedEdgeServer
	s *Server
}

func (e *extServer) extHeader() *edgev1.Header {
	return &edgev1.Header{ClusterId: e.s.clusterID, MemberId: e.s.memberID, Revision: e.s.st.Rev(), Index: e.s.st.Index()}
}

func (e *extServer) Heads(ctx context.Context, r *edgev1.HeadsRequest) (*edgev1.HeadsResponse, error) {
	var resp *edgev1.HeadsResponse
	_, err := e.s.read(ctx, func() error {
		heads := e.s.st.Heads()
		out := make([][]byte, len(heads))
		for i := range heads {
			out[i] = heads[i][:]
		}
		slices.SortFunc(out, bytes.Compare)
		resp = &edgev1.HeadsResponse{Header: e.extHeader(), Heads: out}
		return nil
	})
	return resp, err
}

func (e *extServer) HashOfRevision(ctx context.Context, r *edgev1.HashOfRevisionRequest) (*edgev1.HashOfRevisionResponse, error) {
	var resp *edgev1.HashOfRevisionResponse
	_, err := e.s.read(ctx, func() error {
		h, ok := e.s.st.HashOfRevision(r.Revision)
		if !ok {
			return status.Errorf(codes.NotFound, "edge: no change has revision %d on this replica", r.Revision)
		}
		resp = &edgev1.HashOfRevisionResponse{Header: e.extHeader(), Hash: h[:]}
		return nil
	})
	return resp, err
}

func (e *extServer) RevisionOfHash(ctx context.Context, r *edgev1.RevisionOfHashRequest) (*edgev1.RevisionOfHashResponse, error) {
	if len(r.Hash) != len(core.Hash{}) {
		return nil, status.Errorf(codes.InvalidArgument, "edge: a change hash is %d bytes, got %d", len(core.Hash{}), len(r.Hash))
	}
	var h core.Hash
	copy(h[:], r.Hash)
	var resp *edgev1.RevisionOfHashResponse
	_, err := e.s.read(ctx, func() error {
		rev, ok := e.s.st.RevisionOf(h)
		if !ok || rev == 0 {
			return status.Errorf(codes.NotFound, "edge: change %x has no revision on this replica", h[:])
		}
		resp = &edgev1.RevisionOfHashResponse{Header: e.extHeader(), Revision: rev}
		return nil
	})
	return resp, err
}

// ReplicationStatus: what sync has learned of each peer (sync.go).
func (e *extServer) ReplicationStatus(ctx context.Context, r *edgev1.ReplicationStatusRequest) (*edgev1.ReplicationStatusResponse, error) {
	for _, h := range r.Hashes {
		if len(h) != len(core.Hash{}) {
			return nil, status.Errorf(codes.InvalidArgument, "edge: a change hash is %d bytes, got %d", len(core.Hash{}), len(h))
		}
	}
	var resp *edgev1.ReplicationStatusResponse
	_, err := e.s.read(ctx, func() error {
		resp = &edgev1.ReplicationStatusResponse{Header: e.extHeader(), Peers: e.s.sync.peerStatus(r.Hashes)}
		return nil
	})
	return resp, err
}
