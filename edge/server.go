// Package edge is the server of `aether edge`: one replica of the edge store
// speaking etcd's v3 gRPC API with etcd's own, unchanged protos
// (go.etcd.io/etcd/api/v3/etcdserverpb), so unmodified etcd clients, etcdctl
// and etcd's test suite work against it.
//
// The package is the shell around two others: edge/internal/core, the pure
// state machine (the change DAG, the MVCC index, leases), and
// edge/internal/storage, the only code that touches disk. The shell owns
// everything with time, sockets and goroutines:
//
//   - One state lock (Server.mu) serialises every use of the core. A write
//     applies in the core under the lock and is handed, still under the lock,
//     to the committer, so the committer sees changes in apply-index order.
//   - Group commit: the committer goroutine takes every change applied since
//     its last write and persists them with one storage.Append (one frame
//     of the write-ahead log, one fdatasync; the bbolt file follows off the
//     acknowledgement path). A write is acknowledged only when its batch is
//     durable. A plain Range reads at the newest durable revision; any other
//     read that may have seen a change not yet durable waits for that
//     change's batch. So no response ever shows state, or a revision, that
//     a crash could take back (etcd's durability guarantee).
//   - Watchers are fed by the committer after durability, in revision order,
//     one change at a time (watch.go).
//   - Lease expiry is a timer set to core.NextLeaseExpiry; expired leases
//     become changes through the same commit path (lease.go).
//
// gRPC and HTTP/1 (/metrics, /health) share each client port, as etcd's do:
// see serve.go for how connections are told apart. Besides etcd's KV,
// Watch, Lease, Maintenance, Cluster and Auth services the port serves
// etcd's Lock and Election services (lockelect.go) and the edge store's own
// aether.edge.v1.Edge (ext.go). Replicas sync on the peer URLs: see sync.go.
package edge

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/aethermesh/aether/edge/internal/core"
	"github.com/aethermesh/aether/edge/internal/storage"
)

// Defaults taken from etcd v3.7.3 (server/v3/embed/config.go).
const (
	// DefaultMaxRequestBytes is etcd's --max-request-bytes default (1.5 MiB).
	DefaultMaxRequestBytes = 1536 * 1024
	// DefaultMaxTxnOps is etcd's --max-txn-ops default.
	DefaultMaxTxnOps = 128
	// grpcOverheadBytes is what etcd allows on top of MaxRequestBytes for the
	// gRPC receive limit and the watch fragment size
	// (server/v3/config/config.go).
	grpcOverheadBytes = 512 * 1024
	// defaultProgressNotifyInterval is etcd's default watch progress
	// notification interval; minProgressNotifyInterval is its floor.
	defaultProgressNotifyInterval = 10 * time.Minute
	minProgressNotifyInterval     = 100 * time.Millisecond
	// raftTerm fills every header's raft_term and Status' raft_term. There
	// is no election in the edge store, so the term never changes; clients
	// only require it to be non-decreasing.
	raftTerm = 1
)

