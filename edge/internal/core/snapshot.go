package core

// Snapshots (issue 16, "bounded history"): the whole state in one byte
// string, so the shell can checkpoint it and drop the change log before
// it, and a restart restores it instead of replaying from index 1.
//
// # What a snapshot holds
//
// Everything a later request, merge, compaction or replay can observe:
// the MVCC history since the compaction (every generation and version),
// the event log from the compaction revision on, each key's conflict-rule
// winner and JSON document, the leases (with this replica's own expiries,
// the granter and the attached keys), the heads, the clock, the index,
// revision and compaction revision, the bookkeeping of history (index and
// revision to hash, the changes known as applied and the ones compaction
// forgot), the chain tracking (gc.go: per replica its count, stamps and
// stable point), the records kept for Collect and the lease sequence. Not in it: the configuration the shell
// sets (SetMaxTxnOps, SetMinLeaseTTL, SetValueMerge): the caller sets it
// again on the restored state, as it does on New before Replay.
//
// # Encoding (version 1)
//
// Canonical, like a change's (doc.go): fixed-width integers big-endian,
// varints minimal, everything that is a set in a fixed order, so one
// state has one snapshot and Restore(Snapshot(x)) encodes back to the
// same bytes. Restore refuses anything else (another version, broken
// invariants, non-minimal varints, trailing bytes).
//
//	bytes    magic 0xf5 'S', version 1
//	uint64   replica id
//	int64    clock wall; uint32 clock logical
//	int64    rev; int64 compact rev (-1: none; 0 and 1 compact nothing)
//	uvarint  index; uvarint lease sequence
//	byte     1 when a record Collect looks at changed since its last walk, else 0
//	uvarint  number of heads, then each head's 32 bytes, sorted, distinct
//	uvarint  number of chains, then per replica in id order: uint64 id;
//	         uvarint count n; uvarint stable count; the stamps (HLC) of
//	         its changes max(1, stable) to n; uvarint number of compacted
//	         changes not yet collected, each uvarint seq and 32 bytes, in
//	         seq order (they are the forgotten hashes)
//	uvarint  first index still mapped (idxBase), then for each index from
//	         it to index the change's 32 bytes, uint64 replica, uvarint seq
//	         for each revision from max(2, compact rev) to rev: the 32 bytes
//	         of what made it
//	uvarint  number of other known hashes (not a change of the index map:
//	         a snapshot merge's revision), then each as 32 bytes, uvarint
//	         index, uvarint rev, uint64 replica, uvarint seq; sorted by hash
//	uvarint  number of keys, then per key in key order:
//	  uvarint len, key; HLC winner; uint64 winner replica; byte flags
//	  (1 listed for compaction, 2 has a JSON document, 4 listed for
//	  Collect); uvarint number of generations, per generation
//	  uvarint versions put; uvarint created; uvarint number of versions,
//	  per version uvarint main; uvarint sub; byte 1 tombstone, or 0 and a
//	  value (below)
//	  document (flag 2): int64 lease; register; byte 1 and a node, or 0
//	for each revision from max(2, compact rev) to rev, its events:
//	  uvarint number, then per event byte flags (1 delete, 2 has prev);
//	  uvarint len, key; the value put (not for a delete); the previous
//	  value (flag 2)
//	uvarint  number of leases, then per lease in id order: int64 id; int64
//	         ttl; uint64 granter; HLC grant stamp; byte 1 and int64 expiry (unix ns), or 0
//	         (no expiry here); uvarint number of keys, each uvarint len, key,
//	         sorted
//
//	value    uvarint len, bytes; uvarint create; uvarint mod; uvarint
//	         version; int64 lease
//	HLC      int64 wall; uint32 logical
//	register int64 wall; uint32 logical; uint64 replica; uint32 op
//	node     byte 0 no assignment, or the kind (1 absent, 2 scalar,
//	         3 object), its register and for a scalar uvarint len, bytes;
//	         the clear register; uvarint number of fields, then per field
//	         uvarint len, name; node; names sorted and distinct

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"
	"unicode/utf8"
)

// SnapshotVersion is the version byte of a snapshot's encoding.
const SnapshotVersion = 1

var snapshotMagic = []byte{0xf5, 'S'}

