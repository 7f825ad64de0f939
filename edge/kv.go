package edge

import (
	"context"
	"errors"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/aethermesh/aether/edge/internal/core"
)

// header fills a response header as etcd's v3rpc header.fill does: the
// cluster and member ids, the term, and the current revision when the core
// left it zero.
func (s *Server) header(h *pb.ResponseHeader, rev int64) *pb.ResponseHeader {
	if h == nil {
		h = &pb.ResponseHeader{}
	}
	h.ClusterId = s.clusterID
	h.MemberId = s.memberID
	h.RaftTerm = raftTerm
	if h.Revision == 0 {
		h.Revision = rev
	}
	return h
}

// failure is the error every request gets once storage has failed.
func (s *Server) failure() error {
	if p := s.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// write runs one mutating core call under the state lock and waits for the
// change it produced (or, when it produced none, for whatever the response
// observed) to be durable. It returns the current revision for the header.
func (s *Server) write(ctx context.Context, apply func(now time.Time) (*core.Applied, error)) (int64, error) {
	if err := s.failure(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	ap, err := apply(s.now())
	var b *batch
	if ap != nil {
		b = s.commit.add(ap)
	} else if err == nil {
		b = s.commit.last()
	}
	rev := s.st.Rev()
	s.mu.Unlock()
	if err != nil {
		return 0, togRPC(err)
	}
	if err := b.wait(ctx); err != nil {
		return 0, togRPC(err)
	}
	return rev, nil
}

// read runs a read-only core call under the read lock, then waits until
// everything it may have observed is durable.
func (s *Server) read(ctx context.Context, fn func() error) (int64, error) {
	if err := s.failure(); err != nil {
		return 0, err
	}
	s.mu.RLock()
	err := fn()
	rev := s.st.Rev()
	b := s.commit.last()
	s.mu.RUnlock()
	if err != nil {
		return 0, togRPC(err)
	}
	if err := b.wait(ctx); err != nil {
		return 0, togRPC(err)
	}
	return rev, nil
}

// togRPC maps an error to what etcd's togRPCError returns: gRPC status
// errors (the core returns rpctypes' values) pass through, context errors
// become their gRPC codes, anything else is Unknown with its message.
func togRPC(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) {
		return status.Error(codes.Canceled, err.Error())
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(codes.Unknown, err.Error())
}

// checkSize is etcd's max-request-bytes check for requests that go through
// raft: the marshalled InternalRaftRequest, with its request id, must not
// exceed MaxRequestBytes (etcdserver/v3_server.go).
func (s *Server) checkSize(r *pb.InternalRaftRequest) error {
	r.Header = &pb.RequestHeader{ID: s.reqID.next()}
	if proto.Size(r) > s.maxRequestBytes {
		return rpctypes.ErrGRPCRequestTooLarge
	}
	return nil
}

type kvServer struct {
	pb.UnimplementedKVServer
	s *Server
}

// Range reads at the newest durable revision. A range with no revision
// would otherwise see changes still waiting for their fsync and have to wait
// for it (so as never to show state a crash could lose); reading at the
// durable revision gives the same answer a moment earlier, without waiting,
// and the header names that revision, so a client never learns of a
// revision that a crash could take back.
func (k *kvServer) Range(ctx context.Context, r *pb.RangeRequest) (*pb.RangeResponse, error) {
	if err := core.CheckRange(r); err != nil {
		return nil, err
	}
	s := k.s
	if err := s.failure(); err != nil {
		return nil, err
	}
	s.mu.RLock()
	durable, _ := s.hub.snapshot()
	if r.Revision == 0 && durable < s.st.Rev() && durable >= s.st.CompactRev() {
		r.Revision = durable
		resp, err := s.st.Range(r)
		r.Revision = 0
		s.mu.RUnlock()
		if err != nil {
			return nil, togRPC(err)
		}
		resp.Header = s.header(resp.Header, 0)
		resp.Header.Revision = durable
		return resp, nil
	}
	s.mu.RUnlock()
	var resp *pb.RangeResponse
	rev, err := s.read(ctx, func() (err error) {
		resp, err = s.st.Range(r)
		return err
	})
	if err != nil {
		return nil, err
	}
	resp.Header = s.header(resp.Header, rev)
	return resp, nil
}

func (k *kvServer) Put(ctx context.Context, r *pb.PutRequest) (*pb.PutResponse, error) {
	if err := core.CheckPut(r); err != nil {
		return nil, err
	}
	if err := k.s.checkSize(&pb.InternalRaftRequest{Put: r}); err != nil {
		return nil, err
	}
	if err := k.s.checkQuota(costPut(r)); err != nil {
		return nil, err
	}
	var resp *pb.PutResponse
	rev, err := k.s.write(ctx, func(now time.Time) (ap *core.Applied, err error) {
		resp, ap, err = k.s.st.Put(now, r)
		return ap, err
	})
	if err != nil {
		return nil, err
	}
	resp.Header = k.s.header(resp.Header, rev)
	return resp, nil
}

func (k *kvServer) DeleteRange(ctx context.Context, r *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error) {
	if err := core.CheckDeleteRange(r); err != nil {
		return nil, err
	}
	if err := k.s.checkSize(&pb.InternalRaftRequest{DeleteRange: r}); err != nil {
		return nil, err
	}
	var resp *pb.DeleteRangeResponse
	rev, err := k.s.write(ctx, func(now time.Time) (ap *core.Applied, err error) {
		resp, ap, err = k.s.st.DeleteRange(now, r)
		return ap, err
	})
	if err != nil {
		return nil, err
	}
	resp.Header = k.s.header(resp.Header, rev)
	return resp, nil
}

func (k *kvServer) Txn(ctx context.Context, r *pb.TxnRequest) (*pb.TxnResponse, error) {
	if err := core.CheckTxn(r, k.s.maxTxnOps); err != nil {
		return nil, err
	}
	// etcd serves a read-only txn without raft, so only a txn that may
	// write is held to max-request-bytes.
	if !isTxnReadonly(r) {
		if err := k.s.checkSize(&pb.InternalRaftRequest{Txn: r}); err != nil {
			return nil, err
		}
	}
	if err := k.s.checkQuota(costTxn(r)); err != nil {
		return nil, err
	}
	var resp *pb.TxnResponse
	rev, err := k.s.write(ctx, func(now time.Time) (ap *core.Applied, err error) {
		resp, ap, err = k.s.st.Txn(now, r)
		return ap, err
	})
	if err != nil {
		return nil, err
	}
	resp.Header = k.s.header(resp.Header, rev)
	return resp, nil
}

// Compact is local to this replica (not a change): the core drops history
// at and below the revision, and storage persists the revision so a restart
// compacts again.
func (k *kvServer) Compact(ctx context.Context, r *pb.CompactionRequest) (*pb.CompactionResponse, error) {
	s := k.s
	if err := s.checkSize(&pb.InternalRaftRequest{Compaction: r}); err != nil {
		return nil, err
	}
	if err := s.failure(); err != nil {
		return nil, err
	}
	s.compactMu.Lock()
	defer s.compactMu.Unlock()
	s.mu.Lock()
	prev := s.st.CompactRev()
	err := s.st.Compact(r.Revision)
	rev := s.st.Rev()
	compacted := s.st.CompactRev()
	b := s.commit.last()
	s.mu.Unlock()
	if err != nil {
		return nil, togRPC(err)
	}
	s.hub.setCompacted(compacted)
	s.noteCompactionHash(r.Revision, prev)
	s.mu.RLock()
	s.recountQuota()
	s.mu.RUnlock()
	// Persist the compaction only once the changes up to it are durable,
	// so a crash can never leave a compaction past the stored log.
	if err := b.wait(ctx); err != nil {
		return nil, togRPC(err)
	}
	if err := s.store.SetCompacted(r.Revision); err != nil {
		return nil, status.Errorf(codes.Unavailable, "edge: persist compaction at %d: %v", r.Revision, err)
	}
	return &pb.CompactionResponse{Header: s.header(nil, rev)}, nil
}

// RangeStream (new in etcd 3.7) answers with one chunk: the whole range.
// etcd's own limits for it are kept: no custom sort order, no revision
// filters.
func (k *kvServer) RangeStream(r *pb.RangeRequest, stream pb.KV_RangeStreamServer) error {
	if err := core.CheckRange(r); err != nil {
		return err
	}
	if !isDefaultOrdering(r.SortTarget, r.SortOrder) {
		return status.Errorf(codes.Unimplemented, "RangeStream does not support custom sort orders")
	}
	if r.MinModRevision != 0 || r.MaxModRevision != 0 || r.MinCreateRevision != 0 || r.MaxCreateRevision != 0 {
		return status.Errorf(codes.Unimplemented, "RangeStream does not support revision filters")
	}
	resp, err := k.Range(stream.Context(), r)
	if err != nil {
		return err
	}
	return stream.Send(&pb.RangeStreamResponse{RangeResponse: resp})
}

func isDefaultOrdering(t pb.RangeRequest_SortTarget, o pb.RangeRequest_SortOrder) bool {
	return o == pb.RangeRequest_NONE || (t == pb.RangeRequest_KEY && o == pb.RangeRequest_ASCEND)
}

// isTxnReadonly is etcd's txn.IsTxnReadonly.
func isTxnReadonly(r *pb.TxnRequest) bool {
	for _, u := range r.Success {
		if !isOpReadonly(u) {
			return false
		}
	}
	for _, u := range r.Failure {
		if !isOpReadonly(u) {
			return false
		}
	}
	return true
}

func isOpReadonly(u *pb.RequestOp) bool {
	switch v := u.Request.(type) {
	case *pb.RequestOp_RequestDeleteRange, *pb.RequestOp_RequestPut:
		return false
	case *pb.RequestOp_RequestTxn:
		return isTxnReadonly(v.RequestTxn)
	}
	return true
}
