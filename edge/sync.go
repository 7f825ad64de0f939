package edge

// Replication (issue 16, part 1): the peers and the sync protocol.
//
// # Protocol
//
// Replicas talk aether.edgesync.v1 (api/edgesync/v1) over gRPC on their
// peer URLs (--listen-peer-urls), with the peer TLS settings (mTLS when
// the peer TLS config asks for client certificates, as etcd's
// --peer-client-cert-auth). Each replica opens one Push stream to each of
// its peers and sends its changes on it; the peer opens its own stream
// the other way. Peers come from the initial cluster, every other member
// by default (a complete graph), or the members named in Config.SyncPeers.
//
// What a replica lacks is a version-vector difference. A replica's own
// changes form a chain: each local change has the replica's heads as
// parents, and the previous local change is a head or an ancestor of one.
// Changes are applied only in causal order (core.Merge refuses a change
// whose parents are missing), so what a replica holds of any chain is a
// prefix, and "how many of R's changes, for every R" (the vector) is its
// whole history. Each replica numbers every change it applies by its place
// in its author's chain (syncLog); every replica derives the same numbers,
// because they all apply one chain in chain order.
//
// A stream opens with the receiver's durable vector (one round trip); the
// sender then walks its log in its apply order, a topological order of the
// DAG, and sends every change the vector lacks, then every change it
// applies from then on that the peer is not known to hold. That is
// optimistic push and anti-entropy at once, exact whatever the history's
// size (the walk is local; only missing changes cross the network), and
// transitive: a change merged from A is in B's log like B's own, so B sends
// it on to C although A and C are not peers. The alternative, exchanging
// heads and walking back by parents in batches, needs as many round trips
// as the DAG is deep below the common ancestor, and a per-hash "have"
// check; the vector settles it in one.
//
// The pushers never block the write path: a local write only appends to
// the in-memory log (under the state lock it already holds) and, once
// durable, closes a channel. There is no per-peer queue to overflow: a
// peer's cursor in the log is its queue, a slow peer's stream is paced by
// gRPC flow control, and a peer that is down is caught up from its vector
// when it reconnects (with backoff).
//
// Every SyncInterval the sender sends a probe; the receiver answers once
// everything sent before it is durable, with its vector. That is the
// periodic anti-entropy round: a vector short of what was sent (a receiver
// that lost or refused changes) ends the stream, and the next stream starts
// from the receiver's vector again.
//
// # Applying a merged change
//
// The receiver applies a batch under the state lock, change by change,
// through core.Merge, and hands each applied change to the committer, the
// path of local writes: it gets this replica's next index (and revision if
// any of its ops won), is persisted by group commit, reaches watchers as
// ordinary events in revision order, and only then is acknowledged (the ack
// carries the receiver's durable vector). A change already held is skipped
// (its hash is in the log). Merges are not refused by the space quota
// (NOSPACE stops local writes, not convergence).
//
// A sender does not send what the peer is known to hold: the peer's acked
// vector, and the changes the peer itself sent us (noted before they are
// durable here, so they are never echoed back). Two senders catching up
// the same peer at once may still both send a change (at most once each).
// Nor a change the peer authored, and a change authored by neither (a
// relayed one) only once the peer's answer to a probe sent after it was
// durable here shows it still lacks it: in a complete graph each replica
// then receives each change once, from its author, instead of from every
// replica that merged it first (synclog.go, take).
//
// The vector is only as good as the replica's log: a replica whose data
// directory is lost must rejoin under a new name (a new member id), as an
// etcd member would be removed and added, or its new changes would be
// numbered like its lost ones. Its peers refuse it, saying so: a sender
// whose peer answers a hello with fewer of its own changes than it
// reported before (peer.checkNotBack), and a receiver of a snapshot whose
// sender holds fewer of its own changes than the receiver does
// (core.MergeSnapshot).
//
// # Replication status
//
// A change (R, seq) is on peer P iff what P is known to hold (above) has
// R >= seq: ReplicationStatus and WaitReplicated (the extension API),
// `aether edge status` and `aether edge put --replicas k` read that, and the
// lag metrics are the difference between this replica's durable vector and
// it (in changes, and in the age of the oldest change missing).
//
// # Leases
//
// A lease belongs to the replica that granted it: only the granter expires
// or revokes it (core.ExpireLeases), by its own clock, and the expiry is a
// change like any other. Elsewhere the lease, and its keys, stay until that
// change arrives. So while the owner is cut off, the other replicas show
// the lease as granted with no local expiry (LeaseTimeToLive's TTL is
// unbounded there, GrantedTTL the granted one) and its keys as live;
// keepalives must go to the owner (elsewhere they answer lease not found),
// and once the owner expires or revokes it, the revoke reaches the others
// on heal and deletes the keys there as ordinary events.
//
// # The parts built on this
//
//   - Partitions (fault proxy): nothing to add to the protocol; a cut link
//     is a broken or silent stream (gRPC keepalive ends it), and
//     reconnection resumes from the vector.
//   - JSON merge (core/merge_json.go): a JSON key's put op carries a patch
//     instead of the value; the protocol sends changes as before, and the
//     Push stream's metadata carries the value-merge setting, which the
//     receiver checks (valuemerge.go).
//   - GC of causally stable history (gc.go): every ack relays the
//     durable vectors its sender knows of every member (Ack.members), so
//     each replica learns every member's, subset topologies included; the
//     stable point trims the sync log and has the core collect forgotten
//     hashes and tombstones.
//   - A peer behind a GC point (it lacks changes no longer kept, or its
//     changes may name parents its peer collected) is re-bootstrapped by
//     snapshot transfer on the Push stream (snapshot_transfer.go), then
//     pushed to from its new vector as before.

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aethermesh/aether/edge/internal/core"
)

