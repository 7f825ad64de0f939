package edge

// GC of causally stable history (issue 16, part 4).
//
// # Causal stability
//
// A change c is causally stable at replica i when every change i will
// ever receive from now on is causally after c. Then a winner or a
// tombstone c decided can never be beaten by a late arrival, and c's hash
// will never again be named as a parent: the core may forget both
// (core.Collect), and no peer will ever need c from i's sync log.
//
// For each member k of the cluster (every member, not only this replica's
// sync peers) i keeps V_k, the latest durable vector k reported: in k's
// acks to i, or relayed in other members' acks (Ack.members carries every
// report the acking replica knows, so with Config.SyncPeers a subset, a
// report crosses the cluster hop by hop). V_k is *usable* at i when
// V_k[k] <= durable_i[k]: i already holds every change k had made when it
// reported V_k. Then every change i will receive from now on is either
// one of k's later changes, made after k held V_k and so causally after
// everything in it, or a change of another member m, covered the same way
// by m's usable report. So
//
//	stable_i = durable_i ∧ min over the members k holding GC of usable V_k
//
// (a member never heard from counts as zero) is causally stable, and
// causally closed (a minimum of vectors that are). The rule matters when
// a report runs ahead of k's changes: k acks a delete d of ours while its
// own put of the same key, concurrent with d, is still on its way to us.
// The naive minimum of acked vectors already covers d; collecting d's
// tombstone then lets the late put resurrect the key. k's report is not
// usable here until the put arrived (V_k[k] counts it), so d waits
// (TestGCStabilityWaitsForInFlightChange). A newer report that is not
// usable yet is kept (a few per member) and promoted as i catches up on
// k's chain, so a member that writes all the time does not hold the
// stable point at its last quiet moment.
//
// # Collecting
//
// With Config.HistoryGC, after every ack and every durable batch, the sync
// log drops its longest prefix the stable vector covers (syncLog.trim):
// every member holding GC holds it, so no pusher needs it again. The core
// then collects what is stable (core.Collect: forgotten hashes, compacted
// tombstones, JSON field tombstones) at the highest stable vector seen
// (a maximum of causally closed vectors is causally closed, and what was
// stable stays so). Collect runs under the state lock on its own goroutine
// (collectLoop), kicked by gc and coalescing kicks: gc runs on the
// committer's goroutine, which a snapshot merge waits for while holding
// the state lock (snapshot_transfer.go).
//
// # Retention
//
// With Config.PeerRetention, a member not heard of (no report of it,
// direct or relayed, learnt) for longer no longer holds the stable point
// back; nor does a peer still found behind after a snapshot. This is
// Cassandra's gc_grace_seconds: a replica away longer than the retention
// may come back with writes made while away, or holding values, for keys
// whose deletion the others meanwhile collected. Its writes are merged
// (nothing it acknowledged is lost), but a put concurrent with a collected
// delete wins where the tombstone is gone: the key comes back everywhere.
// Keep the retention longer than any partition that must not resurrect
// deleted keys; without it, an absent member holds GC back forever.
//
// A returning member lacking changes the log dropped is re-bootstrapped
// by snapshot transfer (snapshot_transfer.go), not refused.

import (
	"context"
	"sync"
	"time"

	edgesyncv1 "github.com/aethermesh/aether/api/edgesync/v1"
	"github.com/aethermesh/aether/edge/internal/core"
)

// maxPendingReports bounds the newer, not yet usable reports kept per
// member.
const maxPendingReports = 4

// report is a member's durable vector as it reported it. Reports of one
// member only grow (durable vectors never go back), so their sizes order
// them.
type report struct {
	v   vector
	sum uint64
}

// memberReports is what this replica knows of one other member.
type memberReports struct {
	usable  report   // newest usable report (zero: none)
	pending []report // newer ones, not usable yet, oldest first
	newest  report   // newest report known, relayed on
	heard   time.Time
}

// stability tracks every other member's reports (see above).
type stability struct {
	mu      sync.Mutex
	members map[uint64]*memberReports
}

func newStability(self uint64, members []member) *stability {
	st := &stability{members: map[uint64]*memberReports{}}
	for _, m := range members {
		if m.id != self {
			st.members[m.id] = &memberReports{}
		}
	}
	return st
}

