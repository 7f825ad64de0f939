package core

import (
	"fmt"
	"slices"
)

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
	g := goneRef{seq: at.seq, id: h}
	if n := len(ch.gone); n == 0 || ch.gone[n-1].seq < at.seq {
		ch.gone = append(ch.gone, g) // compaction forgets in index order
		return
	}
	// A snapshot merge booked later changes of the chain before this
	// one, which was known here then: keep the chain order Collect
	// relies on.
	i, _ := slices.BinarySearchFunc(ch.gone, at.seq, func(r goneRef, seq uint64) int { return cmpInt(r.seq, seq) })
	ch.gone = slices.Insert(ch.gone, i, g)
}

// CollectStats is what one Collect dropped.
type CollectStats struct {
	Hashes int // compacted changes' hashes no longer kept (forgotten)
	Keys   int // key records kept only for their winner or document
	Fields int // nodes of JSON documents (field tombstones, hidden assignments, whole deleted documents)
}

// Collect garbage collects what is causally stable: stable[r] is how many
// of r's changes (a prefix of its chain) every change this replica will
// receive from now on is causally after (package doc, "Causal
// stability"); the sync layer computes it. It drops
//
//   - the hashes compaction kept of changes (r, seq) with seq < stable[r]:
//     no future change names them as a parent (each member held r's
//     stable[r]-th change, a descendant of them, so they were no head of
//     any author); the stable[r]-th itself may still be a head;
//   - the key records with no version left whose winner is stable: every
//     later write on the key is causally after the winner, hence has a
//     larger stamp and wins whether the record is there or not;
//   - what JSON documents hold only against assignments that can no
//     longer arrive: deleted fields, assignments hidden by a later clear,
//     whole deleted documents, when every register involved is stable.
//
// A winner or register (stamp, r) is stable iff stamp <= the stamp of r's
// stable[r]-th change (r's stamps strictly increase along its chain). The
// stable point only moves forward: a count below an earlier one changes
// nothing for its replica. Collect refuses (changes nothing) a stable
// vector that is not <= Vector(). What Collect decided also holds for
// what compaction drops later, so compaction and collection commute.
func (s *State) Collect(stable map[ReplicaID]uint64) (CollectStats, error) {
	var st CollectStats
	for r, n := range stable {
		if n == 0 {
			continue
		}
		if ch := s.chains[r]; ch == nil || n > ch.n {
			var have uint64
			if ch != nil {
				have = ch.n
			}
			return st, fmt.Errorf("core: collect: stable count %d of replica %d is past the %d applied here", n, r, have)
		}
	}
	for r, n := range stable {
		ch := s.chains[r]
		if n <= ch.stable {
			continue
		}
		ch.stable = n
		ch.stamps = slices.Clone(ch.stamps[n-ch.base:])
		ch.base = n
		i := 0
		for i < len(ch.gone) && ch.gone[i].seq < n {
			delete(s.forgotten, ch.gone[i].id)
			i++
		}
		st.Hashes += i
		if i > 0 {
			ch.gone = slices.Clone(ch.gone[i:])
		}
	}
	pending := s.gcKeys[:0]
	for _, k := range s.gcKeys {
		if s.keys[string(k.key)] != k {
			k.gc = false // removed by compaction since
			continue
		}
		if k.doc != nil {
			d, removed, unstable := s.pruneDoc(k.doc)
			k.doc = d
			st.Fields += removed
			if unstable {
				pending = append(pending, k)
				continue
			}
		}
		switch {
		case !k.isEmpty() || k.dirty:
			// A value, or versions still readable: compaction puts the
			// record back on the list when its last version goes.
			k.gc = false
		case s.removable(k):
			k.gc = false
			s.dropKey(k)
			st.Keys++
		default:
			pending = append(pending, k)
		}
	}
	clear(s.gcKeys[len(pending):])
	s.gcKeys = pending
	return st, nil
}

// Collected is, per replica, the largest stable count Collect was given:
// Collect(Collected()) changes nothing, and a restarted replica that
// replays its log and collects at it holds what this one holds.
func (s *State) Collected() map[ReplicaID]uint64 {
	out := map[ReplicaID]uint64{}
	for r, ch := range s.chains {
		if ch.stable > 0 {
			out[r] = ch.stable
		}
	}
	return out
}

// Tombstones is how many key records have no version left and are kept
// only for the conflict rule: a bytes key's winner, a JSON key's
// document, until Collect finds them stable (the tombstone metric).
func (s *State) Tombstones() int {
	n := 0
	for _, k := range s.gcKeys {
		if s.keys[string(k.key)] == k && k.isEmpty() {
			n++
		}
	}
	return n
}

