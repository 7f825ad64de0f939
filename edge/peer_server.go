package edge

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	edgev1 "github.com/aethermesh/aether/api/edge/v1"
	edgesyncv1 "github.com/aethermesh/aether/api/edgesync/v1"
	"github.com/aethermesh/aether/edge/internal/core"
)

// peerServer serves aether.edgesync.v1 on the listen peer URLs.
type peerServer struct {
	g         *grpc.Server
	listeners []net.Listener
	wg        sync.WaitGroup
}

// servePeers listens on every listen peer URL. With https URLs the peer
// TLS config is the server's TLS (it asks for client certificates when the
// config does: --peer-client-cert-auth). A peer URL serves only the sync
// protocol; etcd's raft transport is not there.
func (y *syncer) servePeers() error {
	cfg := y.s.cfg
	if len(cfg.ListenPeerURLs) == 0 {
		return nil
	}
	secure := cfg.ListenPeerURLs[0].Scheme == "https"
	for _, u := range cfg.ListenPeerURLs[1:] {
		if (u.Scheme == "https") != secure {
			return fmt.Errorf("edge: listen peer URLs mix http and https (%s)", u.String())
		}
	}
	opts := []grpc.ServerOption{
		// Peers are members of the cluster: a batch is bounded by the
		// sender (syncBatchBytes, or one change of at most the request
		// limit), not by a client-facing limit.
		grpc.MaxRecvMsgSize(math.MaxInt32),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 10 * time.Second, Timeout: 5 * time.Second}),
		grpc.WaitForHandlers(true),
	}
	if secure {
		if cfg.PeerTLS == nil {
			return errNoPeerTLS
		}
		tc := cfg.PeerTLS.Clone()
		tc.NextProtos = []string{"h2"}
		opts = append(opts, grpc.Creds(credentials.NewTLS(tc)))
	}
	ps := &peerServer{g: grpc.NewServer(opts...)}
	edgesyncv1.RegisterEdgeSyncServer(ps.g, &pushServer{y: y})
	y.ps = ps
	for _, u := range cfg.ListenPeerURLs {
		l, err := net.Listen("tcp", u.Host)
		if err != nil {
			return fmt.Errorf("edge: listen on peer URL %s: %w", u.String(), err)
		}
		ps.listeners = append(ps.listeners, l)
		ps.wg.Add(1)
		go func() {
			defer ps.wg.Done()
			if err := ps.g.Serve(l); err != nil && !isClosedErr(err) {
				y.s.log.Warn("serving peers stopped", "err", err)
			}
		}()
	}
	return nil
}

// stop ends every stream at once (they never end on their own) and waits
// for the handlers.
func (ps *peerServer) stop() {
	ps.g.Stop()
	ps.wg.Wait()
}

// PeerURLs returns the addresses the peer server listens on (":0"
// resolved), one per listen peer URL.
func (s *Server) PeerURLs() []string {
	if s.sync == nil || s.sync.ps == nil {
		return nil
	}
	out := make([]string, 0, len(s.sync.ps.listeners))
	for i, l := range s.sync.ps.listeners {
		out = append(out, s.cfg.ListenPeerURLs[i].Scheme+"://"+l.Addr().String())
	}
	return out
}

// pushServer is the receiving side of Push.
type pushServer struct {
	edgesyncv1.UnimplementedEdgeSyncServer
	y *syncer
}

