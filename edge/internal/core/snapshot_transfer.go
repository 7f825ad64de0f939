package core

// Snapshot transfer: re-bootstrapping a replica that fell behind the GC
// point (its peers no longer hold the changes it lacks). The sender sends
// its latest state instead of its changes; the receiver merges it by the
// conflict rule, as if it had merged every change the sender applied.
//
// # What a transfer holds
//
// Per key the latest state (a value with its lease, or a tombstone) with
// its winner, and a JSON key's document; the leases with their granter and
// grant stamp; the chain tracking (per replica the count, the stamps from
// the stable point on, the stable count); every change hash the sender
// keeps as applied (known and compacted-not-collected, with its place in
// its chain); the heads with theirs; the clock. No history: revisions,
// versions and events are per replica, the receiver makes its own.
//
// # The merge
//
// The receiver has seen a write (stamp, r) iff stamp <= its last stamp of
// r (chains arrive in order with increasing stamps); so does the sender,
// by the chains it sends. So, per key:
//
//   - a bytes key takes the sender's state iff the sender's winner is
//     after its own (the rule Merge applies per op: the final winner of a
//     key over a set of changes is the largest write, whatever the order);
//     a key the sender has no record of while the receiver's winner is one
//     the sender saw was deleted there and collected: it is deleted here;
//     and the other way, a key the receiver has no record of while it saw
//     the sender's winner was deleted and collected here (the receiver is
//     the one whose GC stopped waiting for the sender): it stays deleted;
//   - a JSON key's document is the join of both, after dropping from each
//     side every register the other saw and does not hold: the other's
//     document holds what superseded them (Collect may have removed a
//     tombstone together with what it hid, which the stale copy would
//     otherwise bring back);
//   - a lease the sender has and the receiver lacks is added unless the
//     receiver saw its grant (then it saw the revoke); one the receiver
//     has and the sender lacks goes if the sender saw its grant.
//
// Without GC at the sender this is exactly what merging the sender's
// changes one by one would give (same values, documents, winners of bytes
// keys, leases, heads, vector); with it, only writes the receiver made
// concurrently with a tombstone the sender collected can differ (they come
// back), the documented cost of a replica kept away past retention. The
// chains advance to the larger of both (and the stable point with them),
// the sender's hashes become applied here (later changes naming them as
// parents merge, changes they name are duplicates by stamp), the heads are
// the frontier of both.

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"
)

// TransferVersion is the version byte of a transfer's encoding.
const TransferVersion = 1

var transferMagic = []byte{0xf5, 'T'}

// transfer is a transfer snapshot's content.
type transfer struct {
	from   ReplicaID
	clock  HLC
	chains []tchain // replica order
	heads  []thash  // hash order
	hashes []thash  // (replica, seq) order
	keys   []tkey   // key order
	leases []tlease // id order
}

type tchain struct {
	repl      ReplicaID
	n, stable uint64
	stamps    []HLC // of changes max(1, stable) to n
}

func (c *tchain) last() HLC { return c.stamps[len(c.stamps)-1] }

type thash struct {
	id   Hash
	repl ReplicaID
	seq  uint64
}

type tkey struct {
	key     []byte
	win     HLC
	winRepl ReplicaID
	live    bool
	value   []byte
	lease   int64
	doc     *jdoc
}

type tlease struct {
	id, ttl int64
	granter ReplicaID
	stamp   HLC
}

