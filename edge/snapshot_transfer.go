package edge

// Snapshot transfer: re-bootstrapping a peer behind a GC point.
//
// A sender cannot catch a peer up from its log when the peer lacks changes
// GC dropped from it (syncLog.behind), and the peer cannot merge the
// sender's changes when they may name parents it collected: the sender
// holds less of some replica than the peer's GC point (the hello ack's
// gc_point), or the peer refused a push for missing parents while it has
// collected history (codes.OutOfRange). Either way a replica came back
// from beyond --peer-retention. Instead of refusing, the sender sends its
// state (core TransferSnapshot: per key the latest value or tombstone
// with its winner, JSON documents, leases, its vector and per replica
// last stamps, heads) in chunks on the Push stream, the last carrying a
// probe and the snapshot's vector, and waits for the probe's ack.
//
// The receiver merges it (core MergeSnapshot, by the conflict rule, one
// new revision) under the state lock once the committer has drained, so
// the merge's events follow every event before them and nothing is
// applied between the merge and its persistence; makes it durable before
// it lets go of the lock (persistTransfer: a checkpoint); marks the
// snapshot's vector as held in its sync log (syncLog.absorb: the changes
// it stands for are trimmed, entries it covers dropped); publishes the
// merge's events to watchers as ordinary events; and acks. The ack's
// vector covers the snapshot's, so the sender's log walk resumes from it
// like after any hello.
//
// Both directions happen when a replica returns: the others send it
// theirs (it lacks what they dropped), and it sends them its own (its
// writes made while away name parents they collected): that is how the
// writes it acknowledged while away survive. What a snapshot cannot carry
// is a deletion already collected everywhere: see gc.go on the retention
// (gc_grace) for what a replica away that long may bring back.
//
// The sender takes its snapshot under the state lock once the committer
// has drained, so the snapshot holds only durable changes and its vector
// is exactly what it stands for: a crash of the sender can never take back
// something a peer was told it has.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	edgesyncv1 "github.com/aethermesh/aether/api/edgesync/v1"
	"github.com/aethermesh/aether/edge/internal/core"
)

// snapshotChunkBytes bounds one snapshot chunk, well below gRPC's message
// limits whatever they are configured to.
const snapshotChunkBytes = syncBatchBytes

// wantsSnapshot reports whether the peer, which answered the hello with
// vector pv and GC point gp, must get a snapshot before changes.
func (p *peer) wantsSnapshot(pv, gp vector) (bool, string) {
	p.mu.Lock()
	asked := p.snapshotAsked
	p.mu.Unlock()
	if asked {
		return true, "the peer refused our changes for parents it collected"
	}
	// A second look at what the peer is known to hold: GC may have
	// trimmed up to a report noted since the caller read them (peer.go).
	if p.y.log.behindErr(pv) != nil && p.y.log.behindErr(p.knownHeld(pv)) != nil {
		return true, "the peer lacks changes this replica's GC dropped"
	}
	if mine := p.y.log.durableVector(); gp.lacks(mine) > 0 {
		return true, "this replica lacks changes below the peer's GC point: its changes may name parents the peer collected"
	}
	return false, ""
}

// noteRefusal records a push refused for parents the peer collected: the
// next stream starts with a snapshot.
func (p *peer) noteRefusal(err error) {
	if status.Code(errors.Unwrap(err)) != codes.OutOfRange && status.Code(err) != codes.OutOfRange {
		return
	}
	p.mu.Lock()
	p.snapshotAsked = true
	p.mu.Unlock()
}

// sendSnapshot sends this replica's transfer snapshot on stream and
// returns the peer's vector once it acked the merge.
func (p *peer) sendSnapshot(stream edgesyncv1.EdgeSync_PushClient, why string) (vector, error) {
	s := p.y.s
	start := time.Now()
	b, v, err := s.transferSnapshot(stream.Context())
	if err != nil {
		return nil, fmt.Errorf("take a snapshot for %s: %w", p.m.name, err)
	}
	p.mu.Lock()
	p.probeSeq++
	id := p.probeSeq
	p.mu.Unlock()
	sent := 0
	for off := 0; ; off += snapshotChunkBytes {
		end := min(off+snapshotChunkBytes, len(b))
		req := &edgesyncv1.PushRequest{Snapshot: &edgesyncv1.SnapshotChunk{Data: b[off:end], Size: uint64(len(b)), Last: end == len(b)}}
		if end == len(b) {
			req.Snapshot.Vector = v.proto()
			req.Probe = id
		}
		if err := stream.Send(req); err != nil {
			return nil, fmt.Errorf("send snapshot to %s: %w", p.m.name, err)
		}
		sent += proto.Size(req)
		if end == len(b) {
			break
		}
	}
	p.y.gcm.snapshotsSent.WithLabelValues(p.m.name).Inc()
	p.y.gcm.snapshotBytesSent.WithLabelValues(p.m.name).Add(float64(sent))
	for {
		ack, err := stream.Recv()
		if err != nil {
			return nil, fmt.Errorf("receive the ack of a snapshot: %w", err)
		}
		p.noteAck(ack)
		if ack.GetProbe() != id {
			continue
		}
		got := vectorOf(ack.GetVector())
		if n := v.lacks(got); n > 0 {
			return nil, fmt.Errorf("peer %s acked a snapshot but lacks %d of its changes", p.m.name, n)
		}
		p.mu.Lock()
		p.snapshotAsked = false
		p.mu.Unlock()
		s.log.Info("sent a state snapshot to a peer behind a GC point", "peer", p.m.name, "why", why,
			"bytes", len(b), "changes", v.sum(), "took", time.Since(start))
		return got, nil
	}
}