func (h *pushServer) Push(stream edgesyncv1.EdgeSync_PushServer) error {
	y, s := h.y, h.y.s
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	hello := first.GetHello()
	switch {
	case hello == nil:
		return status.Error(codes.InvalidArgument, "edgesync: the first message of a push stream must be a hello")
	case hello.GetVersion() != syncVersion:
		return status.Errorf(codes.FailedPrecondition, "edgesync: protocol version %d, this replica speaks %d", hello.GetVersion(), syncVersion)
	case hello.GetClusterId() != s.clusterID:
		return status.Errorf(codes.FailedPrecondition, "edgesync: sender is of cluster %x, this replica of %x", hello.GetClusterId(), s.clusterID)
	}
	// Only members push: their names label the metrics, so the label set
	// stays the cluster's.
	name := ""
	for _, m := range s.members {
		if m.id == hello.GetMemberId() {
			name = m.name
		}
	}
	if name == "" || hello.GetMemberId() == s.memberID {
		return status.Errorf(codes.PermissionDenied, "edgesync: sender %x is not another member of this cluster", hello.GetMemberId())
	}
	if err := s.checkPeerValueMerge(stream.Context(), name); err != nil {
		s.log.Warn("refusing a peer's sync stream", "peer", name, "err", err)
		return err
	}
	if err := stream.Send(&edgesyncv1.Ack{MemberId: s.memberID, Vector: y.log.durableVector().proto()}); err != nil {
		return err
	}
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		y.metrics.changesRecv.WithLabelValues(name).Add(float64(len(req.GetChanges())))
		y.metrics.bytesRecv.WithLabelValues(name).Add(float64(proto.Size(req)))
		n, err := s.mergeChanges(stream.Context(), y.byID[hello.GetMemberId()], req.GetChanges())
		if err != nil {
			s.log.Warn("merging changes from a peer failed", "peer", name, "merged", n, "err", err)
			if errors.Is(err, core.ErrMissingParents) {
				return status.Errorf(codes.FailedPrecondition, "edgesync: %v", err)
			}
			return togRPC(err)
		}
		ack := &edgesyncv1.Ack{MemberId: s.memberID, Vector: y.log.durableVector().proto(), Probe: req.GetProbe(), Applied: uint64(n)}
		if err := stream.Send(ack); err != nil {
			return err
		}
	}
}

// mergeChanges applies changes from a peer, in the order given, each
// through core.Merge and the committer (the path of local writes), and
// returns once they are durable: how many were new here. A change already
// held is skipped. On an error the changes before it stay applied. from,
// when this replica also pushes to the sender, learns that the sender
// holds each change, before it is durable here (so it is never echoed).
func (s *Server) mergeChanges(ctx context.Context, from *peer, encs [][]byte) (int, error) {
	if err := s.failure(); err != nil {
		return 0, err
	}
	var (
		b    *batch
		n    int
		merr error
	)
	s.mu.Lock()
	now := s.now()
	for _, enc := range encs {
		// Held already: skip it without decoding (the usual duplicate is a
		// change that reached us through another peer first).
		if r, seq, ok := s.sync.log.position(sha256.Sum256(enc)); ok {
			if from != nil {
				from.noteHeard(r, seq)
			}
			continue
		}
		ap, err := s.st.Merge(now, enc)
		if err != nil {
			merr = err
			break
		}
		if ap == nil {
			continue
		}
		if from != nil {
			from.noteHeard(ap.Change.Replica, s.sync.log.nextSeq(ap.Change.Replica))
		}
		b = s.commit.add(ap)
		n++
	}
	if b == nil {
		// Nothing new, but what was skipped may still be on its way to
		// disk: the ack must not claim it early.
		b = s.commit.last()
	}
	s.mu.Unlock()
	if from != nil {
		s.sync.kick() // what the sender holds (noteHeard) grew
	}
	if err := b.wait(ctx); err != nil {
		return n, err
	}
	return n, merr
}

// peerStatus answers ReplicationStatus: for each peer, which of hashes it
// is known to hold (its acked vector covers the change's place in its
// author's chain). A hash this replica does not hold is reported held by
// no one.
func (y *syncer) peerStatus(hashes [][]byte) []*edgev1.PeerStatus {
	type pos struct {
		r   core.ReplicaID
		seq uint64
		ok  bool
	}
	ps := make([]pos, len(hashes))
	for i, h := range hashes {
		var id core.Hash
		copy(id[:], h)
		ps[i].r, ps[i].seq, ps[i].ok = y.log.position(id)
	}
	mine := y.log.durableVector()
	out := make([]*edgev1.PeerStatus, 0, len(y.peers))
	for _, p := range y.peers {
		st := p.state()
		has := make([]bool, len(hashes))
		for i, q := range ps {
			has[i] = q.ok && st.holds(q.r, q.seq)
		}
		var last int64
		if !st.lastSync.IsZero() {
			last = st.lastSync.UnixNano()
		}
		out = append(out, &edgev1.PeerStatus{MemberId: p.m.id, Name: p.m.name, Has: has, LastSyncUnixNano: last,
			Connected: st.connected, ChangesBehind: mine.lacks(st.acked)})
	}
	return out
}