// TransferSnapshot encodes this replica's latest state for a peer to
// MergeSnapshot (see above). Encoding (version 1; integers as in a
// snapshot, HLC = int64 wall, uint32 logical):
//
//	bytes    magic 0xf5 'T', version 1
//	uint64   sender replica id; HLC clock
//	uvarint  number of chains, then per replica in id order: uint64 id;
//	         uvarint count n (>= 1); uvarint stable count; the stamps of
//	         its changes max(1, stable) to n
//	uvarint  number of heads, then per head in hash order: 32 bytes,
//	         uint64 replica, uvarint seq
//	uvarint  number of applied hashes, then each 32 bytes, uint64 replica,
//	         uvarint seq, in (replica, seq) order
//	uvarint  number of keys, then per key in key order: uvarint len, key;
//	         HLC winner; uint64 winner replica; byte flags (1 live, 2 has a
//	         document); live: uvarint len, value, int64 lease; document as
//	         in a snapshot
//	uvarint  number of leases, then per lease in id order: int64 id, int64
//	         ttl, uint64 granter, HLC grant stamp
func (s *State) TransferSnapshot() []byte {
	t := &transfer{from: s.id, clock: s.clock}
	repls := make([]ReplicaID, 0, len(s.chains))
	for r, ch := range s.chains {
		if ch.n > 0 {
			repls = append(repls, r)
		}
	}
	slices.Sort(repls)
	for _, r := range repls {
		ch := s.chains[r]
		t.chains = append(t.chains, tchain{repl: r, n: ch.n, stable: ch.stable, stamps: ch.stamps})
	}
	for _, h := range s.heads {
		r, seq, _ := s.ChainPos(h)
		t.heads = append(t.heads, thash{id: h, repl: r, seq: seq})
	}
	for _, h := range s.idxHash {
		at := s.known[h]
		t.hashes = append(t.hashes, thash{id: h, repl: at.repl, seq: at.seq})
	}
	for h, p := range s.forgotten {
		t.hashes = append(t.hashes, thash{id: h, repl: p.repl, seq: p.seq})
	}
	slices.SortFunc(t.hashes, compareThash)
	s.order.ascend(nil, nil, func(k *keyRec) bool {
		tk := tkey{key: k.key, win: k.win, winRepl: k.winRepl, doc: k.doc}
		if v := k.live(); v != nil {
			tk.live, tk.value, tk.lease = true, v.value, v.lease
		}
		t.keys = append(t.keys, tk)
		return true
	})
	for _, id := range s.leaseIDs() {
		l := s.leases[id]
		t.leases = append(t.leases, tlease{id: l.id, ttl: l.ttl, granter: l.granter, stamp: l.stamp})
	}
	return t.encode()
}

func compareThash(a, b thash) int {
	if c := cmpInt(a.repl, b.repl); c != 0 {
		return c
	}
	return cmpInt(a.seq, b.seq)
}

func (t *transfer) encode() []byte {
	b := append([]byte(nil), transferMagic...)
	b = append(b, TransferVersion)
	b = binary.BigEndian.AppendUint64(b, uint64(t.from))
	b = appendHLC(b, t.clock)
	b = binary.AppendUvarint(b, uint64(len(t.chains)))
	for _, c := range t.chains {
		b = binary.BigEndian.AppendUint64(b, uint64(c.repl))
		b = binary.AppendUvarint(b, c.n)
		b = binary.AppendUvarint(b, c.stable)
		for _, st := range c.stamps {
			b = appendHLC(b, st)
		}
	}
	for _, hs := range [][]thash{t.heads, t.hashes} {
		b = binary.AppendUvarint(b, uint64(len(hs)))
		for _, h := range hs {
			b = append(b, h.id[:]...)
			b = binary.BigEndian.AppendUint64(b, uint64(h.repl))
			b = binary.AppendUvarint(b, h.seq)
		}
	}
	b = binary.AppendUvarint(b, uint64(len(t.keys)))
	for _, k := range t.keys {
		b = appendKeyHead(b, k.key, k.win, k.winRepl)
		var f byte
		if k.live {
			f |= 1
		}
		if k.doc != nil {
			f |= 2
		}
		b = append(b, f)
		if k.live {
			b = appendBytes(b, k.value)
			b = binary.BigEndian.AppendUint64(b, uint64(k.lease))
		}
		if k.doc != nil {
			b = appendDoc(b, k.doc)
		}
	}
	b = binary.AppendUvarint(b, uint64(len(t.leases)))
	for _, l := range t.leases {
		b = binary.BigEndian.AppendUint64(b, uint64(l.id))
		b = binary.BigEndian.AppendUint64(b, uint64(l.ttl))
		b = binary.BigEndian.AppendUint64(b, uint64(l.granter))
		b = appendHLC(b, l.stamp)
	}
	return b
}

