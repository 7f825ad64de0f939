package core

// Chain tracking and the garbage collection of causally stable history
// (package doc, "Causal stability").

// chain is one replica's chain of changes as applied here: its changes
// arrive in chain order (each is causally after the one before, whose
// author had it as an ancestor of its heads), so a count names a prefix.
type chain struct {
	n    uint64 // changes of the replica applied here: its Vector entry
	last HLC    // stamp of the n-th (chain stamps strictly increase)
	// stable is the largest count of the chain Collect was told is
	// causally stable (0: none).
	stable uint64
	// stamps[i] is the stamp of the (base+i)-th change, base being
	// max(1, stable): answering "the stamp of r's k-th change" is how a
	// stable vector becomes a stamp bound (Collect), and the stable-th's
	// is the bound itself.
	base   uint64
	stamps []HLC
	// gone are the changes of the chain compaction dropped from known, in
	// chain order, until Collect finds them stable.
	gone []goneRef
}

type goneRef struct {
	seq uint64
	id  Hash
}

// chainPos is a change's place in its author's chain (1-based seq).
type chainPos struct {
	repl ReplicaID
	seq  uint64
}

// chainOf returns r's chain, creating it empty.
func (s *State) chainOf(r ReplicaID) *chain {
	ch := s.chains[r]
	if ch == nil {
		ch = &chain{base: 1}
		s.chains[r] = ch
	}
	return ch
}

// appendChain books c as the next change of its author's chain and
// returns its seq.
func (s *State) appendChain(c *Change) uint64 {
	ch := s.chainOf(c.Replica)
	ch.n++
	ch.last = c.Stamp
	ch.stamps = append(ch.stamps, c.Stamp)
	return ch.n
}

// Vector is, per replica, how many of its changes are applied here: the
// sync log's seq numbering (the k-th change of a replica has seq k).
// Replicas none of whose changes are applied are absent.
func (s *State) Vector() map[ReplicaID]uint64 {
	out := make(map[ReplicaID]uint64, len(s.chains))
	for r, ch := range s.chains {
		if ch.n > 0 {
			out[r] = ch.n
		}
	}
	return out
}

// LastStamp is the stamp of the latest change of r applied here; false
// when none is.
func (s *State) LastStamp(r ReplicaID) (HLC, bool) {
	ch := s.chains[r]
	if ch == nil || ch.n == 0 {
		return HLC{}, false
	}
	return ch.last, true
}

// StampOf is the stamp of r's seq-th change (1-based), while Collect has
// not passed it (seq >= the last stable count collected for r); false for
// a change not applied here or collected.
func (s *State) StampOf(r ReplicaID, seq uint64) (HLC, bool) {
	ch := s.chains[r]
	if ch == nil || seq < ch.base || seq > ch.n {
		return HLC{}, false
	}
	return ch.stamps[seq-ch.base], true
}

// ChainPos is the place of change h in its author's chain: its replica and
// seq. It answers for the changes still known (since compaction) and
// those compacted but not yet collected; false otherwise (a collected
// change is causally stable: the sync layer can answer for it by vector).
func (s *State) ChainPos(h Hash) (ReplicaID, uint64, bool) {
	if at, ok := s.known[h]; ok {
		return at.repl, at.seq, true
	}
	if p, ok := s.forgotten[h]; ok {
		return p.repl, p.seq, true
	}
	return 0, 0, false
}

// forget moves a change compaction dropped from known to forgotten, unless
// Collect already found it stable: no change that arrives from now on
// names it as a parent or is it (package doc, "Causal stability").
func (s *State) forget(h Hash, at changeAt) {
	ch := s.chains[at.repl]
	if at.seq < ch.stable {
		return
	}
	s.forgotten[h] = chainPos{repl: at.repl, seq: at.seq}
	ch.gone = append(ch.gone, goneRef{seq: at.seq, id: h})
}
