package replicator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/aethermesh/aether/internal/retry"
	"github.com/aethermesh/aether/registry"
)

// jitterPct spreads every retry delay of the replicator within this many
// percent of its exponential step, so that the loops of many replicas or
// peers that failed together do not retry in lockstep, while each still
// waits about the step it backs off by.
const jitterPct = 20

var (
	// errSessionLost: the local election session's lease is gone (local
	// etcd unreachable for longer than SessionTTL, or revoked).
	errSessionLost = errors.New("election session lost")
	// errDeposed: a peer's fence names a newer leadership of this region.
	errDeposed = errors.New("deposed: a newer leader of this region has claimed a peer")
	// errNotLeader: Campaign returned but the election says otherwise (it
	// does that when the session expired while campaigning).
	errNotLeader = errors.New("campaign returned without leadership")
)

// epoch identifies one leadership. Leaders are ordered by the creation
// revision of their election key: every later leader's key was created
// after its predecessor's. That order only holds within one history of the
// local etcd (a restore from backup rewinds it), so a newer epoch seen on a
// peer deposes us only once the local election confirms it (stillLeads).
type epoch struct {
	Rev int64  // creation revision of the leader's election key
	Key string // the leader's election key
}

// Replicator mirrors its region's subtree into peer regions. Build it with
// New and start it with Run.
type Replicator struct {
	cfg    Config
	prefix string // registry.RegionPrefix(cfg.Region)
	log    *slog.Logger
	peers  []*peer
	head   headTracker
	m      *metrics
	hooks  testHooks

	running atomic.Bool

	mu      sync.Mutex
	leading bool
	leader  string // identity of the leader as last observed; ours while leading
}

// testHooks let tests in this package observe internals deterministically.
type testHooks struct {
	onCommit func(peer string, ops int) // after each committed peer Txn
}

// New validates cfg and builds a Replicator. It does not contact etcd.
func New(cfg Config) (*Replicator, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	r := &Replicator{
		cfg:    cfg,
		prefix: registry.RegionPrefix(cfg.Region),
		log:    cfg.Logger.With("component", "replicator", "region", cfg.Region),
	}
	for _, pc := range cfg.Peers {
		pc.Endpoints = append([]string(nil), pc.Endpoints...)
		r.peers = append(r.peers, newPeer(r, pc))
	}
	r.m = newMetrics(r)
	if cfg.Registerer != nil {
		if err := r.m.register(cfg.Registerer); err != nil {
			return nil, fmt.Errorf("replicator: register metrics: %w", err)
		}
	}
	return r, nil
}

// Run takes part in the region's replicator election until ctx ends, and
// mirrors into every peer while it leads. It steps down and campaigns again
// whenever its election session is lost (local etcd unreachable for longer
// than SessionTTL) or a peer shows that a newer leader exists.
//
// When ctx ends it resigns and revokes its local election session, so
// another replica takes over at once, but it leaves the peer leases alone:
// they run out after LeaseTTL unless a successor re-attaches the keys
// first. It returns nil then. It returns an error only if the local client is
// closed. Run may not be called again while it runs.
func (r *Replicator) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("replicator: Run is already running")
	}
	defer r.running.Store(false)
	defer r.closePeerClients()
	r.log.Info("replicator starting", "peers", len(r.peers), "identity", r.cfg.Identity,
		"lease_ttl", r.cfg.LeaseTTL, "session_ttl", r.cfg.SessionTTL, "election", r.cfg.ElectionPrefix)
	bo := retry.Backoff{Base: 100 * time.Millisecond, Max: 2 * time.Second}
	attempt := 0
	for {
		if ctx.Err() != nil {
			r.log.Info("replicator stopped")
			return nil
		}
		if err := r.cfg.Local.Ctx().Err(); err != nil {
			return fmt.Errorf("replicator: local etcd client closed: %w", err)
		}
		led, err := r.term(ctx)
		if ctx.Err() != nil {
			continue
		}
		if led {
			attempt = 0
		}
		d := bo.Spread(attempt, jitterPct)
		attempt++
		r.log.Warn("replicator election term ended; campaigning again", "err", err, "backoff", d)
		retry.Sleep(ctx, d, nil)
	}
}