// note records member id's report v, learnt at heard; durable is this
// replica's durable vector (for the usability rule). Reports of
// non-members are ignored.
func (st *stability) note(id uint64, v vector, heard time.Time, durable vector) {
	st.mu.Lock()
	defer st.mu.Unlock()
	m := st.members[id]
	if m == nil {
		return
	}
	if heard.After(m.heard) {
		m.heard = heard
	}
	r := report{v: v, sum: v.sum()}
	if m.newest.v != nil && r.sum <= m.newest.sum {
		return
	}
	m.newest = r
	if v[core.ReplicaID(id)] <= durable[core.ReplicaID(id)] {
		m.usable, m.pending = r, m.pending[:0]
		return
	}
	if len(m.pending) == maxPendingReports {
		// Keep the older ones: they become usable first.
		m.pending[len(m.pending)-1] = r
		return
	}
	m.pending = append(m.pending, r)
}

// promote makes usable the newest pending report of each member that this
// replica's durable vector now allows.
func (st *stability) promote(durable vector) {
	st.mu.Lock()
	defer st.mu.Unlock()
	for id, m := range st.members {
		k := core.ReplicaID(id)
		i := -1
		for j, r := range m.pending {
			if r.v[k] <= durable[k] {
				i = j
			}
		}
		if i >= 0 {
			m.usable = m.pending[i]
			m.pending = append(m.pending[:0], m.pending[i+1:]...)
		}
	}
}

// memberGC is what GC needs of one member.
type memberGC struct {
	id     uint64
	usable vector // nil: no usable report
	newest vector
	heard  time.Time
}

func (st *stability) snapshot() []memberGC {
	st.mu.Lock()
	defer st.mu.Unlock()
	out := make([]memberGC, 0, len(st.members))
	for id, m := range st.members {
		out = append(out, memberGC{id: id, usable: m.usable.v, newest: m.newest.v, heard: m.heard})
	}
	return out
}

// newestOf is the newest report of member id known here (empty if none).
func (st *stability) newestOf(id uint64) vector {
	st.mu.Lock()
	defer st.mu.Unlock()
	if m := st.members[id]; m != nil && m.newest.v != nil {
		return m.newest.v.clone()
	}
	return make(vector)
}

// relay is every report known, for an ack (Ack.members): each with how
// long ago it was learnt.
func (st *stability) relay(now time.Time) []*edgesyncv1.MemberVector {
	st.mu.Lock()
	defer st.mu.Unlock()
	out := make([]*edgesyncv1.MemberVector, 0, len(st.members))
	for id, m := range st.members {
		if m.newest.v == nil {
			continue
		}
		age := now.Sub(m.heard)
		if age < 0 {
			age = 0
		}
		out = append(out, &edgesyncv1.MemberVector{MemberId: id, Vector: m.newest.v.proto(), AgeNanos: uint64(age)})
	}
	return out
}

// noteReports records what an ack from member from tells: from's own
// durable vector, and the reports it relays.
func (y *syncer) noteReports(from uint64, ack *edgesyncv1.Ack) {
	now := y.s.now()
	durable := y.log.durableVector()
	y.stab.note(from, vectorOf(ack.GetVector()), now, durable)
	for _, mv := range ack.GetMembers() {
		if mv.GetMemberId() == y.s.memberID || mv.GetMemberId() == from {
			continue
		}
		y.stab.note(mv.GetMemberId(), vectorOf(mv.GetVector()), now.Add(-time.Duration(mv.GetAgeNanos())), durable)
	}
}

// holdsGC reports whether member m holds the stable point back at now:
// heard of within the retention (since this replica started, if never),
// and, for a sync peer, not found behind after a snapshot.
func (y *syncer) holdsGC(m memberGC, now time.Time) bool {
	if p := y.byID[m.id]; p != nil {
		p.mu.Lock()
		behind := p.behind
		p.mu.Unlock()
		if behind {
			return false
		}
	}
	if y.retention <= 0 {
		return true
	}
	last := m.heard
	if last.IsZero() {
		last = y.started
	}
	return now.Sub(last) <= y.retention
}

