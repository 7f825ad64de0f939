package core

import (
	"time"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/registry"
)

// Peer-watch: another replica of the cluster tells this one the writes its
// clients made, as it applied them, long before its write-behind flush
// reaches the backend and the backend's watch reports them here. Such a
// write is applied at once but held as provisional (peerWrite) until the
// backend confirms it:
//
//   - Order is the writes' stamps (registry.CompareStamps), the order the
//     backend itself keeps per key: a peer write older than what this
//     replica knows of the key (its snapshot's value, a provisional write,
//     or the value a backend deletion removed) changes nothing, so a peer
//     event arriving after the backend reported a newer write cannot roll
//     it back.
//   - The backend's later report of the same write (same stamp) is its
//     echo: it changes nothing and publishes nothing, and ends the
//     provisional state. A backend report of an older write of the key is
//     ignored while the provisional one stands; a newer one wins.
//   - A provisional write the backend never confirms (its writer died
//     before flushing, or the backend refused it) is judged by the first
//     backstop listing read at least PeerGrace after it was applied: the
//     listing's word then stands, as for any other key, so the backstop
//     removes or corrects it. Until then a listing leaves it alone, as it
//     leaves an unpersisted local write alone.
//   - Local writes win: while this replica has its own write of the key
//     queued, a peer write of it is ignored; the flush's outcome (landed,
//     or superseded by the newer write) settles the key.
//
// A lost or late peer stream therefore costs only freshness: the backend's
// watch and backstop still deliver everything, in order.

// PeerWrite is one local write of a replica as peer-watch carries it: a put
// of Endpoint (stamped Endpoint.Stamp) or, when Deleted, the removal of
// Endpoint's identity, stamped Stamp.
type PeerWrite struct {
	Endpoint *registryv1.ServiceEndpoint
	Deleted  bool
	Stamp    *registryv1.WriteStamp
}

// peerWrite is a provisional write from a peer: its stamp, whether it was a
// deletion, and when it was applied here.
type peerWrite struct {
	stamp   *registryv1.WriteStamp
	deleted bool
	at      time.Time
}

// knownStamp is the newest stamp this replica knows for id: its
// snapshot's value, a provisional peer write, or a value the backend
// deleted lately (peerFloor, peerFloorOld).
func (s *State) knownStamp(id registry.EndpointID) *registryv1.WriteStamp {
	st := s.Get(id).GetStamp()
	if p, ok := s.peer[id]; ok && registry.CompareStamps(p.stamp, st) > 0 {
		st = p.stamp
	}
	for _, floors := range []map[registry.EndpointID]*registryv1.WriteStamp{s.peerFloor, s.peerFloorOld} {
		if f := floors[id]; registry.CompareStamps(f, st) > 0 {
			st = f
		}
	}
	return st
}

// ApplyPeer applies writes a peer streamed, in its order. Effects.Events
// are the snapshot's changes; Effects.PeerApplied counts the writes that
// were taken (the others were stale, or a local write of the key waits).
func (s *State) ApplyPeer(ws []PeerWrite, now time.Time) Effects {
	var e Effects
	for _, w := range ws {
		if w.Endpoint == nil {
			continue
		}
		id := registry.IDOf(w.Endpoint)
		stamp := w.Stamp
		if !w.Deleted {
			stamp = w.Endpoint.GetStamp()
		}
		if stamp == nil {
			continue // unordered: only the backend can place it
		}
		s.clock.Observe(stamp.GetHlc())
		if s.queue.holds(id) || registry.CompareStamps(stamp, s.knownStamp(id)) <= 0 {
			continue
		}
		s.peer[id] = peerWrite{stamp: stamp, deleted: w.Deleted, at: now}
		e.PeerApplied++
		if w.Deleted {
			if ev := s.set(id, nil); ev != nil {
				e.Events = append(e.Events, ev)
			}
			continue
		}
		if prev := s.Get(id); prev != nil && registry.SameAttributes(prev, w.Endpoint) {
			// No change to publish, but the newer stamp is what the
			// backend's echo will carry.
			s.endpoints[id.Service][id] = w.Endpoint
			delete(s.epRev, id)
			continue
		}
		if ev := s.set(id, w.Endpoint); ev != nil {
			e.Events = append(e.Events, ev)
		}
	}
	return e
}

// peerVerdict is what a backend report of a key with a provisional peer
// write does.
type peerVerdict int

const (
	peerNone  peerVerdict = iota // no provisional write: apply as usual
	peerEcho                     // the same write: nothing changes
	peerStale                    // older than the provisional write: ignore
	peerNewer                    // newer: the backend's word wins
)

// peerReport judges a backend report e of a key against its provisional
// peer write, ending the provisional state when the report settles it.
func (s *State) peerReport(e backend.Event) peerVerdict {
	p, ok := s.peer[e.ID]
	if !ok {
		return peerNone
	}
	if e.Endpoint == nil {
		if p.deleted {
			// The key is gone either way: the peer's deletion, or an
			// older one; a later put would carry a stamp to compare.
			delete(s.peer, e.ID)
			return peerEcho
		}
		// A deletion whose stamp the watch does not carry: it may be
		// older than the provisional put (the put's own echo is still
		// to come) or newer. Leave it to the echo or to the backstop.
		return peerStale
	}
	switch c := registry.CompareStamps(e.Endpoint.GetStamp(), p.stamp); {
	case c == 0:
		delete(s.peer, e.ID)
		return peerEcho
	case c < 0:
		return peerStale
	default:
		delete(s.peer, e.ID)
		return peerNewer
	}
}

// applyEcho records the backend's confirmation of a provisional put: the
// stored value is the backend's as of rev.
func (s *State) applyEcho(e backend.Event) *registrarv1.EndpointEvent {
	if e.Endpoint == nil {
		return nil
	}
	return s.setAt(e.ID, e.Endpoint, e.Revision)
}

// peerGuarded reports whether a listing read from a.Started must leave
// id alone: a provisional peer write applied too recently for its writer's
// flush to have reached the backend before the listing was read.
func (s *State) peerGuarded(id registry.EndpointID, a *ListingApply) bool {
	p, ok := s.peer[id]
	if !ok {
		return false
	}
	if a.Started.IsZero() || !p.at.Before(a.Started.Add(-s.peerGrace)) {
		return true
	}
	// Judged by this listing: from now on the key is like any other.
	delete(s.peer, id)
	return false
}

// finishPeer ends, after a listing, the provisional writes it judged (old
// enough), and ages the deletion floors: each is kept across at least one
// whole backstop interval, then dropped. Every backstop judges every key,
// even one that reconciles only some services (the digest's dirty ones):
// the others were compared key by key and agree with the backend, so a
// provisional deletion there is settled too.
func (s *State) finishPeer(a *ListingApply) {
	for id, p := range s.peer {
		if !a.Started.IsZero() && p.at.Before(a.Started.Add(-s.peerGrace)) {
			delete(s.peer, id)
		}
	}
	s.peerFloorOld, s.peerFloor = s.peerFloor, make(map[registry.EndpointID]*registryv1.WriteStamp, len(s.peerFloor))
}

// Provisional counts the peer writes not yet confirmed by the backend.
func (s *State) Provisional() int { return len(s.peer) }