// Config configures one edge replica. Field names follow etcd's flags; the
// `aether edge` command builds it from them.
type Config struct {
	Name, DataDir                                                            string
	ListenClientURLs, AdvertiseClientURLs, ListenPeerURLs, AdvertisePeerURLs []url.URL
	// InitialCluster maps a member name to its peer URLs
	// (--initial-cluster). Empty means this member alone, at its advertised
	// peer URLs.
	InitialCluster                           map[string][]url.URL
	InitialClusterState, InitialClusterToken string
	ClientTLS, PeerTLS                       *tls.Config // nil = plaintext
	MaxRequestBytes                          int         // 0 = DefaultMaxRequestBytes
	MaxTxnOps                                int         // 0 = DefaultMaxTxnOps
	Logger                                   *slog.Logger
	Now                                      func() time.Time // nil = time.Now
	// WatchProgressNotifyInterval is etcd's
	// --watch-progress-notify-interval: how often a watcher created with
	// progress_notify hears the revision when it had no events. 0 means
	// etcd's default (10 minutes); values under 100ms are raised to 100ms
	// as etcd does.
	WatchProgressNotifyInterval time.Duration
	// SyncPeers names the members this replica syncs with (sync.go); empty
	// means every other member of the initial cluster.
	SyncPeers []string
	// SyncInterval is the anti-entropy probe interval; 0 means
	// DefaultSyncInterval.
	SyncInterval time.Duration
	// DisableHistoryGC turns off GC of the history (gc.go): by default the
	// sync log below the stable point, what every peer holds, is dropped,
	// so memory stays bounded under sustained writes. Off, the log keeps
	// every change ever applied (`aether edge --history-gc=false`: the
	// baseline the history benchmark compares with, and tests that read
	// the whole history).
	DisableHistoryGC bool
	// PeerRetention is how long a peer may go unheard before it stops
	// holding GC back (gc.go); 0 means forever. A peer that returns
	// lacking what GC dropped is refused.
	PeerRetention time.Duration
	// QuotaBackendBytes is etcd's --quota-backend-bytes: 0 means etcd's
	// default (2 GiB), negative no quota. See quota.go for what it bounds.
	QuotaBackendBytes int64
	// AutoCompactionMode and AutoCompactionRetention are etcd's
	// --auto-compaction-mode ("periodic", the default, or "revision") and
	// --auto-compaction-retention (a duration in periodic mode, a count of
	// revisions in revision mode, as time.Duration(count) the way etcd
	// passes it); a zero retention compacts nothing (autocompact.go).
	AutoCompactionMode      string
	AutoCompactionRetention time.Duration
	// CheckpointChanges and CheckpointBytes: a checkpoint (checkpoint.go)
	// is written once this many changes, or this many bytes of encoded
	// changes, became durable since the last one. 0 means the default
	// (DefaultCheckpointChanges, DefaultCheckpointBytes); negative turns
	// that trigger off (both off: the log is kept whole and replayed whole).
	CheckpointChanges int
	CheckpointBytes   int64
	// ValueMerge is how concurrent writes of a value merge: "bytes" (or
	// empty; whole-value last writer wins) or "json" (every key merges as
	// a JSON document, field by field: edge/internal/core/merge_json.go).
	// ValueMergePrefixes, with "bytes", names the key prefixes that merge
	// as JSON. Every replica must be configured alike (valuemerge.go).
	ValueMerge         string
	ValueMergePrefixes []string
	// PeerCommitDelay is how long a batch holding only changes merged
	// from peers may wait for more before it is persisted, counted from
	// the previous batch (commit.go): a peer's ack, this replica's
	// watchers and its reads (which serve the newest durable revision)
	// see such changes up to this much later, in exchange for far fewer
	// fsyncs. 0 means DefaultPeerCommitDelay; negative, no wait.
	PeerCommitDelay time.Duration
	// EnablePprof is etcd's --enable-pprof: Go's runtime profiles at
	// /debug/pprof/ on the client URLs. Off by default, as in etcd: a
	// CPU profile or trace costs the server while it runs, and anyone
	// who can reach the client URLs could start one.
	EnablePprof bool

	// peerDial, for tests, maps a member name to the host:port its sync
	// stream dials instead of its peer URL's host, so a test can put a
	// fault proxy on each directed link (partition_test.go) while every
	// replica agrees on the initial cluster (member ids derive from it).
	peerDial map[string]string
	// onApplied, for tests, sees every change the replica applies (state
	// lock held, index order): the model checks need the whole history,
	// which history GC drops from the sync log.
	onApplied func(*core.Applied)
	// beforeMergeCheckpoint, for tests, is called when a merged snapshot
	// standing for v is applied to the state and about to be checkpointed
	// (state lock held): what peers are told at that moment must not
	// include it yet.
	beforeMergeCheckpoint func(s *Server, v vector)
}

// historyGC reports whether GC of the history is on (the default).
func (c *Config) historyGC() bool { return !c.DisableHistoryGC }

