package replicator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/aethermesh/aether/internal/retry"
)

var (
	// errLeaseLost: the peer no longer has our origin lease (it expired
	// during a partition longer than the TTL); the keys it held are gone.
	errLeaseLost = errors.New("origin lease expired on the peer")
	// errFenced: a Txn found the peer's fence re-claimed since this peer
	// session claimed it.
	errFenced = errors.New("fence on the peer was re-claimed by another replica or session")
	// errCompacted: the local watch could not resume; a full sync follows.
	errCompacted = errors.New("local revision compacted")
	// errSelfPeer: the peer is the local etcd under another address.
	errSelfPeer = errors.New("peer is this region's own etcd")
)

// localError marks a failure on the local side only, after which the mirror
// may resume from its last revision (see the package doc).
type localError struct{ err error }

func (e *localError) Error() string { return "local etcd: " + e.err.Error() }
func (e *localError) Unwrap() error { return e.err }

// fence is the value of FenceKey(origin) on a peer.
type fence struct {
	Rev    int64  `json:"rev"`    // leadership epoch (creation revision of the leader's election key)
	Target string `json:"target"` // the peer region the writer believes this etcd is
	Leader string `json:"leader"` // identity of the writer
}

// peer is the mirror of one peer region. It lives as long as the Replicator;
// its lease and client outlive leaderships within one Run.
type peer struct {
	r        *Replicator
	cfg      Peer
	log      *slog.Logger
	fenceKey string

	cliMu sync.Mutex
	cli   *clientv3.Client

	leaseCh chan struct{} // signalled (non-blocking) when the lease changes

	mu sync.Mutex
	// The origin lease on the peer. refreshed is when the last successful
	// grant or keepalive was sent, so refreshed+leaseTTL is a lower bound
	// of its expiry.
	lease     clientv3.LeaseID
	leaseTTL  time.Duration
	refreshed time.Time
	// sess is the running peer session, so a lost lease can end it.
	sess *sessionRef
	// status
	leading   bool
	reachable bool
	synced    bool
	mirrored  int64
	keys      int64
	fullSyncs uint64
	kaFails   uint64
	lastErr   string
	lastErrAt time.Time
}

type sessionRef struct {
	lease  clientv3.LeaseID
	cancel context.CancelCauseFunc
}

func newPeer(r *Replicator, cfg Peer) *peer {
	return &peer{
		r:        r,
		cfg:      cfg,
		log:      r.log.With("peer", cfg.Region),
		fenceKey: FenceKey(r.cfg.Region),
		leaseCh:  make(chan struct{}, 1),
	}
}

// lead runs peer sessions, with backoff between them, until ctx ends or the
// peer shows a newer leader (errDeposed).
func (p *peer) lead(ctx context.Context, ep epoch) error {
	p.begin()
	defer p.end()
	kctx, kcancel := context.WithCancel(ctx)
	var ka sync.WaitGroup
	ka.Go(func() { p.keepAlive(kctx) })
	defer ka.Wait()
	defer kcancel()

	bo := retry.Backoff{Base: 100 * time.Millisecond, Max: min(max(p.r.cfg.LeaseTTL/3, time.Second), 5*time.Second)}
	attempt := 0
	reason := syncStart
	for {
		synced, err := p.session(ctx, ep, reason)
		if ctx.Err() != nil {
			return nil
		}
		if synced {
			attempt = 0
		}
		d := bo.Spread(attempt, jitterPct)
		attempt++
		switch {
		case errors.Is(err, errDeposed):
			p.log.Warn("peer claimed by a newer leader of this region; stepping down", "err", err)
			p.setErr(err)
			return err
		case errors.Is(err, errCompacted):
			reason = syncCompacted
			p.log.Info("local watch cannot resume; full sync follows", "err", err)
		case errors.Is(err, errLeaseLost):
			reason = syncLeaseLost
			p.setErr(err)
			p.log.Warn("origin lease lost on peer; granting a new one and re-syncing", "err", err)
		default:
			reason = syncError
			p.setErr(err)
			p.r.m.mirrorErrors.WithLabelValues(p.cfg.Region).Inc()
			p.log.Warn("peer mirror failed; retrying with a full sync", "err", err, "backoff", d)
		}
		if !retry.Sleep(ctx, d, nil) {
			return nil
		}
	}
}