// decodeTransfer parses and checks a transfer: orders, chain stamps that
// increase, hashes and heads inside their chains. Only the encoding
// TransferSnapshot makes is accepted.
func decodeTransfer(b []byte) (*transfer, error) {
	if !bytes.HasPrefix(b, transferMagic) || len(b) < len(transferMagic)+1 {
		return nil, errors.New("not a transfer snapshot")
	}
	if v := b[len(transferMagic)]; v != TransferVersion {
		return nil, fmt.Errorf("transfer snapshot version %d, want %d", v, TransferVersion)
	}
	d := &snapDecoder{decoder{b: b[len(transferMagic)+1:]}}
	t := &transfer{from: ReplicaID(d.u64()), clock: d.hlc()}
	chains := map[ReplicaID]*tchain{}
	n := d.count("chains", 22)
	for i := range n {
		c := tchain{repl: ReplicaID(d.u64()), n: d.uvarint(), stable: d.uvarint()}
		if d.err != nil {
			return nil, d.err
		}
		if (i > 0 && c.repl <= t.chains[i-1].repl) || c.n == 0 || c.stable > c.n || c.n > 1<<62 {
			return nil, fmt.Errorf("chain of replica %d (%d changes, %d stable): out of order or range", c.repl, c.n, c.stable)
		}
		ns := c.n + 1 - max(1, c.stable)
		if ns > uint64(len(d.b)/12) {
			return nil, fmt.Errorf("chain of replica %d: %d stamps: %w", c.repl, ns, errShort)
		}
		c.stamps = make([]HLC, ns)
		for j := range c.stamps {
			c.stamps[j] = d.hlc()
			if j > 0 && c.stamps[j].Compare(c.stamps[j-1]) <= 0 {
				return nil, fmt.Errorf("chain of replica %d: stamps do not increase", c.repl)
			}
		}
		t.chains = append(t.chains, c)
	}
	for i := range t.chains {
		chains[t.chains[i].repl] = &t.chains[i]
	}
	readHashes := func(what string, byHash bool) []thash {
		n := d.count(what, 42)
		out := make([]thash, 0, n)
		for i := range n {
			h := thash{id: d.hash(), repl: ReplicaID(d.u64()), seq: d.uvarint()}
			if d.err != nil {
				return nil
			}
			if c := chains[h.repl]; c == nil || h.seq == 0 || h.seq > c.n {
				d.fail("%s %s: change %d of replica %d is outside its chain", what, h.id, h.seq, h.repl)
				return nil
			}
			if i > 0 {
				p := out[i-1]
				if (byHash && bytes.Compare(p.id[:], h.id[:]) >= 0) || (!byHash && compareThash(p, h) >= 0) {
					d.fail("%s not sorted and distinct", what)
					return nil
				}
			}
			out = append(out, h)
		}
		return out
	}
	t.heads = readHashes("heads", true)
	t.hashes = readHashes("applied hashes", false)
	if d.err != nil {
		return nil, d.err
	}
	n = d.count("keys", 24)
	for i := range n {
		var k tkey
		k.key, k.win, k.winRepl = d.keyHead()
		f := d.byte1()
		if d.err == nil && (len(k.key) == 0 || f > 3 || (i > 0 && bytes.Compare(t.keys[i-1].key, k.key) >= 0)) {
			d.fail("key %q (flags %#x): empty, bad flags or out of key order", k.key, f)
		}
		k.live = f&1 != 0
		if k.live {
			k.value, k.lease = d.bytes(), d.i64()
		}
		if f&2 != 0 {
			k.doc = d.doc()
		}
		if d.err != nil {
			return nil, d.err
		}
		t.keys = append(t.keys, k)
	}
	n = d.count("leases", 36)
	for i := range n {
		l := tlease{id: d.i64(), ttl: d.i64(), granter: ReplicaID(d.u64()), stamp: d.hlc()}
		if d.err == nil && i > 0 && l.id <= t.leases[i-1].id {
			d.fail("lease %d: ids not sorted and distinct", l.id)
		}
		t.leases = append(t.leases, l)
	}
	if d.err != nil {
		return nil, d.err
	}
	if len(d.b) != 0 {
		return nil, fmt.Errorf("%d trailing bytes", len(d.b))
	}
	if !bytes.Equal(t.encode(), b) {
		return nil, errors.New("transfer snapshot not in canonical form")
	}
	return t, nil
}