// Snapshot encodes the whole state (see above). The state is not changed.
func (s *State) Snapshot() []byte {
	b := make([]byte, 0, 1024)
	b = append(b, snapshotMagic...)
	b = append(b, SnapshotVersion)
	b = binary.BigEndian.AppendUint64(b, uint64(s.id))
	b = appendHLC(b, s.clock)
	b = binary.BigEndian.AppendUint64(b, uint64(s.rev))
	b = binary.BigEndian.AppendUint64(b, uint64(s.compactRev))
	b = binary.AppendUvarint(b, s.index)
	b = binary.AppendUvarint(b, s.leaseSeq)
	if s.gcTouched {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	b = appendHashes(b, s.heads)

	repls := make([]ReplicaID, 0, len(s.chains))
	for r := range s.chains {
		repls = append(repls, r)
	}
	slices.Sort(repls)
	b = binary.AppendUvarint(b, uint64(len(repls)))
	for _, r := range repls {
		ch := s.chains[r]
		b = binary.BigEndian.AppendUint64(b, uint64(r))
		b = binary.AppendUvarint(b, ch.n)
		b = binary.AppendUvarint(b, ch.stable)
		for _, st := range ch.stamps {
			b = appendHLC(b, st)
		}
		b = binary.AppendUvarint(b, uint64(len(ch.gone)))
		for _, g := range ch.gone {
			b = binary.AppendUvarint(b, g.seq)
			b = append(b, g.id[:]...)
		}
	}

	b = binary.AppendUvarint(b, s.idxBase)
	for _, h := range s.idxHash {
		at := s.known[h]
		b = append(b, h[:]...)
		b = binary.BigEndian.AppendUint64(b, uint64(at.repl))
		b = binary.AppendUvarint(b, at.seq)
	}
	for _, h := range s.revHash {
		b = append(b, h[:]...)
	}
	var extra []Hash
	for h, at := range s.known {
		if at.index < s.idxBase || at.index > s.index || s.idxHash[at.index-s.idxBase] != h {
			extra = append(extra, h)
		}
	}
	sortHashes(extra)
	b = binary.AppendUvarint(b, uint64(len(extra)))
	for _, h := range extra {
		at := s.known[h]
		b = append(b, h[:]...)
		b = binary.AppendUvarint(b, at.index)
		b = binary.AppendUvarint(b, uint64(at.rev))
		b = binary.BigEndian.AppendUint64(b, uint64(at.repl))
		b = binary.AppendUvarint(b, at.seq)
	}

	b = binary.AppendUvarint(b, uint64(s.order.n))
	s.order.ascend(nil, nil, func(k *keyRec) bool {
		b = appendKeyRec(b, k)
		return true
	})
	for _, l := range s.log {
		b = binary.AppendUvarint(b, uint64(len(l.evs)))
		for i := range l.evs {
			e := &l.evs[i]
			var f byte
			if e.del {
				f |= 1
			}
			if e.hasPrev {
				f |= 2
			}
			b = append(b, f)
			b = appendBytes(b, e.key)
			if !e.del {
				b = appendVal(b, &e.cur)
			}
			if e.hasPrev {
				b = appendVal(b, &e.prev)
			}
		}
	}
	ids := s.leaseIDs()
	b = binary.AppendUvarint(b, uint64(len(ids)))
	for _, id := range ids {
		l := s.leases[id]
		b = binary.BigEndian.AppendUint64(b, uint64(l.id))
		b = binary.BigEndian.AppendUint64(b, uint64(l.ttl))
		b = binary.BigEndian.AppendUint64(b, uint64(l.granter))
		b = appendHLC(b, l.stamp)
		if l.expiry.IsZero() {
			b = append(b, 0)
		} else {
			b = append(b, 1)
			b = binary.BigEndian.AppendUint64(b, uint64(l.expiry.UnixNano()))
		}
		keys := sortedKeys(l.keys)
		b = binary.AppendUvarint(b, uint64(len(keys)))
		for _, k := range keys {
			b = appendBytes(b, []byte(k))
		}
	}
	return b
}

func appendHLC(b []byte, h HLC) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(h.Wall))
	return binary.BigEndian.AppendUint32(b, h.Logical)
}

func appendHashes(b []byte, hs []Hash) []byte {
	b = binary.AppendUvarint(b, uint64(len(hs)))
	for _, h := range hs {
		b = append(b, h[:]...)
	}
	return b
}