// Forgotten is how many hashes of compacted changes are kept until Collect
// finds them stable (the DAG-size metric).
func (s *State) Forgotten() int { return len(s.forgotten) }

// stableAt reports whether the change of r stamped stamp is causally
// stable as Collect was told. The zero winner (nothing decided) is.
func (s *State) stableAt(stamp HLC, r ReplicaID) bool {
	if stamp == (HLC{}) && r == 0 {
		return true
	}
	ch := s.chains[r]
	return ch != nil && ch.stable > 0 && stamp.Compare(ch.stamps[0]) <= 0
}

func (s *State) regStable(g jreg) bool {
	return s.stableAt(HLC{Wall: g.wall, Logical: g.logical}, g.repl)
}

// removable reports whether record k, which has no version left, may go:
// a bytes key's once its winner is stable (any later write wins anyway), a
// JSON key's once Collect emptied its document (the document, not the
// winner, decides merges there).
func (s *State) removable(k *keyRec) bool {
	if k.doc != nil {
		return false
	}
	return s.vm.IsJSON(k.key) || s.stableAt(k.win, k.winRepl)
}

// markGC lists k for Collect: a record left without versions, or a JSON
// document that holds unstable registers.
func (s *State) markGC(k *keyRec) {
	if !k.gc {
		k.gc = true
		s.gcKeys = append(s.gcKeys, k)
	}
}

func (s *State) dropKey(k *keyRec) {
	delete(s.keys, string(k.key))
	s.order.remove(k.key)
}

// pruneDoc is d without what can no longer matter (Collect), how many
// nodes went, and whether unstable registers remain (Collect must look
// again later). nil when nothing is left.
func (s *State) pruneDoc(d *jdoc) (*jdoc, int, bool) {
	root, removed, unstable, _ := s.pruneNode(d.root, jreg{})
	if !s.regStable(d.leaseReg) {
		unstable = true
	}
	if root == nil && !unstable {
		return nil, removed, false
	}
	if root == d.root {
		return d, removed, unstable
	}
	out := *d
	out.root = root
	return &out, removed, unstable
}

// pruneNode prunes n, shown inside ancestors whose largest clear is c.
// Every register it removes is stable, so every assignment still to come
// is after it; each removal keeps what the node shows now and after any
// later join:
//
//   - a stable kind hidden by an ancestor's clear (c only grows, a later
//     kind replaces it anyway), or a stable absent kind (it shows nothing;
//     its clear, kept apart, does the hiding);
//   - a stable clear when nothing below it is older (it hides nothing
//     now, and every later assignment is after it);
//   - a node left with nothing.
//
// The result depends only on what is kept, so collecting at one stable
// point and again at a later one leaves what collecting once at the later
// one does. It returns the pruned node (n itself when nothing changed),
// the nodes removed, whether unstable registers remain, and the smallest
// register left in the subtree (zero when none).
func (s *State) pruneNode(n *jnode, c jreg) (*jnode, int, bool, jreg) {
	if n == nil {
		return nil, 0, false, jreg{}
	}
	inner := maxReg(c, n.clear)
	removed, unstable := 0, false
	var low jreg
	haveLow := false
	lower := func(g jreg) {
		if !haveLow || g.compare(low) < 0 {
			low, haveLow = g, true
		}
	}
	var fields map[string]*jnode
	changed := false
	for name, f := range n.fields {
		pf, r, u, fl := s.pruneNode(f, inner)
		removed += r
		unstable = unstable || u
		if pf != f {
			changed = true
		}
		if pf == nil {
			continue
		}
		if fields == nil {
			fields = make(map[string]*jnode, len(n.fields))
		}
		fields[name] = pf
		if fl != (jreg{}) {
			lower(fl)
		}
	}
	kind := n.kind
	if kind != nil {
		if s.regStable(kind.reg) && (kind.reg.compare(c) < 0 || kind.kind == jAbsent) {
			kind, changed = nil, true
		} else if !s.regStable(kind.reg) {
			unstable = true
		}
	}
	cl := n.clear
	if cl != (jreg{}) {
		if s.regStable(cl) && !(haveLow && low.compare(cl) < 0) {
			cl, changed = jreg{}, true
		} else if !s.regStable(cl) {
			unstable = true
		}
	}
	if kind != nil {
		lower(kind.reg)
	}
	if cl != (jreg{}) {
		lower(cl)
	}
	if kind == nil && cl == (jreg{}) && len(fields) == 0 {
		return nil, removed + 1, unstable, jreg{}
	}
	if !changed {
		return n, removed, unstable, low
	}
	return &jnode{kind: kind, clear: cl, fields: fields}, removed, unstable, low
}