// term is one election session: campaign, lead until the session or the
// leadership is lost, step down. It reports whether it led.
func (r *Replicator) term(ctx context.Context) (led bool, err error) {
	ttl := int64(r.cfg.SessionTTL / time.Second)
	// Granting here rather than in NewSession keeps the grant abortable by
	// ctx, while the session itself runs on a context that outlives ctx
	// just long enough to resign and revoke cleanly.
	gctx, cancel := context.WithTimeout(ctx, r.cfg.RequestTimeout)
	g, err := r.cfg.Local.Grant(gctx, ttl)
	cancel()
	if err != nil {
		return false, fmt.Errorf("grant election session lease: %w", err)
	}
	sessCtx, sessCancel := context.WithCancel(context.WithoutCancel(ctx))
	defer sessCancel()
	sess, err := concurrency.NewSession(r.cfg.Local, concurrency.WithLease(g.ID), concurrency.WithTTL(int(ttl)), concurrency.WithContext(sessCtx))
	if err != nil {
		r.revoke(g.ID)
		return false, fmt.Errorf("election session: %w", err)
	}
	elec := concurrency.NewElection(sess, r.cfg.ElectionPrefix)
	defer r.endSession(sess, elec)

	obsCtx, obsCancel := context.WithCancel(ctx)
	var obs sync.WaitGroup
	obs.Go(func() { r.observeLeader(obsCtx, sess) })
	defer func() { obsCancel(); obs.Wait() }()

	cctx, ccancel := context.WithCancel(ctx)
	stop := context.AfterFunc(sess.Ctx(), ccancel)
	err = elec.Campaign(cctx, r.cfg.Identity)
	stop()
	ccancel()
	if err != nil {
		if ctx.Err() != nil {
			return false, nil
		}
		select {
		case <-sess.Done():
			return false, errSessionLost
		default:
		}
		return false, fmt.Errorf("campaign: %w", err)
	}
	ep, err := r.verifyLeader(ctx, sess, elec)
	if err != nil {
		return false, err
	}
	return true, r.lead(ctx, sess, ep)
}

// verifyLeader checks that Campaign's success is real: it also returns nil
// when the session expired while it waited and the keys before ours went
// away. It returns the leadership's epoch.
func (r *Replicator) verifyLeader(ctx context.Context, sess *concurrency.Session, elec *concurrency.Election) (epoch, error) {
	vctx, cancel := context.WithTimeout(ctx, r.cfg.RequestTimeout)
	defer cancel()
	resp, err := elec.Leader(vctx)
	if err != nil {
		return epoch{}, fmt.Errorf("verify leadership: %w", err)
	}
	if string(resp.Kvs[0].Key) != elec.Key() || resp.Kvs[0].CreateRevision != elec.Rev() {
		return epoch{}, errNotLeader
	}
	select {
	case <-sess.Done():
		return epoch{}, errSessionLost
	default:
	}
	return epoch{Rev: elec.Rev(), Key: elec.Key()}, nil
}

// stillLeads asks the local election whether ep is the current leadership.
func (r *Replicator) stillLeads(ctx context.Context, ep epoch) (bool, error) {
	gctx, cancel := context.WithTimeout(ctx, r.cfg.RequestTimeout)
	defer cancel()
	resp, err := r.cfg.Local.Get(gctx, r.cfg.ElectionPrefix+"/", clientv3.WithFirstCreate()...)
	if err != nil {
		return false, fmt.Errorf("check local leadership: %w", err)
	}
	return len(resp.Kvs) > 0 && string(resp.Kvs[0].Key) == ep.Key && resp.Kvs[0].CreateRevision == ep.Rev, nil
}