func sortHashes(hs []Hash) {
	slices.SortFunc(hs, func(a, b Hash) int { return bytes.Compare(a[:], b[:]) })
}

func appendVal(b []byte, v *val) []byte {
	b = appendBytes(b, v.value)
	b = binary.AppendUvarint(b, uint64(v.create))
	b = binary.AppendUvarint(b, uint64(v.mod))
	b = binary.AppendUvarint(b, uint64(v.ver))
	return binary.BigEndian.AppendUint64(b, uint64(v.lease))
}

// appendKeyHead is how a snapshot and a transfer both start a key: the
// key, its winner and the winner's replica.
func appendKeyHead(b, key []byte, win HLC, repl ReplicaID) []byte {
	b = appendBytes(b, key)
	b = appendHLC(b, win)
	return binary.BigEndian.AppendUint64(b, uint64(repl))
}

// keyHead reads what appendKeyHead wrote.
func (d *snapDecoder) keyHead() (key []byte, win HLC, repl ReplicaID) {
	return d.bytes(), d.hlc(), ReplicaID(d.u64())
}

// doc reads what appendDoc wrote.
func (d *snapDecoder) doc() *jdoc {
	doc := &jdoc{lease: d.i64(), leaseReg: d.reg()}
	switch d.byte1() {
	case 0:
	case 1:
		doc.root = decodeState(d, 0)
	default:
		d.fail("bad document root flag")
	}
	return doc
}

func appendKeyRec(b []byte, k *keyRec) []byte {
	b = appendKeyHead(b, k.key, k.win, k.winRepl)
	var f byte
	if k.dirty {
		f |= 1
	}
	if k.doc != nil {
		f |= 2
	}
	if k.gc {
		f |= 4
	}
	b = append(b, f)
	b = binary.AppendUvarint(b, uint64(len(k.gens)))
	for gi := range k.gens {
		g := &k.gens[gi]
		b = binary.AppendUvarint(b, uint64(g.ver))
		b = binary.AppendUvarint(b, uint64(g.created))
		b = binary.AppendUvarint(b, uint64(len(g.revs)))
		for i := range g.revs {
			v := &g.revs[i]
			b = binary.AppendUvarint(b, uint64(v.main))
			b = binary.AppendUvarint(b, uint64(v.sub))
			if v.tomb {
				b = append(b, 1)
				continue
			}
			b = append(b, 0)
			b = appendVal(b, &v.v)
		}
	}
	if k.doc != nil {
		b = appendDoc(b, k.doc)
	}
	return b
}

func appendDoc(b []byte, d *jdoc) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(d.lease))
	b = appendReg(b, d.leaseReg)
	if d.root == nil {
		return append(b, 0)
	}
	b = append(b, 1)
	return appendState(b, d.root)
}

func appendReg(b []byte, r jreg) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(r.wall))
	b = binary.BigEndian.AppendUint32(b, r.logical)
	b = binary.BigEndian.AppendUint64(b, uint64(r.repl))
	return binary.BigEndian.AppendUint32(b, r.op)
}

// appendState encodes a document node with its registers (a patch's
// encoding, appendNode, has none).
func appendState(b []byte, n *jnode) []byte {
	if n.kind == nil {
		b = append(b, 0)
	} else {
		b = append(b, byte(n.kind.kind))
		b = appendReg(b, n.kind.reg)
		if n.kind.kind == jScalar {
			b = appendBytes(b, n.kind.scalar)
		}
	}
	b = appendReg(b, n.clear)
	names := make([]string, 0, len(n.fields))
	for name := range n.fields {
		names = append(names, name)
	}
	sort.Strings(names)
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, name := range names {
		b = appendBytes(b, []byte(name))
		b = appendState(b, n.fields[name])
	}
	return b
}

// Restore rebuilds the state Snapshot encoded, as replica id (the one the
// snapshot was taken of: a state's own changes are told from merged ones
// by its id, so another id is refused). The configuration is the
// default's: set it as after New. Restore(id, s.Snapshot()) answers every
// later call as s would; its leases keep the expiries they had (call
// PromoteLeases after a restart, as after Replay). Restore copies
// nothing out of b it does not need, but the state keeps slices of it:
// b must not be modified afterwards.
func Restore(id ReplicaID, b []byte) (*State, error) {
	s, err := decodeSnapshot(id, b)
	if err != nil {
		return nil, fmt.Errorf("core: restore: %w", err)
	}
	// Like DecodeChange: only the encoding Snapshot makes is accepted, so
	// a snapshot's meaning is a function of its bytes. Re-encoding is the
	// exact check (minimal varints, orders, flags).
	if !bytes.Equal(s.Snapshot(), b) {
		return nil, errors.New("core: restore: snapshot not in canonical form")
	}
	return s, nil
}