// Server is one running edge replica.
type Server struct {
	cfg    Config
	log    *slog.Logger
	now    func() time.Time
	reg    *prometheus.Registry
	store  *storage.Log
	commit *committer
	ckpt   *checkpointer // checkpoint.go
	hub    *hub
	// autoCompact is etcd's compactor when a retention is set.
	autoCompact *autoCompactor
	metrics     *serverMetrics
	sync        *syncer // replication (sync.go)

	memberID, clusterID uint64
	members             []member
	reqID               *reqIDGen
	maxRequestBytes     int
	maxTxnOps           int
	progressInterval    time.Duration
	valueMerge          core.ValueMerge

	// mu is the state lock: every use of st holds it (reads: RLock).
	mu sync.RWMutex
	st *core.State

	// quota (bytes, <0: none), the retained history it bounds, and the
	// alarms (quota.go).
	quota     int64
	quotaUsed atomic.Int64
	alarms    alarmSet

	// compactionHashes: see maintenance.go (HashKV).
	hashMu           sync.Mutex
	compactionHashes []compactionHash

	// compactMu orders compactions so the revision persisted last is the
	// highest one.
	compactMu sync.Mutex

	// failed holds the first storage error: from then on the in-memory state
	// is ahead of the disk and nothing more may be acknowledged.
	failed atomic.Pointer[error]
	ready  atomic.Bool

	leaseKick chan struct{}
	// leaseDeadline is when (Config.Now's unix nanos) the expiry timer
	// fires; a grant expiring earlier re-arms it.
	leaseDeadline atomic.Int64
	// closing is closed when Close starts: streams (watch, keepalive) end
	// on it so a graceful stop does not wait for them forever.
	closing chan struct{}

	// inproc is the in-process client the Lock and Election services use.
	inproc *clientv3.Client

	listeners []net.Listener
	grpc      *grpc.Server
	http      []*http.Server
	serveWG   sync.WaitGroup // accept loops
	wg        sync.WaitGroup // lease loop, watch receivers
	loopCtx   context.Context
	stopLoops context.CancelFunc
	closeOnce sync.Once
	closeErr  error
}

// Start recovers the replica from cfg.DataDir (storage.Load, core.Replay,
// the persisted compaction, lease promotion), then listens on every client
// URL. It returns when the server is ready to serve.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s := &Server{
		cfg:              cfg,
		log:              cfg.Logger,
		now:              cfg.Now,
		reg:              prometheus.NewRegistry(),
		maxRequestBytes:  cfg.MaxRequestBytes,
		maxTxnOps:        cfg.MaxTxnOps,
		progressInterval: cfg.WatchProgressNotifyInterval,
		quota:            quotaLimit(cfg.QuotaBackendBytes),
		leaseKick:        make(chan struct{}, 1),
		closing:          make(chan struct{}),
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.maxRequestBytes <= 0 {
		s.maxRequestBytes = DefaultMaxRequestBytes
	}
	if s.maxTxnOps <= 0 {
		s.maxTxnOps = DefaultMaxTxnOps
	}
	switch {
	case s.progressInterval <= 0:
		s.progressInterval = defaultProgressNotifyInterval
	case s.progressInterval < minProgressNotifyInterval:
		s.log.Warn("adjusting watch progress notify interval to minimum period", "min", minProgressNotifyInterval)
		s.progressInterval = minProgressNotifyInterval
	}
	if cfg.DataDir == "" {
		return nil, errors.New("edge: data dir is required")
	}
	if len(cfg.ListenClientURLs) == 0 {
		return nil, errors.New("edge: at least one listen client URL is required")
	}

	var err error
	if s.valueMerge, err = valueMergeOf(cfg); err != nil {
		return nil, err
	}
	s.metrics = newServerMetrics(s)
	s.sync = newSyncer(s)
	if s.members, err = clusterMembers(cfg); err != nil {
		return nil, err
	}
	if s.store, err = storage.Open(cfg.DataDir); err != nil {
		return nil, fmt.Errorf("edge: open storage in %s: %w", cfg.DataDir, err)
	}
	if err := s.recover(ctx); err != nil {
		return nil, errors.Join(err, s.store.Close())
	}
	s.reqID = newReqIDGen(s.memberID, s.now())
	s.hub = newHub(s, s.st.Rev())
	s.ckpt = newCheckpointer(s)
	lazy := cfg.PeerCommitDelay
	if lazy == 0 {
		lazy = DefaultPeerCommitDelay
	}
	s.commit = newCommitter(s, lazy)
	s.loopCtx, s.stopLoops = context.WithCancel(context.Background())
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		s.leaseLoop(s.loopCtx)
	}()
	go func() {
		defer s.wg.Done()
		s.ckpt.run(s.loopCtx)
	}()

	if err := s.serve(); err != nil {
		return nil, errors.Join(err, s.Close(context.Background()))
	}
	if s.autoCompact, err = s.startAutoCompaction(cfg.AutoCompactionMode, cfg.AutoCompactionRetention); err != nil {
		return nil, errors.Join(err, s.Close(context.Background()))
	}
	if err := s.sync.start(); err != nil {
		return nil, errors.Join(err, s.Close(context.Background()))
	}
	s.ready.Store(true)
	// Clients and peers may already be writing: read under the lock.
	s.mu.RLock()
	rev := s.st.Rev()
	s.mu.RUnlock()
	s.log.Info("ready to serve client requests", "name", cfg.Name, "member-id", fmt.Sprintf("%x", s.memberID),
		"cluster-id", fmt.Sprintf("%x", s.clusterID), "revision", rev, "client-urls", s.ClientURLs())
	return s, nil
}