// transferSnapshot is this replica's transfer snapshot and the vector it
// stands for, taken once every applied change is durable.
func (s *Server) transferSnapshot(ctx context.Context) ([]byte, vector, error) {
	if err := s.failure(); err != nil {
		return nil, nil, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	// Writers wait for the lock, so once the last batch is durable nothing
	// applied is not.
	if err := s.commit.last().wait(ctx); err != nil {
		return nil, nil, err
	}
	return s.st.TransferSnapshot(), s.sync.log.durableVector(), nil
}

// snapshotBuf gathers the chunks of one snapshot on a receiving stream.
type snapshotBuf struct {
	data []byte
	size uint64
}

// add appends a chunk; the merged snapshot is returned with the last one.
func (sb *snapshotBuf) add(c *edgesyncv1.SnapshotChunk) ([]byte, bool, error) {
	if len(sb.data) == 0 {
		sb.size = c.GetSize()
	}
	if c.GetSize() != sb.size || uint64(len(sb.data)+len(c.GetData())) > sb.size {
		return nil, false, status.Errorf(codes.InvalidArgument, "edgesync: snapshot chunks exceed the snapshot's size %d", sb.size)
	}
	sb.data = append(sb.data, c.GetData()...)
	if !c.GetLast() {
		return nil, false, nil
	}
	if uint64(len(sb.data)) != sb.size {
		return nil, false, status.Errorf(codes.InvalidArgument, "edgesync: snapshot of %d bytes ends at %d", sb.size, len(sb.data))
	}
	b := sb.data
	*sb = snapshotBuf{}
	return b, true, nil
}

// mergeTransfer merges a peer's transfer snapshot standing for v (see
// above) and returns once it is durable and published.
func (s *Server) mergeTransfer(ctx context.Context, name string, from *peer, b []byte, v vector) error {
	if err := s.failure(); err != nil {
		return err
	}
	start := time.Now()
	// The checkpointer's lock before the state lock, as checkpointNow
	// takes them.
	s.ckpt.mu.Lock()
	defer s.ckpt.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.commit.last().wait(ctx); err != nil {
		return err
	}
	ap, err := s.st.MergeSnapshot(s.now(), b)
	if err != nil {
		// Refused whole (the core changes nothing on an error).
		return status.Errorf(codes.InvalidArgument, "edgesync: merge snapshot from %s: %v", name, err)
	}
	// Durable first, then told: the log's vector (what acks and hellos on
	// every stream report, read without the state lock) and the GC point
	// take in the merge only once the checkpoint holding it is on disk. A
	// peer told of the merge before a crash took it back would go on
	// sending from a vector this replica no longer holds, and never send
	// the snapshot it needs again.
	keep, below := s.sync.log.absorbBase(v)
	if f := s.cfg.beforeMergeCheckpoint; f != nil {
		f(s, v)
	}
	if err := s.checkpointLocked(keep, below); err != nil {
		// The core is ahead of the disk and cannot be rolled back: as when
		// the committer fails, stop serving.
		ferr := status.Error(codes.Unavailable, fmt.Sprintf("edge: persisting a merged snapshot failed, the server no longer serves: %v", err))
		s.failed.CompareAndSwap(nil, &ferr)
		s.log.Error("persisting a merged snapshot failed; the server stops serving", "peer", name, "err", err)
		return ferr
	}
	s.sync.log.absorb(v)
	// The merge may have raised the core's collected points (the
	// sender's): the GC point this replica reports follows.
	s.sync.raiseCollectAt(vector(s.st.Collected()))
	if from != nil {
		from.noteHeldVector(v)
	}
	events := 0
	if ap != nil {
		events = len(ap.Events)
		s.quotaUsed.Add(eventsCost(ap.Events))
		s.hub.publish([]*core.Applied{ap})
	}
	s.sync.gcm.snapshotsRecv.WithLabelValues(name).Inc()
	s.sync.gcm.snapshotBytesRecv.WithLabelValues(name).Add(float64(len(b)))
	s.log.Info("merged a state snapshot from a peer: this replica was behind a GC point", "peer", name,
		"bytes", len(b), "changes", v.sum(), "events", events, "revision", s.st.Rev(), "took", time.Since(start))
	return nil
}

// noteHeldVector records that the peer holds everything v counts.
func (p *peer) noteHeldVector(v vector) {
	p.mu.Lock()
	for r, n := range v {
		p.heard[r] = max(p.heard[r], n)
	}
	p.mu.Unlock()
}

// checkpointLocked writes a checkpoint (checkpoint.go) of the state as it
// is, with the checkpointer's lock and the state lock held and every
// applied change durable: after a merged snapshot, whose state no change
// record carries, nothing may be applied, acknowledged or persisted
// before the state it built is durable (a later change's revision and
// effects depend on it, and a peer told of the vector must never see it
// taken back by a crash). So the write happens under the lock, once per
// snapshot transfer. keep and below are the sync log's base and trimmed
// counts as the merge leaves them (syncLog.absorbBase): the log itself
// takes the merge in only after this returns.
func (s *Server) checkpointLocked(keep uint64, below vector) error {
	c := s.ckpt
	start := time.Now()
	c.changes.Store(0)
	c.bytes.Store(0)
	snap := s.st.Snapshot()
	index := s.st.Index()
	if keep == 0 {
		keep = index + 1
	}
	if err := s.writeCheckpoint(start, index, keep, snap, below); err != nil {
		return fmt.Errorf("edge: checkpoint after a snapshot merge: %w", err)
	}
	return nil
}