// snapDecoder adds to decoder what snapshots need.
type snapDecoder struct {
	decoder
}

func (d *snapDecoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf(format, args...)
	}
}

func (d *snapDecoder) i64() int64 { return int64(d.u64()) }

func (d *snapDecoder) u32() uint32 {
	if v := d.next(4); v != nil {
		return binary.BigEndian.Uint32(v)
	}
	return 0
}

func (d *snapDecoder) byte1() byte {
	if v := d.next(1); v != nil {
		return v[0]
	}
	return 0
}

func (d *snapDecoder) hash() Hash {
	var h Hash
	copy(h[:], d.next(32))
	return h
}

// count reads a number of items each at least min bytes long, refusing
// counts the rest of the input cannot hold (so hostile counts allocate
// nothing).
func (d *snapDecoder) count(what string, min int) int {
	n := d.uvarint()
	if d.err == nil && n > uint64(len(d.b)/min) {
		d.fail("%d %s: %w", n, what, errShort)
	}
	if d.err != nil {
		return 0
	}
	return int(n)
}

// nonNeg reads a uvarint that must fit an int64.
func (d *snapDecoder) nonNeg(what string) int64 {
	v := d.uvarint()
	if v > 1<<62 {
		d.fail("%s %d out of range", what, v)
		return 0
	}
	return int64(v)
}

func (d *snapDecoder) hlc() HLC { return HLC{Wall: d.i64(), Logical: d.u32()} }

func (d *snapDecoder) reg() jreg {
	return jreg{wall: d.i64(), logical: d.u32(), repl: ReplicaID(d.u64()), op: d.u32()}
}

func (d *snapDecoder) val(rev int64) val {
	v := val{value: d.bytes()}
	v.create = d.nonNeg("create revision")
	v.mod = d.nonNeg("mod revision")
	v.ver = d.nonNeg("version")
	v.lease = d.i64()
	if d.err == nil && (v.mod < 2 || v.mod > rev || v.create < 2 || v.create > v.mod || v.ver < 1) {
		d.fail("value with create %d, mod %d, version %d at revision %d", v.create, v.mod, v.ver, rev)
	}
	return v
}