const (
	// DefaultSyncInterval is how often a sender probes each peer (the
	// periodic anti-entropy round) when Config.SyncInterval is 0.
	DefaultSyncInterval = 5 * time.Second
	// DefaultPeerCommitDelay bounds how long changes merged from peers
	// wait for company before their fsync (Config.PeerCommitDelay).
	DefaultPeerCommitDelay = 10 * time.Millisecond
	syncVersion            = 1
	// A batch carries at most this many changes, and this many bytes
	// unless a single change is larger.
	syncBatchChanges = 512
	syncBatchBytes   = 1 << 20
	// Reconnection backoff: the longest a healed link or a restarted peer
	// waits for its stream is about maxBackoff.
	minBackoff = 50 * time.Millisecond
	maxBackoff = time.Second
)

// syncer is the replica's replication: its log, its peers (senders) and
// the peer-URL server (receiver).
type syncer struct {
	s        *Server
	log      *syncLog
	interval time.Duration
	metrics  *syncMetrics
	gcm      *gcMetrics
	// retention is Config.PeerRetention; started is when this replica
	// started, the "last heard" of a peer never heard from (gc.go).
	retention time.Duration
	started   time.Time

	peers []*peer
	byID  map[uint64]*peer

	// stab is every member's reported vectors (gc.go); running is set
	// once start has built it and the peers, so gc (the committer's hook)
	// never sees them half made.
	stab    *stability
	running atomic.Bool
	// collectAt is the highest stable vector seen: what the core is to
	// collect at; collectKick wakes collectLoop.
	collectMu   sync.Mutex
	collectAt   vector
	collectKick chan struct{}

	// waitCh is closed (and replaced) when a peer's known holdings grow
	// (sync_ext.go).
	waitMu sync.Mutex
	waitCh chan struct{}

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	ps     *peerServer
}

func newSyncer(s *Server) *syncer {
	y := &syncer{s: s, log: newSyncLog(s.now), interval: s.cfg.SyncInterval, byID: map[uint64]*peer{}, waitCh: make(chan struct{}),
		retention: s.cfg.PeerRetention, started: s.now(), collectAt: vector{}, collectKick: make(chan struct{}, 1)}
	if y.interval <= 0 {
		y.interval = DefaultSyncInterval
	}
	y.ctx, y.cancel = context.WithCancel(context.Background())
	return y
}

// applied is the committer's hook: a change was applied (state lock held).
func (y *syncer) applied(ap *core.Applied) {
	if err := y.log.addApplied(ap); err != nil {
		// Index order is the committer's invariant; a break is a bug that
		// would make vectors wrong, so say it loudly.
		y.s.log.Error("sync log out of order", "err", err)
	}
}

// durable is the committer's hook: every change up to index is persisted.
// The stable point can move too (this replica's vector is part of it):
// with no peer acking (none configured, or all past the retention) it is
// the only trigger of GC.
func (y *syncer) durable(index uint64) {
	y.log.markDurable(index)
	y.gc()
}

// start serves the peer URLs and starts a sender per peer.
func (y *syncer) start() error {
	y.stab = newStability(y.s.memberID, y.s.members)
	y.metrics = newSyncMetrics(y)
	y.gcm = newGCMetrics(y)
	peers, err := y.s.syncPeers()
	if err != nil {
		return err
	}

	// The peers exist before the peer server serves: its handlers look
	// senders up in byID, which is not written after.
	for _, m := range peers {
		p, err := newPeer(y, m)
		if err != nil {
			return err
		}
		y.peers = append(y.peers, p)
		y.byID[m.id] = p
	}
	if err := y.servePeers(); err != nil {
		return err
	}
	// What the core collected before a restart stays collected: the GC
	// point a hello reports starts there.
	y.s.mu.RLock()
	y.collectAt = vector(y.s.st.Collected()).clone()
	y.s.mu.RUnlock()
	y.running.Store(true)
	y.wg.Add(1)
	go func() {
		defer y.wg.Done()
		y.collectLoop(y.ctx)
	}()
	for _, p := range y.peers {
		y.wg.Add(1)
		go func() {
			defer y.wg.Done()
			p.run(y.ctx)
		}()
	}
	// What was recovered may be stable already (a lone replica).
	y.gc()
	return nil
}

// close stops the senders and the peer server; every goroutine has ended
// when it returns. It runs before the committer closes, so no receiver
// hands it a change afterwards.
func (y *syncer) close() error {
	y.cancel()
	y.wg.Wait()
	var errs []error
	for _, p := range y.peers {
		if err := p.conn.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if y.ps != nil {
		y.ps.stop()
	}
	return errors.Join(errs...)
}

// syncPeers are the members this replica sends to: every other member of
// the initial cluster, or those named in Config.SyncPeers.
func (s *Server) syncPeers() ([]member, error) {
	self := s.cfg.Name
	if self == "" {
		self = "default"
	}
	want := map[string]bool{}
	for _, n := range s.cfg.SyncPeers {
		if _, ok := findMember(s.members, n); !ok {
			return nil, errors.New("edge: sync peer " + n + " is not a member of the initial cluster")
		}
		want[n] = true
	}
	var out []member
	for _, m := range s.members {
		if m.name == self || (len(want) > 0 && !want[m.name]) {
			continue
		}
		out = append(out, m)
	}
	return out, nil
}