// MergeSnapshot merges a peer's TransferSnapshot (see above). What changed
// visibly gets ONE new revision: Applied.Rev (0 when nothing did) and
// Applied.Events, in key order, PrevKv filled as for a change. It is not a
// change: Applied.Encoded, ID and Change are unset and Index is 0 (the
// index does not move). HashOfRevision of that revision answers a hash
// no change has (RevisionOf maps it back; ChainPos places it in no
// chain, replica 0). A transfer that does not decode, or that holds
// changes of this replica it lacks (it lost its log: rejoin under a new
// id), is refused and changes nothing. now is unused: merged leases of
// other replicas keep no expiry here, as with Merge.
//
// The shell must NOT hand the Applied to the change log (committer.add:
// there is no change to append, and replay could not redo it). Before
// acknowledging the transfer or persisting any later change, it persists
// a checkpoint: Snapshot() taken right after MergeSnapshot, at index
// Index() (unchanged), so recovery restores the merge and replays only
// the changes after it; changes applied later follow in the log as usual.
// Then it publishes Applied.Events to watchers (the revision is a real
// one: watchers and Range see it), and marks Vector() as held in its sync
// log (the sender's changes are applied here without their encodings).
func (s *State) MergeSnapshot(now time.Time, b []byte) (*Applied, error) {
	t, err := decodeTransfer(b)
	if err != nil {
		return nil, fmt.Errorf("core: merge snapshot: %w", err)
	}
	if t.from == s.id {
		return nil, errors.New("core: merge snapshot: a transfer of this replica's own state")
	}
	theirs := make(map[ReplicaID]*tchain, len(t.chains))
	for i := range t.chains {
		theirs[t.chains[i].repl] = &t.chains[i]
	}
	if c := theirs[s.id]; c != nil {
		if ours := s.chains[s.id]; ours == nil || c.n > ours.n {
			return nil, fmt.Errorf("core: merge snapshot: replica %d holds %d changes of this replica (%d), more than its log here: rejoin under a new replica id", t.from, c.n, s.id)
		}
	}
	// The other way: the sender holds fewer of its own changes than this
	// replica does. Its history went back (its data was lost), and its
	// next changes would be numbered like ones already here.
	if ours := s.chains[t.from]; ours != nil && ours.n > 0 {
		if c := theirs[t.from]; c == nil || c.n < ours.n {
			var n uint64
			if c != nil {
				n = c.n
			}
			return nil, fmt.Errorf("core: merge snapshot: replica %d holds %d of its own changes, %d are here: it lost its history and must rejoin under a new replica id", t.from, n, ours.n)
		}
	}
	// seen: whether the sender saw a write; seenHere: whether we did.
	seen := func(st HLC, r ReplicaID) bool {
		c := theirs[r]
		return c != nil && st.Compare(c.last()) <= 0
	}
	seenHere := func(st HLC, r ReplicaID) bool {
		last, ok := s.LastStamp(r)
		return ok && st.Compare(last) <= 0
	}

	heads := s.mergedHeads(t, theirs)

	// Leases first: the keys' puts below attach to the leases they name.
	added := map[int64]bool{}
	inT := make(map[int64]bool, len(t.leases))
	for _, l := range t.leases {
		inT[l.id] = true
		a := s.leases[l.id]
		switch {
		case a == nil && seenHere(l.stamp, l.granter):
			// We saw the grant and no longer have it: we saw the revoke.
		case a == nil || ((a.granter != l.granter || a.stamp != l.stamp) && seen(a.stamp, a.granter)):
			// New to us, or a later grant of the id than ours, which the
			// sender saw go.
			s.leases[l.id] = &leaseRec{id: l.id, ttl: l.ttl, granter: l.granter, stamp: l.stamp, keys: map[string]struct{}{}}
			added[l.id] = true
		}
	}
	for _, id := range s.leaseIDs() {
		if a := s.leases[id]; !inT[id] && seen(a.stamp, a.granter) {
			delete(s.leases, id) // the sender saw the grant, then the revoke
		}
	}

	w := s.newWriter()
	w.merge = true
	ki := 0
	var wins []winUpdate
	mergeKey := func(k *keyRec, tk *tkey) {
		if s.vm.IsJSON(keyOf(k, tk)) {
			wins = append(wins, s.mergeJSONKey(w, k, tk, seen, seenHere))
			return
		}
		if u, ok := s.mergeBytesKey(w, k, tk, seen, seenHere); ok {
			wins = append(wins, u)
		}
	}
	// Both key sets in key order (the ascent sees records this loop
	// creates only past the current key, so they are not visited twice).
	var ours []*keyRec
	s.order.ascend(nil, nil, func(k *keyRec) bool { ours = append(ours, k); return true })
	for _, k := range ours {
		for ki < len(t.keys) && bytes.Compare(t.keys[ki].key, k.key) < 0 {
			mergeKey(nil, &t.keys[ki])
			ki++
		}
		if ki < len(t.keys) && bytes.Equal(t.keys[ki].key, k.key) {
			mergeKey(k, &t.keys[ki])
			ki++
			continue
		}
		mergeKey(k, nil)
	}
	for ; ki < len(t.keys); ki++ {
		mergeKey(nil, &t.keys[ki])
	}
	for _, u := range wins {
		if u.k != nil {
			u.k.win, u.k.winRepl = u.win, u.repl
			if u.k.isEmpty() || u.k.doc != nil {
				s.markGC(u.k)
			}
		}
	}
	if len(added) > 0 {
		s.order.ascend(nil, nil, func(k *keyRec) bool {
			if v := k.live(); v != nil && added[v.lease] {
				s.leases[v.lease].keys[string(k.key)] = struct{}{}
			}
			return true
		})
	}

	a := &Applied{}
	if len(w.evs) > 0 {
		s.rev++
		a.Rev = s.rev
		// What made the revision: not a change, so a hash no change has
		// (a transfer never decodes as a change), distinct per revision.
		var rb [8]byte
		binary.BigEndian.PutUint64(rb[:], uint64(s.rev))
		id := sha256.Sum256(append(append([]byte(nil), b...), rb[:]...))
		s.revHash = append(s.revHash, id)
		s.log = append(s.log, revLog{evs: w.evs})
		a.Events = eventsOf(w.evs, s.rev)
		// Compaction at this revision keeps the changes from the next
		// index on (forgetBefore reads it here).
		s.known[id] = changeAt{index: s.index + 1, rev: s.rev}
	}
	s.pruneMergeRevs()
	s.mergeChains(t)
	s.gcTouched = true // the stable points may have moved: Collect walks again
	s.heads = heads
	if t.clock.Compare(s.clock) > 0 {
		s.clock = t.clock
	}
	return a, nil
}

