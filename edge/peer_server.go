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
	// The GC point tells a sender holding less that its changes may name
	// parents collected here (snapshot_transfer.go).
	hack := &edgesyncv1.Ack{MemberId: s.memberID, Vector: y.log.durableVector().proto(),
		Members: y.stab.relay(s.now()), GcPoint: y.collectPoint().proto()}
	if err := stream.Send(hack); err != nil {
		return err
	}
	return h.receive(stream, name, y.byID[hello.GetMemberId()])
}

// ackQueueLen bounds the pushes applied but not yet acknowledged on one
// stream: past it the receiver stops reading, and gRPC flow control paces
// the sender.
const ackQueueLen = 256

// pending is a push applied here and waiting for its batch to be durable.
type pending struct {
	b     *batch
	probe uint64
	n     int
}

// receive applies each push as it arrives and acknowledges it from a
// second goroutine once durable. Applying does not wait for the previous
// push's fsync: what arrives while a batch is being persisted, on this
// stream and every other, and local writes too, joins the committer's open
// batch, so the next batch makes all of it durable with one WAL append and
// one fdatasync. (Applying one push and then waiting for its fsync before
// reading the next cost every replica one fsync per push it received, and
// a replica with N-1 peers on a disk shared with them fell behind.) Acks
// still follow durability, in order; watchers see the changes when their
// batch is durable, as for local writes.
func (h *pushServer) receive(stream edgesyncv1.EdgeSync_PushServer, name string, from *peer) error {
	y, s := h.y, h.y.s
	queue := make(chan pending, ackQueueLen)
	ackErr := make(chan error, 1)
	// Ending ctx stops the acker even while it waits for a batch: the
	// stream's own context ends only once this handler has returned.
	ctx, cancel := context.WithCancel(stream.Context())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		ackErr <- h.ack(ctx, stream, queue)
	}()
	defer func() {
		cancel()
		wg.Wait()
	}()
	var snap snapshotBuf
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		select {
		case err := <-ackErr:
			// Acknowledging failed (storage failed, or the stream is
			// going): applying more would only queue acks never sent.
			return err
		default:
		}
		y.metrics.bytesRecv.WithLabelValues(name).Add(float64(proto.Size(req)))
		if c := req.GetSnapshot(); c != nil {
			b, last, err := snap.add(c)
			if err != nil {
				return err
			}
			if !last {
				continue
			}
			if err := s.mergeTransfer(ctx, name, from, b, vectorOf(c.GetVector())); err != nil {
				s.log.Warn("merging a snapshot from a peer failed", "peer", name, "err", err)
				return togRPC(err)
			}
			// Durable already: the ack follows those queued before it.
			select {
			case queue <- pending{probe: req.GetProbe()}:
			case err := <-ackErr:
				return err
			}
			continue
		}
		y.metrics.changesRecv.WithLabelValues(name).Add(float64(len(req.GetChanges())))
		b, n, err := s.applyChanges(from, req.GetChanges())
		if err != nil {
			s.log.Warn("merging changes from a peer failed", "peer", name, "merged", n, "err", err)
			if errors.Is(err, core.ErrMissingParents) {
				if y.collectPoint().sum() > 0 {
					// The parents may be hashes collected here: the
					// sender is to send a snapshot (snapshot_transfer.go).
					return status.Errorf(codes.OutOfRange, "edgesync: %v; this replica collected history below its GC point", err)
				}
				return status.Errorf(codes.FailedPrecondition, "edgesync: %v", err)
			}
			return togRPC(err)
		}
		s.metrics.merged.WithLabelValues(name).Add(float64(n))
		select {
		case queue <- pending{b: b, probe: req.GetProbe(), n: n}:
		case err := <-ackErr:
			return err
		}
	}
}

// ack sends the acks of queued pushes once their batches are durable. The
// pushes that are durable by the time one is acknowledged share an ack
// (each probe still gets its own, naming it): the ack carries the durable
// vector, which covers them all.
func (h *pushServer) ack(ctx context.Context, stream edgesyncv1.EdgeSync_PushServer, queue <-chan pending) error {
	s := h.y.s
	for {
		var p pending
		select {
		case p = <-queue:
		case <-ctx.Done():
			return nil
		}
		if err := p.b.wait(ctx); err != nil {
			return err
		}
		probes, applied := []uint64(nil), 0
		add := func(p pending) {
			applied += p.n
			if p.probe != 0 {
				probes = append(probes, p.probe)
			}
		}
		add(p)
	more:
		for {
			select {
			case q := <-queue:
				if err := q.b.wait(ctx); err != nil {
					return err
				}
				add(q)
			default:
				break more
			}
		}
		vec := h.y.log.durableVector().proto()
		members := h.y.stab.relay(s.now())
		if len(probes) == 0 {
			probes = []uint64{0}
		}
		for i, id := range probes {
			a := &edgesyncv1.Ack{MemberId: s.memberID, Vector: vec, Probe: id, Members: members}
			if i == 0 {
				a.Applied = uint64(applied)
			}
			if err := stream.Send(a); err != nil {
				return err
			}
		}
	}
}

// mergeChanges applies changes from a peer (applyChanges) and returns once
// they are durable: how many were new here.
func (s *Server) mergeChanges(ctx context.Context, from *peer, encs [][]byte) (int, error) {
	b, n, err := s.applyChanges(from, encs)
	if werr := b.wait(ctx); werr != nil {
		return n, werr
	}
	return n, err
}

// applyChanges applies changes from a peer, in the order given, each
// through core.Merge and the committer (the path of local writes), in one
// pass under the state lock, and returns the batch to wait on before
// acknowledging them (nil when nothing is on its way to disk) and how many
// were new here. A change already held is skipped. On an error the changes
// before it stay applied (and the batch still covers them). from, when
// this replica also pushes to the sender, learns that the sender holds
// each change, before it is durable here (so it is never echoed).
func (s *Server) applyChanges(from *peer, encs [][]byte) (*batch, int, error) {
	if err := s.failure(); err != nil {
		return nil, 0, err
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
		if r, seq, ok := s.sync.position(sha256.Sum256(enc)); ok {
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
		b = s.commit.addMerged(ap)
		n++
	}
	if b == nil {
		// Nothing new, but what was skipped may still be on its way to
		// disk: the ack must not claim it early.
		b = s.commit.lastLazy()
	}
	s.mu.Unlock()
	if from != nil {
		s.sync.kick() // what the sender holds (noteHeard) grew
	}
	return b, n, merr
}

// position is the (replica, seq) of a change applied here: from the sync
// log, else from the core (changes trimmed from the log but not collected
// by the core). A change the core collected is unknown: causally stable,
// it is older than what every member holding GC reported holding, and its
// hash is gone by design (gc.go); ReplicationStatus reports it held by no
// peer, WaitReplicated NotFound. The caller holds the state lock.
func (y *syncer) position(id core.Hash) (core.ReplicaID, uint64, bool) {
	if r, seq, ok := y.log.position(id); ok {
		return r, seq, true
	}
	return y.s.st.ChainPos(id)
}

// peerStatus answers ReplicationStatus: for each peer, which of hashes it
// is known to hold (its acked vector covers the change's place in its
// author's chain). A hash this replica does not know (position) is
// reported held by no one. The caller holds the state lock.
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
		ps[i].r, ps[i].seq, ps[i].ok = y.position(id)
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