// session is one peer session: claim the fence, make sure of the lease, full
// sync, then mirror the watch until something fails. It reports whether the
// full sync completed.
func (p *peer) session(ctx context.Context, ep epoch, reason string) (synced bool, err error) {
	sctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// A cause set by the keepalive loop (errLeaseLost) explains the
	// context error an operation then returns.
	defer func() {
		if c := context.Cause(sctx); err != nil && ctx.Err() == nil && c != nil && !errors.Is(c, context.Canceled) {
			err = c
		}
	}()
	cli, err := p.client()
	if err != nil {
		return false, fmt.Errorf("peer client: %w", err)
	}
	fenceRev, err := p.claim(sctx, cli, ep)
	if err != nil {
		return false, err
	}
	lease, err := p.ensureLease(sctx, cli)
	if err != nil {
		return false, err
	}
	p.mu.Lock()
	p.sess = &sessionRef{lease: lease, cancel: cancel}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.sess = nil
		p.mu.Unlock()
	}()
	rev, keys, err := p.fullSync(sctx, cli, lease, fenceRev)
	if err != nil {
		return false, fmt.Errorf("full sync: %w", err)
	}
	p.mu.Lock()
	p.synced, p.mirrored, p.keys = true, rev, keys
	p.fullSyncs++
	p.mu.Unlock()
	p.r.m.fullSyncs.WithLabelValues(p.cfg.Region, reason).Inc()
	p.log.Info("peer in sync", "revision", rev, "keys", keys, "lease", fmt.Sprintf("%x", int64(lease)), "reason", reason)
	return true, p.mirror(sctx, cli, lease, fenceRev, rev)
}

// claim checks the peer is not the local etcd and claims its fence for this
// session, returning the fence's new ModRevision.
func (p *peer) claim(ctx context.Context, cli *clientv3.Client, ep epoch) (int64, error) {
	self := p.r.cfg.Region
	tctx, cancel := context.WithTimeout(ctx, p.r.cfg.RequestTimeout)
	defer cancel()
	resp, err := cli.Txn(tctx).Then(clientv3.OpGet(HomeKey(self)), clientv3.OpGet(p.fenceKey)).Commit()
	if err != nil {
		p.noteRPC(ctx, err)
		return 0, fmt.Errorf("read fence: %w", err)
	}
	p.noteRPC(ctx, nil)
	if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
		return 0, fmt.Errorf("%w: it holds %s (written by %q); refusing to mirror region %s into its own etcd",
			errSelfPeer, HomeKey(self), kvs[0].Value, self)
	}
	var modRev int64
	if kvs := resp.Responses[1].GetResponseRange().GetKvs(); len(kvs) > 0 {
		modRev = kvs[0].ModRevision
		var cur fence
		if err := json.Unmarshal(kvs[0].Value, &cur); err != nil {
			p.log.Warn("unreadable fence on peer; overwriting it", "key", p.fenceKey, "err", err)
		} else {
			switch {
			case cur.Rev > ep.Rev:
				// Normally a successor has taken over. But a local etcd
				// restored from a backup (or rebuilt) rewinds revisions,
				// and then a legitimate leader has the smaller epoch: the
				// local election decides.
				leads, err := p.r.stillLeads(ctx, ep)
				if err != nil {
					return 0, err
				}
				if !leads {
					return 0, fmt.Errorf("%w: fence %s holds epoch %d of %q, ours is %d", errDeposed, p.fenceKey, cur.Rev, cur.Leader, ep.Rev)
				}
				p.log.Warn("fence on peer names a newer epoch than ours, but the local election says we lead (local etcd restored or rebuilt?); taking it over",
					"their_epoch", cur.Rev, "their_leader", cur.Leader, "our_epoch", ep.Rev)
			case cur.Rev == ep.Rev && cur.Target != p.cfg.Region:
				return 0, fmt.Errorf("peers %s and %s are the same etcd (the fence %s written for %s is there); check --peer-etcd",
					cur.Target, p.cfg.Region, p.fenceKey, cur.Target)
			}
		}
	}
	val, _ := json.Marshal(fence{Rev: ep.Rev, Target: p.cfg.Region, Leader: p.r.cfg.Identity})
	tresp, err := cli.Txn(tctx).
		If(clientv3.Compare(clientv3.ModRevision(p.fenceKey), "=", modRev)).
		Then(clientv3.OpPut(p.fenceKey, string(val))).
		Commit()
	if err != nil {
		p.noteRPC(ctx, err)
		return 0, fmt.Errorf("claim fence: %w", err)
	}
	if !tresp.Succeeded {
		return 0, fmt.Errorf("claim fence: %w while claiming", errFenced)
	}
	return tresp.Header.GetRevision(), nil
}