func decodeSnapshot(id ReplicaID, b []byte) (*State, error) {
	if !bytes.HasPrefix(b, snapshotMagic) || len(b) < len(snapshotMagic)+1 {
		return nil, errors.New("not a snapshot")
	}
	if v := b[len(snapshotMagic)]; v != SnapshotVersion {
		return nil, fmt.Errorf("snapshot version %d, want %d", v, SnapshotVersion)
	}
	d := &snapDecoder{decoder{b: b[len(snapshotMagic)+1:]}}
	s := New(id)
	if got := ReplicaID(d.u64()); d.err == nil && got != id {
		return nil, fmt.Errorf("snapshot of replica %d, not %d", got, id)
	}
	s.clock = d.hlc()
	s.rev = d.i64()
	s.compactRev = d.i64()
	s.index = d.uvarint()
	s.leaseSeq = d.uvarint()
	switch d.byte1() {
	case 0:
	case 1:
		s.gcTouched = true
	default:
		d.fail("bad state flags")
	}
	if d.err != nil {
		return nil, d.err
	}
	if s.rev < 1 || s.compactRev < -1 || s.compactRev > s.rev || s.index > 1<<62 {
		return nil, fmt.Errorf("revision %d, compaction %d, index %d", s.rev, s.compactRev, s.index)
	}
	s.revBase, s.logBase = max(2, s.compactRev), max(2, s.compactRev)
	nheads := d.count("heads", 32)
	for i := range nheads {
		h := d.hash()
		if i > 0 && bytes.Compare(s.heads[i-1][:], h[:]) >= 0 {
			d.fail("heads not sorted and distinct")
		}
		s.heads = append(s.heads, h)
	}

	if err := decodeChains(d, s); err != nil {
		return nil, err
	}

	s.idxBase = d.uvarint()
	if d.err != nil {
		return nil, d.err
	}
	if s.idxBase < 1 || s.idxBase > s.index+1 {
		return nil, fmt.Errorf("index map from %d with index %d", s.idxBase, s.index)
	}
	nidx := s.index - s.idxBase + 1
	nrev := uint64(s.rev - s.revBase + 1)
	if nidx > uint64(len(d.b)/41) || nrev > uint64(len(d.b)/32) || nidx*41+nrev*32 > uint64(len(d.b)) {
		return nil, fmt.Errorf("%d indexes and %d revisions mapped: %w", nidx, nrev, errShort)
	}
	s.idxHash = make([]Hash, nidx)
	lastSeq := map[ReplicaID]uint64{}
	for i := range s.idxHash {
		h := d.hash()
		at := changeAt{index: s.idxBase + uint64(i), repl: ReplicaID(d.u64()), seq: d.uvarint()}
		if d.err != nil {
			return nil, d.err
		}
		if _, dup := s.known[h]; dup {
			return nil, fmt.Errorf("change %s at two indexes", h)
		}
		if _, dup := s.forgotten[h]; dup {
			return nil, fmt.Errorf("change %s both known and forgotten", h)
		}
		// Changes are applied in their author's chain order, so along
		// the index a replica's seqs increase; forget (compaction) needs
		// each one's chain.
		ch := s.chains[at.repl]
		if ch == nil || at.seq == 0 || at.seq > ch.n || at.seq <= lastSeq[at.repl] {
			return nil, fmt.Errorf("index %d: change %d of replica %d out of its chain", at.index, at.seq, at.repl)
		}
		lastSeq[at.repl] = at.seq
		s.idxHash[i], s.known[h] = h, at
	}
	s.revHash = make([]Hash, nrev)
	for i := range s.revHash {
		s.revHash[i] = d.hash()
	}
	nextra := d.count("known hashes", 44)
	var prev Hash
	for i := range nextra {
		h := d.hash()
		at := changeAt{index: d.uvarint(), rev: d.nonNeg("revision"), repl: ReplicaID(d.u64()), seq: d.uvarint()}
		if d.err != nil {
			return nil, d.err
		}
		_, gone := s.forgotten[h]
		if _, dup := s.known[h]; dup || gone || (i > 0 && bytes.Compare(prev[:], h[:]) >= 0) {
			return nil, errors.New("known hashes not sorted, distinct and apart from the index map")
		}
		// A snapshot merge's revision stays known after compaction has
		// dropped it from the revision map (nothing drops it: it is not a
		// change of the index map), so only while it is mapped must it be
		// where the map says.
		if at.index < 1 || at.index > s.index+1 || at.rev < 2 || at.rev > s.rev ||
			(at.rev >= s.revBase && (at.index < s.idxBase || s.revHash[at.rev-s.revBase] != h)) {
			return nil, fmt.Errorf("known hash %s at index %d, revision %d: not where the maps say", h, at.index, at.rev)
		}
		s.known[h], prev = at, h
	}
	for i, h := range s.revHash {
		at, ok := s.known[h]
		r := s.revBase + int64(i)
		switch {
		case !ok:
			return nil, fmt.Errorf("revision %d made by %s, which is not known", r, h)
		case at.rev != 0 && at.rev != r:
			return nil, fmt.Errorf("change %s made revisions %d and %d", h, at.rev, r)
		}
		at.rev = r
		s.known[h] = at
	}
	for _, h := range s.heads {
		_, k := s.known[h]
		_, f := s.forgotten[h]
		if !k && !f {
			return nil, fmt.Errorf("head %s is not applied", h)
		}
	}

	nkeys := d.count("keys", 24)
	var last []byte
	for i := range nkeys {
		k := decodeKeyRec(d, s.rev)
		if d.err != nil {
			return nil, fmt.Errorf("key %d: %w", i, d.err)
		}
		if i > 0 && bytes.Compare(last, k.key) >= 0 {
			return nil, fmt.Errorf("key %q after %q: not in key order", k.key, last)
		}
		last = k.key
		s.keys[string(k.key)] = k
		s.order.insert(k)
		if k.dirty {
			s.dirty = append(s.dirty, k)
		}
		if k.gc {
			s.gcKeys = append(s.gcKeys, k)
		}
	}
	s.log = make([]revLog, s.rev-s.logBase+1)
	for i := range s.log {
		r := s.logBase + int64(i)
		n := d.count("events", 2)
		if n > 0 {
			s.log[i].evs = make([]logEv, n)
		}
		for j := range s.log[i].evs {
			e := &s.log[i].evs[j]
			f := d.byte1()
			if f > 3 {
				d.fail("revision %d event %d: flags %#x", r, j, f)
			}
			e.del, e.hasPrev = f&1 != 0, f&2 != 0
			e.key = d.bytes()
			if d.err == nil && len(e.key) == 0 {
				d.fail("revision %d event %d: empty key", r, j)
			}
			if !e.del {
				e.cur = d.val(r)
			}
			if e.hasPrev {
				e.prev = d.val(r - 1)
			}
			if k := s.keys[string(e.key)]; k != nil {
				e.rec, e.key = k, k.key
			}
		}
		if d.err != nil {
			return nil, fmt.Errorf("revision %d: %w", r, d.err)
		}
	}
	nleases := d.count("leases", 38)
	var lastID int64
	for i := range nleases {
		l := &leaseRec{id: d.i64(), ttl: d.i64(), granter: ReplicaID(d.u64()), stamp: d.hlc(), keys: map[string]struct{}{}}
		switch d.byte1() {
		case 0:
		case 1:
			l.expiry = time.Unix(0, d.i64())
		default:
			d.fail("lease %d: bad expiry flag", l.id)
		}
		nk := d.count("lease keys", 1)
		var lastKey string
		for j := range nk {
			k := string(d.bytes())
			if d.err == nil && (k == "" || (j > 0 && k <= lastKey)) {
				d.fail("lease %d: keys not sorted, distinct, non-empty", l.id)
			}
			l.keys[k], lastKey = struct{}{}, k
		}
		if d.err != nil {
			return nil, fmt.Errorf("lease %d: %w", i, d.err)
		}
		// Ids and TTLs are whatever the granting changes said (a merged
		// grant is not checked), so only the order is.
		if i > 0 && l.id <= lastID {
			return nil, fmt.Errorf("lease %d after %d: ids not sorted and distinct", l.id, lastID)
		}
		s.leases[l.id], lastID = l, l.id
	}
	if d.err != nil {
		return nil, d.err
	}
	if len(d.b) != 0 {
		return nil, fmt.Errorf("%d trailing bytes", len(d.b))
	}
	// A lease's keys are the live keys put with it (putOp and del keep it
	// so); revoking it deletes them, so each must be there to delete.
	for _, id := range s.leaseIDs() {
		for k := range s.leases[id].keys {
			kr := s.keys[k]
			if kr == nil || kr.live() == nil || kr.live().lease != id {
				return nil, fmt.Errorf("lease %d holds key %q, which is not live with it", id, k)
			}
		}
	}
	return s, nil
}

