package edge

// GC of the sync log (issue 16, part 4, first steps).
//
// # Causal stability
//
// A change is stable when every replica that may still need it from this
// one holds it. What this replica knows each peer holds is the peer's
// acked vector (and the changes it sent us); the stable vector is the
// elementwise minimum of this replica's durable vector and every such
// peer's (a peer never heard from counts as zero). Each of those vectors
// is causally closed, so their minimum is too: the stable changes are a
// downward-closed part of the DAG.
//
// Only this replica's sync peers count. For the sync log that is exact:
// the log exists to feed this replica's pushers, and a change every one of
// its peers holds will never be pushed again (a replica that lost its data
// rejoins under a new member id, so a peer's vector never goes back). With
// Config.SyncPeers a subset, a change stable here need not be stable in the
// whole cluster; the tombstone and DAG GC still to come need the cluster's
// minimum, which the acks will have to relay (sync.go).
//
// # Trimming
//
// With Config.HistoryGC, the log drops its longest prefix the stable
// vector covers (syncLog.trim), after every ack: memory stays bounded
// while every peer is acking. Without Config.PeerRetention a peer that is
// away holds the stable point where it left, so nothing a configured peer
// lacks is ever dropped.
//
// # Retention
//
// With Config.PeerRetention, a peer not heard from (no ack) for longer no
// longer holds the stable point back; nor does a peer refused below. Such
// a peer may come back lacking changes the log dropped: its stream is then
// refused (errBehindGC), loudly (an error log on the first refusal, the
// aether_edge_gc_peer_refused_total counter, aether_edge_gc_peer_behind 1)
// rather than sent the rest of the log, which would leave a hole in its
// history. It has to be re-bootstrapped: snapshot transfer (the sender's
// key records with their winners, and its vector) is not built yet; until
// it is, the operator replaces the peer by a new member with an empty data
// directory. Its own pushes are still accepted (merging them is always
// safe), so nothing acknowledged at the returning peer is lost. A refused
// peer that another replica (one that still had the changes) catches up
// is served again once its vector covers what was dropped.

import (
	"time"
)

// gcState is what GC needs of a peer.
type gcState struct {
	held     vector
	lastSync time.Time
	behind   bool
}

func (p *peer) gcState() gcState {
	st := p.state()
	p.mu.Lock()
	defer p.mu.Unlock()
	return gcState{held: st.acked, lastSync: st.lastSync, behind: p.behind}
}

// holdsGC reports whether peer p (in state st) holds the stable point
// back at now: it is not behind the GC point and was heard from within
// the retention (since this replica started, if never).
func (y *syncer) holdsGC(st gcState, now time.Time) bool {
	if st.behind {
		return false
	}
	if y.retention <= 0 {
		return true
	}
	last := st.lastSync
	if last.IsZero() {
		last = y.started
	}
	return now.Sub(last) <= y.retention
}

// stable is the stable vector (see above).
func (y *syncer) stable() vector {
	v := y.log.durableVector()
	now := y.s.now()
	for _, p := range y.peers {
		st := p.gcState()
		if !y.holdsGC(st, now) {
			continue
		}
		for r, n := range v {
			v[r] = min(n, st.held[r])
		}
	}
	return v
}

// gc trims the log below the stable point (when Config.HistoryGC).
func (y *syncer) gc() {
	if !y.s.cfg.historyGC() {
		return
	}
	if n := y.log.trim(y.stable()); n > 0 && y.gcm != nil {
		y.gcm.trimmed.Add(float64(n))
	}
}

// refuseBehind handles a peer found behind the GC point: it stops holding
// GC back and is refused until it is re-bootstrapped. Logged as an error
// once per episode (the sender retries every backoff step).
func (p *peer) refuseBehind(err error) {
	p.mu.Lock()
	first := !p.behind
	p.behind = true
	p.mu.Unlock()
	p.y.gcm.refused.WithLabelValues(p.m.name).Inc()
	if first {
		p.y.s.log.Error("refusing to sync a peer behind this replica's GC point: it lacks changes no longer kept; replace it by a new member (snapshot transfer is not implemented)",
			"peer", p.m.name, "err", err, "peer_retention", p.y.retention)
	}
}

// caughtUp clears behind once the peer's vector covers what GC dropped
// (another replica that still had the changes caught it up): it is served
// from the log, and holds GC back, again.
func (p *peer) caughtUp() {
	p.mu.Lock()
	was := p.behind
	p.behind = false
	p.mu.Unlock()
	if was {
		p.y.s.log.Info("peer is past this replica's GC point again: syncing", "peer", p.m.name)
	}
}