func keyOf(k *keyRec, tk *tkey) []byte {
	if k != nil {
		return k.key
	}
	return tk.key
}

type winUpdate struct {
	k    *keyRec
	win  HLC
	repl ReplicaID
}

// recordFor returns k, creating an empty record for key when there is none.
func (s *State) recordFor(k *keyRec, key []byte) *keyRec {
	if k != nil {
		return k
	}
	k = &keyRec{key: key}
	s.keys[string(key)] = k
	s.order.insert(k)
	return k
}

// mergeBytesKey is the conflict rule for one bytes key: the sender's state
// (tk, nil for none) against ours (k, nil for none).
func (s *State) mergeBytesKey(w *writer, k *keyRec, tk *tkey, seen, seenHere func(HLC, ReplicaID) bool) (winUpdate, bool) {
	switch {
	case tk == nil:
		// No record there of a write the sender saw: deleted and collected.
		if k.win != (HLC{}) && seen(k.win, k.winRepl) && k.live() != nil {
			w.del(k.key)
			return winUpdate{k: k, win: k.win, repl: k.winRepl}, true
		}
		return winUpdate{}, false
	case k == nil && seenHere(tk.win, tk.winRepl):
		// The same, the other way: no record here of a write this replica
		// saw. A delete after it was collected here with its tombstone
		// (the sender was away past the retention, and holds the value
		// from before): the key stays deleted. Merging the sender's
		// changes one by one would drop that write as a duplicate too.
		return winUpdate{}, false
	case k != nil && !wins(tk.win, tk.winRepl, k):
		return winUpdate{}, false
	}
	k = s.recordFor(k, tk.key)
	if tk.live {
		w.put(k.key, tk.value, tk.lease)
	} else if k.live() != nil {
		w.del(k.key)
	}
	return winUpdate{k: k, win: tk.win, repl: tk.winRepl}, true
}