// decodeChains reads the chain tracking (gc.go): per replica the count,
// the stable count, the stamps from max(1, stable) on, and the compacted
// changes not yet collected (which are the forgotten hashes).
func decodeChains(d *snapDecoder, s *State) error {
	n := d.count("chains", 11)
	var prev ReplicaID
	for i := range n {
		r := ReplicaID(d.u64())
		ch := &chain{n: d.uvarint(), stable: d.uvarint()}
		if d.err != nil {
			return d.err
		}
		if i > 0 && r <= prev {
			return fmt.Errorf("chain of replica %d after %d: not sorted and distinct", r, prev)
		}
		if ch.stable > ch.n || ch.n > 1<<62 {
			return fmt.Errorf("chain of replica %d: stable %d of %d", r, ch.stable, ch.n)
		}
		ch.base = max(1, ch.stable)
		ns := ch.n + 1 - ch.base
		if ns > uint64(len(d.b)/12) {
			return fmt.Errorf("chain of replica %d: %d stamps: %w", r, ns, errShort)
		}
		ch.stamps = make([]HLC, ns)
		for j := range ch.stamps {
			ch.stamps[j] = d.hlc()
			if j > 0 && ch.stamps[j].Compare(ch.stamps[j-1]) <= 0 {
				return fmt.Errorf("chain of replica %d: stamps do not increase", r)
			}
		}
		if ns > 0 {
			ch.last = ch.stamps[ns-1]
		}
		ng := d.count("compacted changes", 33)
		for j := range ng {
			g := goneRef{seq: d.uvarint(), id: d.hash()}
			if d.err != nil {
				return d.err
			}
			if g.seq < ch.stable || g.seq == 0 || g.seq > ch.n || (j > 0 && g.seq <= ch.gone[j-1].seq) {
				return fmt.Errorf("chain of replica %d: compacted change %d out of order or range", r, g.seq)
			}
			if _, dup := s.forgotten[g.id]; dup {
				return fmt.Errorf("compacted change %s twice", g.id)
			}
			ch.gone = append(ch.gone, g)
			s.forgotten[g.id] = chainPos{repl: r, seq: g.seq}
		}
		s.chains[r], prev = ch, r
	}
	return d.err
}