// ensureLease returns a live origin lease on the peer: the one held, if a
// keepalive shows it alive, else a new grant.
func (p *peer) ensureLease(ctx context.Context, cli *clientv3.Client) (clientv3.LeaseID, error) {
	tctx, cancel := context.WithTimeout(ctx, p.r.cfg.RequestTimeout)
	defer cancel()
	if id, _, _ := p.leaseInfo(); id != 0 {
		sent := time.Now()
		resp, err := cli.KeepAliveOnce(tctx, id)
		switch {
		case err == nil:
			p.noteRPC(ctx, nil)
			p.refresh(id, resp.TTL, sent)
			return id, nil
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			p.noteRPC(ctx, nil)
			p.dropLease(id)
		default:
			p.noteRPC(ctx, err)
			return 0, fmt.Errorf("keepalive origin lease %x: %w", int64(id), err)
		}
	}
	sent := time.Now()
	resp, err := cli.Grant(tctx, int64(p.r.cfg.LeaseTTL/time.Second))
	if err != nil {
		p.noteRPC(ctx, err)
		return 0, fmt.Errorf("grant origin lease: %w", err)
	}
	p.noteRPC(ctx, nil)
	p.mu.Lock()
	p.lease, p.leaseTTL, p.refreshed = resp.ID, time.Duration(resp.TTL)*time.Second, sent
	p.mu.Unlock()
	p.signalLease()
	p.log.Info("granted origin lease on peer", "lease", fmt.Sprintf("%x", int64(resp.ID)), "ttl", time.Duration(resp.TTL)*time.Second)
	return resp.ID, nil
}

// keepAlive refreshes the held lease every TTL/3 (sooner after a failure)
// until ctx ends. It runs across peer sessions, so a peer that is briefly
// unreachable keeps its lease if it comes back within the TTL. If the peer
// says the lease is gone, it drops it and ends the session using it.
func (p *peer) keepAlive(ctx context.Context) {
	var failedAt time.Time
	failing := false
	for {
		id, ttl, refreshed := p.leaseInfo()
		var (
			t   *time.Timer
			due <-chan time.Time
		)
		if id != 0 {
			at := refreshed.Add(ttl / 3)
			if failedAt.After(refreshed) {
				at = failedAt.Add(min(ttl/6, time.Second))
			}
			t = time.NewTimer(max(time.Until(at), 0))
			due = t.C
		}
		fired := false
		select {
		case <-ctx.Done():
		case <-p.leaseCh:
		case <-due:
			fired = true
		}
		if t != nil {
			t.Stop()
		}
		if ctx.Err() != nil {
			return
		}
		if !fired {
			continue
		}
		cli := p.existingClient()
		if cli == nil { // not reachable: a lease is only granted through the client
			failedAt = time.Now()
			continue
		}
		sent := time.Now()
		tctx, cancel := context.WithTimeout(ctx, min(ttl/3, p.r.cfg.RequestTimeout))
		resp, err := cli.KeepAliveOnce(tctx, id)
		cancel()
		switch {
		case err == nil:
			p.noteRPC(ctx, nil)
			p.refresh(id, resp.TTL, sent)
			if failing {
				p.log.Info("origin lease keepalive recovered", "lease", fmt.Sprintf("%x", int64(id)))
			}
			failing = false
		case ctx.Err() != nil:
			return
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			p.noteRPC(ctx, nil)
			p.keepaliveFailed()
			p.log.Warn("origin lease expired on peer; its keys are gone there", "lease", fmt.Sprintf("%x", int64(id)))
			p.leaseLost(id)
			failing = false
		default:
			p.noteRPC(ctx, err)
			p.keepaliveFailed()
			failedAt = time.Now()
			if !failing {
				p.log.Warn("origin lease keepalive failed; retrying", "lease", fmt.Sprintf("%x", int64(id)), "err", err)
			} else {
				p.log.Debug("origin lease keepalive failed again", "lease", fmt.Sprintf("%x", int64(id)), "err", err)
			}
			failing = true
		}
	}
}

// commit runs ops on the peer as one Txn fenced on fenceRev. Puts carry
// lease; if the peer says it is gone, the lease is dropped and errLeaseLost
// returned.
func (p *peer) commit(ctx context.Context, cli *clientv3.Client, lease clientv3.LeaseID, fenceRev int64, ops []clientv3.Op) error {
	tctx, cancel := context.WithTimeout(ctx, p.r.cfg.RequestTimeout)
	defer cancel()
	resp, err := cli.Txn(tctx).
		If(clientv3.Compare(clientv3.ModRevision(p.fenceKey), "=", fenceRev)).
		Then(ops...).
		Commit()
	if err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			p.noteRPC(ctx, nil)
			p.leaseLost(lease)
			return fmt.Errorf("%w (lease %x)", errLeaseLost, int64(lease))
		}
		p.noteRPC(ctx, err)
		return fmt.Errorf("peer txn of %d ops: %w", len(ops), err)
	}
	p.noteRPC(ctx, nil)
	if !resp.Succeeded {
		return errFenced
	}
	if h := p.r.hooks.onCommit; h != nil {
		h(p.cfg.Region, len(ops))
	}
	return nil
}