// mergeJSONKey joins the documents of one JSON key and applies what the
// join shows, as jsonMergeOp does for one op.
func (s *State) mergeJSONKey(w *writer, k *keyRec, tk *tkey, seen, seenHere func(HLC, ReplicaID) bool) winUpdate {
	var ours, their *jdoc
	var cur *val
	if k != nil {
		ours, cur = k.doc, k.live()
	}
	if tk != nil {
		their = tk.doc
	}
	if ours == nil && their == nil {
		// A key written before it was configured for JSON, on both
		// sides: nothing to join.
		return winUpdate{}
	}
	seenReg := func(g jreg) bool { return seen(HLC{Wall: g.wall, Logical: g.logical}, g.repl) }
	seenRegHere := func(g jreg) bool { return seenHere(HLC{Wall: g.wall, Logical: g.logical}, g.repl) }
	// Each side drops the registers the other saw and no longer has
	// (collected there with the tombstone that hid them, or superseded);
	// what both hold stays, on both sides, so the join keeps it.
	var ourRoot, theirRoot *jnode
	var ourLease, theirLease jreg
	if ours != nil {
		ourRoot, ourLease = ours.root, ours.leaseReg
	}
	if their != nil {
		theirRoot, theirLease = their.root, their.leaseReg
	}
	nd := &jdoc{}
	if ours != nil {
		nd.root = dropSeen(ours.root, theirRoot, seenReg)
		if !seenReg(ours.leaseReg) || ours.leaseReg == theirLease {
			nd.lease, nd.leaseReg = ours.lease, ours.leaseReg
		}
	}
	if their != nil {
		nd.root = join(nd.root, dropSeen(their.root, ourRoot, seenRegHere))
		if (!seenRegHere(their.leaseReg) || their.leaseReg == ourLease) && their.leaseReg.compare(nd.leaseReg) > 0 {
			nd.lease, nd.leaseReg = their.lease, their.leaseReg
		}
	}
	k = s.recordFor(k, keyOf(k, tk))
	if nd.live() {
		if v := nd.render(); cur == nil || !bytes.Equal(cur.value, v) || cur.lease != nd.lease {
			w.putOp(k.key, v, nil, nd.lease)
		}
	} else if cur != nil {
		w.del(k.key)
	}
	k.doc = nd
	u := winUpdate{k: k, win: k.win, repl: k.winRepl}
	if tk != nil && wins(tk.win, tk.winRepl, k) {
		u.win, u.repl = tk.win, tk.winRepl
	}
	return u
}