// decodeKeyRec reads one key record, holding its history to the shape the
// index keeps (index.go): generations but the last end with a tombstone,
// versions in (main, sub) order at or before rev, values stamped with
// their own revision.
func decodeKeyRec(d *snapDecoder, rev int64) *keyRec {
	k := &keyRec{}
	k.key, k.win, k.winRepl = d.keyHead()
	if d.err == nil && len(k.key) == 0 {
		d.fail("empty key")
	}
	f := d.byte1()
	if f > 7 {
		d.fail("flags %#x", f)
	}
	k.dirty, k.gc = f&1 != 0, f&4 != 0
	ngens := d.count("generations", 3)
	if ngens > 0 {
		k.gens = make([]generation, ngens)
	}
	var pm, ps int64 = 0, -1
	for gi := range k.gens {
		g := &k.gens[gi]
		g.ver = d.nonNeg("generation versions")
		g.created = d.nonNeg("generation creation")
		n := d.count("versions", 3)
		if n > 0 {
			g.revs = make([]version, n)
		}
		for i := range g.revs {
			v := &g.revs[i]
			v.main = d.nonNeg("main revision")
			v.sub = d.nonNeg("sub revision")
			switch d.byte1() {
			case 0:
				v.v = d.val(rev)
				if d.err == nil && v.v.mod != v.main {
					d.fail("version at %d holds a value of revision %d", v.main, v.v.mod)
				}
			case 1:
				v.tomb = true
			default:
				d.fail("bad tombstone flag")
			}
			if d.err != nil {
				return k
			}
			if v.main < 2 || v.main > rev || v.main < pm || (v.main == pm && v.sub <= ps) {
				d.fail("version (%d, %d) after (%d, %d) at revision %d", v.main, v.sub, pm, ps, rev)
				return k
			}
			pm, ps = v.main, v.sub
			if v.tomb != (i == len(g.revs)-1 && gi < len(k.gens)-1) {
				d.fail("generation %d: a tombstone must end it, and only one that is not the last", gi)
				return k
			}
		}
		if d.err == nil && gi < len(k.gens)-1 && len(g.revs) == 0 {
			d.fail("generation %d of %d is empty", gi, len(k.gens))
		}
	}
	if f&2 != 0 {
		k.doc = d.doc()
	}
	return k
}

func decodeState(d *snapDecoder, depth int) *jnode {
	if depth > maxPatchDepth+1 {
		d.fail("document too deep")
		return nil
	}
	n := &jnode{}
	switch kind := jkind(d.byte1()); kind {
	case 0:
	case jAbsent, jObject:
		n.kind = &jassign{kind: kind, reg: d.reg()}
	case jScalar:
		n.kind = &jassign{kind: kind, reg: d.reg(), scalar: d.bytes()}
		if n.kind.scalar == nil {
			n.kind.scalar = []byte{}
		}
	default:
		d.fail("bad assignment kind %d", kind)
	}
	n.clear = d.reg()
	nf := d.count("fields", 2)
	if nf > 0 {
		n.fields = make(map[string]*jnode, nf)
	}
	prev := ""
	for i := 0; i < nf && d.err == nil; i++ {
		name := string(d.bytes())
		if (i > 0 && name <= prev) || !utf8.ValidString(name) {
			d.fail("field names not sorted, distinct UTF-8")
			return n
		}
		prev = name
		if f := decodeState(d, depth+1); f != nil {
			n.fields[name] = f
		}
	}
	return n
}