// recover rebuilds the core from the log: every stored change is replayed
// with its original index and revision, so revisions and change hashes are
// the ones acknowledged before the restart.
func (s *Server) recover(ctx context.Context) error {
	ids, err := s.identity()
	if err != nil {
		return err
	}
	s.memberID, s.clusterID = ids[0], ids[1]
	if err := s.loadAlarms(); err != nil {
		return err
	}
	if err := s.checkValueMergeMeta(); err != nil {
		return err
	}
	cp, fromCheckpoint, err := s.store.LastCheckpoint()
	if err != nil {
		return fmt.Errorf("edge: %w", err)
	}
	if fromCheckpoint {
		if err := s.restoreCheckpoint(cp); err != nil {
			return fmt.Errorf("edge: recover from %s: %w", s.cfg.DataDir, err)
		}
	} else {
		s.st = core.New(core.ReplicaID(s.memberID))
	}
	s.st.SetMaxTxnOps(s.maxTxnOps)
	s.st.SetValueMerge(s.valueMerge)
	n := 0
	compacted, err := s.store.Load(func(r storage.Record) error {
		n++
		// A long replay still answers to the caller's deadline.
		if n%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		// A record the checkpoint covers is in the restored state; the
		// sync log still needs it (checkpoint.go).
		if !fromCheckpoint || r.Index > cp.Index {
			if err := s.st.Replay(r.Change, r.Index, r.Rev); err != nil {
				return fmt.Errorf("replay change %d (rev %d): %w", r.Index, r.Rev, err)
			}
		}
		return s.sync.log.addRecovered(r.Index, r.ID, r.Change)
	})
	if err != nil {
		return fmt.Errorf("edge: recover from %s: %w", s.cfg.DataDir, err)
	}
	// A checkpoint may hold a compaction not yet persisted (that waits for
	// the changes up to it to be durable), and one persisted after the
	// checkpoint is past the snapshot's.
	//
	// A compaction is persisted only after the changes up to it are
	// durable, so it never exceeds the recovered revision; clamp anyway
	// rather than refuse to start.
	if rev := s.st.Rev(); compacted > rev {
		s.log.Warn("persisted compaction is past the recovered revision; clamping", "compacted", compacted, "revision", rev)
		compacted = rev
	}
	// No compaction stored reads as 0: compacting at 0 would turn etcd's
	// "nothing compacted" (-1) into 0, which HashKV and watches report.
	if compacted > 0 && compacted > s.st.CompactRev() {
		if err := s.st.Compact(compacted); err != nil {
			return fmt.Errorf("edge: restore compaction at %d: %w", compacted, err)
		}
	}
	// etcd's behaviour after a restart: every lease gets its full TTL again,
	// since the time the server was down must not expire them.
	s.st.PromoteLeases(s.now())
	s.recountQuota()
	s.log.Info("recovered", "changes", n, "checkpoint", cp.Index, "revision", s.st.Rev(), "index", s.st.Index(), "compacted", s.st.CompactRev())
	return nil
}

const (
	metaMemberID  = "member-id"
	metaClusterID = "cluster-id"
)