// lead mirrors into every peer until ctx ends, the session is lost or a
// peer loop finds a newer leader.
func (r *Replicator) lead(ctx context.Context, sess *concurrency.Session, ep epoch) error {
	lctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(sess.Ctx(), func() { cancel(errSessionLost) })
	defer stop()

	r.setLeading(true)
	defer r.setLeading(false)
	r.log.Info("leading region replication", "identity", r.cfg.Identity, "epoch_rev", ep.Rev)

	if err := r.putHome(lctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	r.head.reset()
	var wg sync.WaitGroup
	wg.Go(func() { r.trackHead(lctx, r.minMirrored) })
	for _, p := range r.peers {
		wg.Go(func() {
			if err := p.lead(lctx, ep); errors.Is(err, errDeposed) {
				cancel(err)
			}
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return nil
	}
	err := context.Cause(lctx)
	r.log.Warn("stepping down", "err", err)
	return err
}

// putHome marks the local etcd as this region's home (see HomeKey).
func (r *Replicator) putHome(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(ctx, r.cfg.RequestTimeout)
	defer cancel()
	if _, err := r.cfg.Local.Put(pctx, HomeKey(r.cfg.Region), r.cfg.Identity); err != nil {
		return fmt.Errorf("mark local etcd as home of region %s: %w", r.cfg.Region, err)
	}
	return nil
}

// endSession resigns (if leading) and revokes the local election session so
// that a successor need not wait out its TTL. It skips both when the local
// client is closed: that is a crash as far as the election is concerned.
func (r *Replicator) endSession(sess *concurrency.Session, elec *concurrency.Election) {
	sess.Orphan()
	if r.cfg.Local.Ctx().Err() != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.RequestTimeout)
	defer cancel()
	if err := elec.Resign(ctx); err != nil {
		r.log.Debug("resign", "err", err)
	}
	r.revoke(sess.Lease())
}

func (r *Replicator) revoke(id clientv3.LeaseID) {
	if r.cfg.Local.Ctx().Err() != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.RequestTimeout)
	defer cancel()
	if _, err := r.cfg.Local.Revoke(ctx, id); err != nil {
		r.log.Debug("revoke election session lease", "lease", fmt.Sprintf("%x", int64(id)), "err", err)
	}
}

// observeLeader keeps r.leader current for Status while the session lives.
func (r *Replicator) observeLeader(ctx context.Context, sess *concurrency.Session) {
	e := concurrency.NewElection(sess, r.cfg.ElectionPrefix)
	for ctx.Err() == nil {
		for resp := range e.Observe(ctx) {
			if len(resp.Kvs) > 0 {
				r.mu.Lock()
				r.leader = string(resp.Kvs[0].Value)
				r.mu.Unlock()
			}
		}
		retry.Sleep(ctx, 500*time.Millisecond, nil)
	}
}

func (r *Replicator) setLeading(on bool) {
	r.mu.Lock()
	r.leading = on
	if on {
		r.leader = r.cfg.Identity
	}
	r.mu.Unlock()
}

func (r *Replicator) minMirrored() int64 {
	var m int64 = -1
	for _, p := range r.peers {
		if v := p.mirroredRev(); m < 0 || v < m {
			m = v
		}
	}
	return m
}

func (r *Replicator) closePeerClients() {
	for _, p := range r.peers {
		p.closeClient()
	}
}

// PeerStatus is one peer's replication state as this replica sees it. The
// mirror fields are only meaningful while IsLeader; other replicas report
// them zero.
type PeerStatus struct {
	Region    string
	Endpoints []string

	IsLeader bool   // this replica leads its region's replication
	Leader   string // identity of the leader as last observed ("" if unknown)

	// Reachable: the last request to the peer succeeded.
	Reachable bool
	// Synced: a full sync of this peer completed since this replica last
	// became leader and the mirror is running (or resuming) from it.
	Synced bool
	// LeaseID is the origin lease on the peer; LeaseTTL is its granted TTL;
	// LeaseTTLRemaining is a lower bound of the time left, from the last
	// successful keepalive.
	LeaseID           clientv3.LeaseID
	LeaseTTL          time.Duration
	LeaseTTLRemaining time.Duration
	// LastMirroredRevision is the local revision up to which the peer's
	// copy is known to equal the local subtree.
	LastMirroredRevision int64
	// Lag is how long the oldest local change not yet mirrored has been
	// waiting (from when the leader saw it); 0 when caught up.
	Lag time.Duration
	// KeysMirrored is the number of keys of the subtree on the peer as of
	// LastMirroredRevision.
	KeysMirrored int64
	// FullSyncs counts completed full syncs of this peer by this replica.
	FullSyncs         uint64
	KeepaliveFailures uint64
	LastError         string
	LastErrorAt       time.Time
}

// Status reports every peer, in configuration order. It does no I/O.
func (r *Replicator) Status() []PeerStatus {
	r.mu.Lock()
	leading, leader := r.leading, r.leader
	r.mu.Unlock()
	now := time.Now()
	out := make([]PeerStatus, 0, len(r.peers))
	for _, p := range r.peers {
		out = append(out, p.status(now, leading, leader))
	}
	return out
}