// dropSeen is n without the assignments and clears seen reports true for
// that other (the node at the same path on the other side, nil for none)
// does not hold too, and without the nodes left with nothing.
func dropSeen(n, other *jnode, seen func(jreg) bool) *jnode {
	if n == nil {
		return nil
	}
	out := &jnode{kind: n.kind, clear: n.clear}
	if out.kind != nil && seen(out.kind.reg) && (other == nil || other.kind == nil || other.kind.reg != out.kind.reg) {
		out.kind = nil
	}
	if out.clear != (jreg{}) && seen(out.clear) && (other == nil || other.clear != out.clear) {
		out.clear = jreg{}
	}
	for name, f := range n.fields {
		var of *jnode
		if other != nil {
			of = other.fields[name]
		}
		if nf := dropSeen(f, of, seen); nf != nil {
			if out.fields == nil {
				out.fields = map[string]*jnode{}
			}
			out.fields[name] = nf
		}
	}
	if out.kind == nil && out.clear == (jreg{}) && len(out.fields) == 0 {
		return nil
	}
	return out
}

// mergedHeads is the frontier of both sides' changes: a head one side
// has that the other holds, not as a head, has a descendant there.
func (s *State) mergedHeads(t *transfer, theirs map[ReplicaID]*tchain) []Hash {
	theirHead := make(map[Hash]bool, len(t.heads))
	for _, h := range t.heads {
		theirHead[h.id] = true
	}
	var out []Hash
	for _, h := range s.heads {
		r, seq, ok := s.ChainPos(h)
		if c := theirs[r]; theirHead[h] || !ok || c == nil || seq > c.n {
			out = append(out, h)
		}
	}
	for _, h := range t.heads {
		if slices.Contains(s.heads, h.id) {
			continue
		}
		if ch := s.chains[h.repl]; ch == nil || h.seq > ch.n {
			out = append(out, h.id)
		}
	}
	sortHashes(out)
	return slices.Compact(out)
}

// mergeChains advances each chain to the larger of both, with the larger
// stable point (the sender's collected history is collected here too),
// and books the sender's hashes as applied (compacted, not collected).
func (s *State) mergeChains(t *transfer) {
	byRepl := map[ReplicaID][]thash{}
	for _, h := range t.hashes {
		byRepl[h.repl] = append(byRepl[h.repl], h)
	}
	for _, c := range t.chains {
		ch := s.chainOf(c.repl)
		stable := max(ch.stable, c.stable)
		base := max(1, stable)
		// The stamps from base on: ours when we are ahead (base is at
		// least our base), theirs otherwise (base is at least theirs).
		if c.n > ch.n {
			ch.stamps = slices.Clone(c.stamps[base-max(1, c.stable):])
		} else {
			ch.stamps = slices.Clone(ch.stamps[base-ch.base:])
		}
		ch.n, ch.stable, ch.base = max(ch.n, c.n), stable, base
		ch.last = ch.stamps[len(ch.stamps)-1]
		gone := ch.gone[:0:0]
		for _, g := range ch.gone {
			if g.seq < stable {
				delete(s.forgotten, g.id)
				continue
			}
			gone = append(gone, g)
		}
		for _, h := range byRepl[c.repl] {
			if h.seq < stable {
				continue
			}
			if _, ok := s.known[h.id]; ok {
				continue
			}
			if _, ok := s.forgotten[h.id]; ok {
				continue
			}
			s.forgotten[h.id] = chainPos{repl: h.repl, seq: h.seq}
			gone = append(gone, goneRef{seq: h.seq, id: h.id})
		}
		slices.SortFunc(gone, func(a, b goneRef) int { return cmpInt(a.seq, b.seq) })
		ch.gone = gone
	}
}

// pruneMergeRevs drops what snapshot merges booked as known for revisions
// compaction has passed: nothing else drops them (they are not changes of
// the index map), so each merge clears its predecessors'.
func (s *State) pruneMergeRevs() {
	idx := make(map[Hash]bool, len(s.idxHash))
	for _, h := range s.idxHash {
		idx[h] = true
	}
	for h, at := range s.known {
		if !idx[h] && at.rev < s.revBase {
			delete(s.known, h)
		}
	}
}