// identity returns the member and cluster ids: the persisted ones, or, on
// first start, the ones etcd derives from the initial cluster (persisted
// then, so a later change of flags cannot change who this member is).
func (s *Server) identity() ([2]uint64, error) {
	var ids [2]uint64
	for i, k := range []string{metaMemberID, metaClusterID} {
		v, err := s.store.Meta(k)
		if err != nil {
			return ids, fmt.Errorf("edge: read %s: %w", k, err)
		}
		if len(v) == 8 {
			ids[i] = binary.BigEndian.Uint64(v)
		}
	}
	if ids[0] != 0 && ids[1] != 0 {
		return ids, nil
	}
	self, ok := findMember(s.members, s.cfg.Name)
	if !ok {
		return ids, fmt.Errorf("edge: member %q is not in the initial cluster", s.cfg.Name)
	}
	ids = [2]uint64{self.id, clusterID(s.members)}
	for i, k := range []string{metaMemberID, metaClusterID} {
		if err := s.store.SetMeta(k, binary.BigEndian.AppendUint64(nil, ids[i])); err != nil {
			return ids, fmt.Errorf("edge: persist %s: %w", k, err)
		}
	}
	return ids, nil
}

// progressTicker ticks at the watch progress interval plus up to a tenth of
// it as jitter, as etcd does, so watchers created together do not all
// report at once.
func (s *Server) progressTicker() *time.Ticker {
	return time.NewTicker(s.progressInterval + rand.N(s.progressInterval/10+1))
}

// ClientURLs returns the URLs the server actually listens on (a ":0" port
// resolved), one per listen client URL.
func (s *Server) ClientURLs() []string {
	out := make([]string, 0, len(s.listeners))
	for i, l := range s.listeners {
		scheme := s.cfg.ListenClientURLs[i].Scheme
		if scheme == "" {
			scheme = "http"
		}
		out = append(out, scheme+"://"+l.Addr().String())
	}
	return out
}

// Registry is the server's own Prometheus registry (no global state), served
// at /metrics.
func (s *Server) Registry() *prometheus.Registry { return s.reg }

// Ready reports whether the server serves requests: started, not closing,
// and storage healthy. /health reports it.
func (s *Server) Ready() bool { return s.ready.Load() && s.failed.Load() == nil }

// MemberID is this member's id (etcd's derivation; see members.go).
func (s *Server) MemberID() uint64 { return s.memberID }

// ClusterID is the cluster's id (etcd's derivation).
func (s *Server) ClusterID() uint64 { return s.clusterID }

// Close stops serving (in-flight RPCs get until ctx ends to finish), then
// drains the committer, stops the lease loop and closes storage. Every
// goroutine the server started has ended when it returns.
func (s *Server) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		s.ready.Store(false)
		if s.autoCompact != nil {
			s.autoCompact.stop()
		}
		close(s.closing)
		var errs []error
		if s.grpc != nil {
			done := make(chan struct{})
			go func() { s.grpc.GracefulStop(); close(done) }()
			select {
			case <-done:
			case <-ctx.Done():
				// Streams (watches, keepalives) never end on their own:
				// past the deadline cut them.
				s.grpc.Stop()
				<-done
			}
		}
		if s.sync != nil {
			// Before the committer closes: receivers hand it changes.
			if err := s.sync.close(); err != nil {
				errs = append(errs, fmt.Errorf("edge: close sync: %w", err))
			}
		}
		for _, h := range s.http {
			// The listener may already be closed through cmux by the gRPC
			// server's stop; that is not a failure.
			if err := h.Shutdown(ctx); err != nil && !isClosedErr(err) {
				errs = append(errs, fmt.Errorf("edge: shut down http: %w", err))
				_ = h.Close()
			}
		}
		for _, l := range s.listeners {
			_ = l.Close()
		}
		s.serveWG.Wait()
		if s.inproc != nil {
			// Its watch and keepalive streams are in-process: the gRPC
			// stop does not end them, closing the client does.
			_ = s.inproc.Close()
		}
		if s.stopLoops != nil {
			s.stopLoops()
		}
		s.wg.Wait()
		if s.commit != nil {
			s.commit.close()
		}
		if err := s.store.Close(); err != nil {
			errs = append(errs, fmt.Errorf("edge: close storage: %w", err))
		}
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}