// client returns the peer client, building it on first use.
func (p *peer) client() (*clientv3.Client, error) {
	p.cliMu.Lock()
	defer p.cliMu.Unlock()
	if p.cli == nil {
		cli, err := p.r.cfg.PeerClient(p.cfg)
		if err != nil {
			return nil, err
		}
		p.cli = cli
	}
	return p.cli, nil
}

func (p *peer) existingClient() *clientv3.Client {
	p.cliMu.Lock()
	defer p.cliMu.Unlock()
	return p.cli
}

func (p *peer) closeClient() {
	p.cliMu.Lock()
	defer p.cliMu.Unlock()
	if p.cli != nil {
		_ = p.cli.Close()
		p.cli = nil
	}
}

func (p *peer) signalLease() {
	select {
	case p.leaseCh <- struct{}{}:
	default:
	}
}

func (p *peer) leaseInfo() (clientv3.LeaseID, time.Duration, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lease, p.leaseTTL, p.refreshed
}

func (p *peer) refresh(id clientv3.LeaseID, ttlSeconds int64, sent time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lease == id && sent.After(p.refreshed) {
		p.refreshed = sent
		p.leaseTTL = time.Duration(ttlSeconds) * time.Second
	}
}

func (p *peer) dropLease(id clientv3.LeaseID) {
	p.mu.Lock()
	if p.lease == id {
		p.lease, p.leaseTTL, p.refreshed = 0, 0, time.Time{}
	}
	p.mu.Unlock()
	p.signalLease()
}

// leaseLost drops lease id and ends the peer session that uses it.
func (p *peer) leaseLost(id clientv3.LeaseID) {
	p.dropLease(id)
	p.mu.Lock()
	s := p.sess
	p.mu.Unlock()
	if s != nil && s.lease == id {
		s.cancel(fmt.Errorf("%w (lease %x)", errLeaseLost, int64(id)))
	}
}

func (p *peer) keepaliveFailed() {
	p.mu.Lock()
	p.kaFails++
	p.mu.Unlock()
	p.r.m.keepaliveFailures.WithLabelValues(p.cfg.Region).Inc()
}

// noteRPC records whether the peer answered. A request cut short by ctx
// says nothing about the peer.
func (p *peer) noteRPC(ctx context.Context, err error) {
	if err != nil && ctx.Err() != nil {
		return
	}
	p.mu.Lock()
	p.reachable = err == nil
	p.mu.Unlock()
}

func (p *peer) setErr(err error) {
	p.mu.Lock()
	p.lastErr, p.lastErrAt = err.Error(), time.Now()
	p.mu.Unlock()
}

func (p *peer) begin() {
	p.mu.Lock()
	p.leading, p.synced, p.mirrored, p.keys, p.reachable = true, false, 0, 0, false
	p.mu.Unlock()
}

func (p *peer) end() {
	p.mu.Lock()
	p.leading, p.synced = false, false
	p.mu.Unlock()
}

func (p *peer) setMirrored(rev int64, keyDelta int64) {
	p.mu.Lock()
	if rev > p.mirrored {
		p.mirrored = rev
	}
	p.keys += keyDelta
	p.mu.Unlock()
}

func (p *peer) mirroredRev() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mirrored
}

func (p *peer) status(now time.Time, leading bool, leader string) PeerStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := PeerStatus{
		Region:            p.cfg.Region,
		Endpoints:         append([]string(nil), p.cfg.Endpoints...),
		IsLeader:          leading,
		Leader:            leader,
		FullSyncs:         p.fullSyncs,
		KeepaliveFailures: p.kaFails,
		LastError:         p.lastErr,
		LastErrorAt:       p.lastErrAt,
	}
	if !leading || !p.leading {
		s.IsLeader = false
		return s
	}
	s.Reachable = p.reachable
	s.Synced = p.synced
	s.LeaseID = p.lease
	s.LeaseTTL = p.leaseTTL
	if p.lease != 0 {
		s.LeaseTTLRemaining = max(p.refreshed.Add(p.leaseTTL).Sub(now), 0)
	}
	s.LastMirroredRevision = p.mirrored
	s.KeysMirrored = p.keys
	s.Lag = p.r.head.lag(p.mirrored, now)
	return s
}