// stable is the stable vector (see above).
func (y *syncer) stable() vector {
	return y.stableAt(y.log.durableVector())
}

func (y *syncer) stableAt(durable vector) vector {
	v := durable
	now := y.s.now()
	for _, m := range y.stab.snapshot() {
		if !y.holdsGC(m, now) {
			continue
		}
		for r, n := range v {
			v[r] = min(n, m.usable[r])
		}
	}
	return v
}

// gc trims the log below the stable point and has the core collect up to
// it (when Config.HistoryGC).
func (y *syncer) gc() {
	if !y.s.cfg.historyGC() || !y.running.Load() {
		return
	}
	durable := y.log.durableVector()
	y.stab.promote(durable)
	st := y.stableAt(durable)
	if n := y.log.trim(st); n > 0 && y.gcm != nil {
		y.gcm.trimmed.Add(float64(n))
	}
	y.collectMu.Lock()
	grew := false
	for r, n := range st {
		if n > y.collectAt[r] {
			y.collectAt[r], grew = n, true
		}
	}
	y.collectMu.Unlock()
	if grew {
		select {
		case y.collectKick <- struct{}{}:
		default:
		}
	}
}

// collectLoop runs core.Collect whenever gc raised the collect point.
func (y *syncer) collectLoop(ctx context.Context) {
	var done vector
	for {
		select {
		case <-ctx.Done():
			return
		case <-y.collectKick:
		}
		y.collectMu.Lock()
		at := y.collectAt.clone()
		y.collectMu.Unlock()
		if at.equal(done) {
			continue
		}
		if err := y.collect(at); err != nil {
			// The point is a stable vector below this replica's own: a
			// refusal is a bug in the stability bookkeeping. Collecting
			// less is safe, so say it and go on.
			y.s.log.Error("collecting causally stable history failed", "err", err)
			continue
		}
		done = at
	}
}

// collect has the core collect at the stable vector at (under the state
// lock) and records what it did.
func (y *syncer) collect(at vector) error {
	s := y.s
	s.mu.Lock()
	stats, err := s.st.Collect(map[core.ReplicaID]uint64(at))
	tombs := s.st.Tombstones()
	s.mu.Unlock()
	if err != nil {
		return err
	}
	if y.gcm != nil {
		y.gcm.collectedHashes.Add(float64(stats.Hashes))
		y.gcm.collectedKeys.Add(float64(stats.Keys))
		y.gcm.collectedFields.Add(float64(stats.Fields))
		y.gcm.tombstones.Set(float64(tombs))
		y.gcm.setCollectPoint(at)
	}
	return nil
}

// raiseCollectAt raises the collect point to at where it is higher.
func (y *syncer) raiseCollectAt(at vector) {
	y.collectMu.Lock()
	defer y.collectMu.Unlock()
	for r, n := range at {
		y.collectAt[r] = max(y.collectAt[r], n)
	}
}

// collectPoint is the vector the core last collected at, or is about to.
func (y *syncer) collectPoint() vector {
	y.collectMu.Lock()
	defer y.collectMu.Unlock()
	return y.collectAt.clone()
}

// refuseBehind handles a peer still found behind the GC point after a
// snapshot was offered (or whose snapshot failed): it stops holding GC
// back until it is caught up. Logged as an error once per episode (the
// sender retries every backoff step).
func (p *peer) refuseBehind(err error) {
	p.mu.Lock()
	first := !p.behind
	p.behind = true
	p.mu.Unlock()
	p.y.gcm.refused.WithLabelValues(p.m.name).Inc()
	if first {
		p.y.s.log.Error("peer is behind this replica's GC point and a snapshot did not catch it up; retrying",
			"peer", p.m.name, "err", err, "peer_retention", p.y.retention)
	}
}

// caughtUp clears behind once the peer's vector covers what GC dropped:
// it is served from the log, and holds GC back, again.
func (p *peer) caughtUp() {
	p.mu.Lock()
	was := p.behind
	p.behind = false
	p.mu.Unlock()
	if was {
		p.y.s.log.Info("peer is past this replica's GC point again: syncing", "peer", p.m.name)
	}
}
