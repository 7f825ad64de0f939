package core

import (
	"bytes"
	"fmt"
	"hash/crc32"
	"slices"
	"sort"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// Applied is what the shell must persist (Encoded, before acking) and
// publish (Events) for one change.
type Applied struct {
	ID      Hash
	Encoded []byte
	Index   uint64
	Rev     int64           // 0 when the change does not touch keys
	Events  []*mvccpb.Event // Kv.ModRevision == Rev; PrevKv filled as etcd's watch fills it: the value at Rev-1, except on a create (version 1)
	Change  *Change         // the change Encoded encodes
}

// DefaultMaxTxnOps is etcd's default --max-txn-ops.
const DefaultMaxTxnOps = 128

// DefaultMinLeaseTTL is the minimum TTL etcd grants with its default
// timing: ceil(1.5 × election timeout 1000ms) = 2 seconds
// (server/etcdserver/server.go, MinLeaseTTL).
const DefaultMinLeaseTTL = 2

// MaxLeaseTTL is etcd's lease.MaxLeaseTTL.
const MaxLeaseTTL = 9000000000

// State is one replica's whole in-memory state: its changes' bookkeeping,
// the MVCC key space and the leases. It is not safe for concurrent use: the
// shell serialises calls (writes are applied one at a time, as etcd's
// apply loop does).
type State struct {
	id          ReplicaID
	maxTxnOps   int
	minLeaseTTL int64

	clock HLC
	heads []Hash

	index      uint64
	rev        int64
	compactRev int64

	keys  map[string]*keyRec
	order ordered

	// The change of index i is idxHash[i-idxBase], of revision r
	// revHash[r-revBase] (revision 1 is the empty store, as in etcd); known
	// maps back. All three keep the changes since the compaction: history
	// is bounded, as etcd's.
	idxHash []Hash
	idxBase uint64
	revHash []Hash
	revBase int64
	known   map[Hash]changeAt
	// forgotten are the changes compaction dropped from known: still
	// applied here, so Merge accepts them as parents. Each is also in its
	// chain's gone list (chain order), which Collect prunes: the map is
	// bounded by the changes not yet causally stable.
	forgotten map[Hash]chainPos

	// chains is, per replica, its chain as applied here (gc.go).
	chains map[ReplicaID]*chain

	log     []revLog // log[r-logBase]: the events of revision r, for r >= logBase
	logBase int64

	// dirty are the keys compaction may shorten (Compact).
	dirty []*keyRec
	// gcKeys are the records Collect looks at: left without versions and
	// kept for their winner, or JSON documents holding unstable registers.
	gcKeys []*keyRec

	leases   map[int64]*leaseRec
	leaseSeq uint64

	// vm says which keys merge as JSON documents (merge_json.go).
	vm ValueMerge
}

type changeAt struct {
	index uint64
	rev   int64
	repl  ReplicaID
	seq   uint64 // place in repl's chain
}

// revLog is one revision's events: each put's or delete's key, the value
// it stored (a put) and the key's value before the change.
type revLog struct {
	evs []logEv
}

type logEv struct {
	rec     *keyRec
	key     []byte
	del     bool
	hasPrev bool
	cur     val // the put's value (unset for a delete)
	prev    val // the value before the change, when hasPrev
}

// New returns the empty state of replica id. As in etcd the empty store is
// at revision 1 and its compaction revision is -1 (nothing compacted).
func New(id ReplicaID) *State {
	return &State{
		id:          id,
		maxTxnOps:   DefaultMaxTxnOps,
		minLeaseTTL: DefaultMinLeaseTTL,
		rev:         1,
		compactRev:  -1,
		logBase:     2,
		idxBase:     1,
		revBase:     2,
		keys:        make(map[string]*keyRec),
		known:       make(map[Hash]changeAt),
		forgotten:   make(map[Hash]chainPos),
		chains:      make(map[ReplicaID]*chain),
		leases:      make(map[int64]*leaseRec),
	}
}

// SetMaxTxnOps sets etcd's --max-txn-ops (n <= 0: the default).
func (s *State) SetMaxTxnOps(n int) {
	if n <= 0 {
		n = DefaultMaxTxnOps
	}
	s.maxTxnOps = n
}

// SetMinLeaseTTL sets the smallest TTL granted, in seconds (etcd derives it
// from its election timeout; ttl <= 0: the default).
func (s *State) SetMinLeaseTTL(ttl int64) {
	if ttl <= 0 {
		ttl = DefaultMinLeaseTTL
	}
	s.minLeaseTTL = ttl
}

// Replica is this replica's id.
func (s *State) Replica() ReplicaID { return s.id }

// Rev is the current revision (1 for the empty store).
func (s *State) Rev() int64 { return s.rev }

// CompactRev is the revision of the last compaction, -1 before the first.
func (s *State) CompactRev() int64 { return s.compactRev }

// Index is the number of changes applied.
func (s *State) Index() uint64 { return s.index }

// Clock is the stamp of the last change this replica made or applied.
func (s *State) Clock() HLC { return s.clock }

// Heads is the replica's frontier: the changes no applied change has as
// parent (one, unless concurrent changes were merged and no local change
// has joined them yet), sorted.
func (s *State) Heads() []Hash { return append([]Hash(nil), s.heads...) }

// RevisionOf is the revision a change got here; 0 and true for a change
// that touched no keys.
func (s *State) RevisionOf(h Hash) (int64, bool) {
	at, ok := s.known[h]
	return at.rev, ok
}

// IndexOf is the index a change got here.
func (s *State) IndexOf(h Hash) (uint64, bool) {
	at, ok := s.known[h]
	return at.index, ok
}

// HashOfRevision is the change that made revision rev.
func (s *State) HashOfRevision(rev int64) (Hash, bool) {
	if rev < s.revBase || rev > s.rev {
		return Hash{}, false
	}
	return s.revHash[rev-s.revBase], true
}

// HashOfIndex is the change applied as index i.
func (s *State) HashOfIndex(i uint64) (Hash, bool) {
	if i < s.idxBase || i > s.index {
		return Hash{}, false
	}
	return s.idxHash[i-s.idxBase], true
}

// Winner is the (stamp, replica) of the write that decided key's current
// value or tombstone: the conflict rule's state (package doc).
func (s *State) Winner(key []byte) (HLC, ReplicaID, bool) {
	k := s.keys[string(key)]
	if k == nil {
		return HLC{}, 0, false
	}
	return k.win, k.winRepl, true
}

// writer collects one change's ops and applies them to the index as it
// goes, like etcd's storeTxnWrite: reads inside the change (a Txn's later
// ops) see its earlier writes at revision begin+1.
type writer struct {
	s     *State
	begin int64
	ops   []Op
	evs   []logEv
	tombs []*keyRec // merged deletes of keys absent here: the winner changes, nothing else
	// JSON merge (merge_json.go): src is the change being replayed or
	// merged (nil: a local one, not stamped yet), merge says Merge is
	// applying it, unstamped that its documents hold sentinel registers.
	src       *Change
	merge     bool
	unstamped bool
}

func (s *State) newWriter() *writer { return &writer{s: s, begin: s.rev} }

// rev is the revision reads inside the change use: begin until the change
// has touched a key, begin+1 after.
func (w *writer) rev() int64 {
	if len(w.evs) > 0 {
		return w.begin + 1
	}
	return w.begin
}

func (w *writer) put(key, value []byte, lease int64) { w.putOp(key, value, value, lease) }

// putOp stores value in the index and records a put op carrying opValue
// (they differ for JSON keys: the rendered document, and the patch).
func (w *writer) putOp(key, value, opValue []byte, lease int64) {
	s := w.s
	main, sub := w.begin+1, int64(len(w.evs))
	k := s.keys[string(key)]
	if k == nil {
		k = &keyRec{key: key}
		s.keys[string(key)] = k
		s.order.insert(k)
	}
	ev := logEv{rec: k, key: k.key}
	if p := k.at(w.begin); p != nil {
		ev.prev, ev.hasPrev = *p, true
	}
	v := val{value: value, mod: main, lease: lease, create: main, ver: 1}
	oldLease := int64(0)
	if old := k.live(); old != nil {
		v.create, v.ver, oldLease = old.create, old.ver+1, old.lease
		if oldLease != lease {
			s.detach(oldLease, key)
		}
	}
	if lease != 0 && oldLease != lease {
		s.attach(lease, key)
	}
	k.put(main, sub, v, false)
	ev.cur = v
	w.ops = append(w.ops, Op{Kind: OpPut, Key: k.key, Value: opValue, Lease: lease})
	s.markDirty(k)
	w.evs = append(w.evs, ev)
}

// del tombstones a key that exists at w.rev().
func (w *writer) del(key []byte) {
	s := w.s
	k := s.keys[string(key)]
	ev := logEv{rec: k, key: k.key, del: true}
	if p := k.at(w.begin); p != nil {
		ev.prev, ev.hasPrev = *p, true
	}
	if l := k.live().lease; l != 0 {
		s.detach(l, key)
	}
	if !w.merge && s.vm.IsJSON(key) {
		w.jsonLocalDelete(k)
	}
	k.tombstone(w.begin+1, int64(len(w.evs)))
	w.ops = append(w.ops, Op{Kind: OpDelete, Key: k.key})
	s.markDirty(k)
	w.evs = append(w.evs, ev)
}

// deleteRange deletes the keys of [key, end) that exist now (etcd's
// storeTxnWrite.deleteRange) and returns how many.
func (w *writer) deleteRange(key []byte, end []byte, single bool) int64 {
	var keys [][]byte
	if single {
		if k := w.s.keys[string(key)]; k != nil && k.live() != nil {
			keys = append(keys, k.key)
		}
	} else {
		w.s.order.ascend(key, end, func(k *keyRec) bool {
			if k.live() != nil {
				keys = append(keys, k.key)
			}
			return true
		})
	}
	for _, k := range keys {
		w.del(k)
	}
	return int64(len(keys))
}

func (s *State) markDirty(k *keyRec) {
	if !k.dirty {
		k.dirty = true
		s.dirty = append(s.dirty, k)
	}
}

// commit makes the change: stamps it, hashes it, numbers it and records
// its events.
func (w *writer) commit(now time.Time) *Applied {
	s := w.s
	c := &Change{Parents: s.heads, Replica: s.id, Stamp: s.clock.Next(now.UnixNano()), Ops: w.ops}
	return s.record(c, c.Encode(), w)
}

// record books an applied change: index, revision when it touched keys,
// heads, clock, the conflict-rule winners and the event log.
func (s *State) record(c *Change, enc []byte, w *writer) *Applied {
	evs := w.evs
	id := hashOf(enc)
	s.index++
	s.idxHash = append(s.idxHash, id)
	a := &Applied{ID: id, Encoded: enc, Index: s.index, Change: c}
	if len(evs) > 0 {
		s.rev++
		s.revHash = append(s.revHash, id)
		a.Rev = s.rev
		s.log = append(s.log, revLog{evs: evs})
		a.Events = eventsOf(evs, s.rev)
		for _, e := range evs {
			e.rec.win, e.rec.winRepl = c.Stamp, c.Replica
		}
	}
	for _, k := range w.tombs {
		k.win, k.winRepl = c.Stamp, c.Replica
		s.markGC(k)
	}
	if w.unstamped {
		s.fixStamps(c)
	}
	for _, op := range c.Ops {
		if l := s.leases[op.Lease]; op.Kind == OpLeaseGrant && l != nil && l.stamp == (HLC{}) {
			l.stamp = c.Stamp
		}
	}
	s.known[id] = changeAt{index: s.index, rev: a.Rev, repl: c.Replica, seq: s.appendChain(c)}
	s.advanceHeads(c.Parents, id)
	if c.Stamp.Compare(s.clock) > 0 {
		s.clock = c.Stamp
	}
	return a
}

func eventsOf(evs []logEv, rev int64) []*mvccpb.Event {
	out := make([]*mvccpb.Event, len(evs))
	for i, e := range evs {
		out[i] = eventOf(e, rev)
	}
	return out
}

// eventOf builds a fresh event of revision rev (the caller may change it;
// the byte slices are shared and must not be).
func eventOf(e logEv, rev int64) *mvccpb.Event {
	ev := &mvccpb.Event{}
	if !e.del {
		ev.Type = mvccpb.Event_PUT
		ev.Kv = e.cur.kv(e.key)
	} else {
		ev.Type = mvccpb.Event_DELETE
		ev.Kv = &mvccpb.KeyValue{Key: e.key, ModRevision: rev}
	}
	// etcd's watch reads the previous value at rev-1 except for a create
	// (a put of version 1): a key deleted and put again in one change
	// (a Txn) has a value at rev-1 that its create event does not carry.
	if e.hasPrev && !(!e.del && e.cur.ver == 1) {
		ev.PrevKv = e.prev.kv(e.key)
	}
	return ev
}

// Compact drops the history before rev: reads and watches from revisions
// below it are answered ErrGRPCCompacted, as etcd's (Range at rev itself
// still works). Compact is local: it is not a change.
func (s *State) Compact(rev int64) error {
	if rev <= s.compactRev {
		return rpctypes.ErrGRPCCompacted
	}
	if rev > s.rev {
		return rpctypes.ErrGRPCFutureRev
	}
	s.compactRev = rev
	// Only keys written since the last compaction, or left with more than
	// one version by it, can lose versions: a key with one version that was
	// not written since is as compact as it gets. So compaction costs the
	// writes since the last one, not the size of the key space.
	next := s.dirty[:0]
	for _, k := range s.dirty {
		k.compact(rev)
		switch {
		case k.isEmpty():
			k.dirty = false
			// The record outlives its versions while its winner (a bytes
			// key's tombstone) or its document (a JSON key's) may still
			// decide a late concurrent write: a put concurrent with the
			// delete would otherwise come back. Collect drops it once
			// nothing concurrent can arrive.
			if s.removable(k) {
				s.dropKey(k)
			} else {
				s.markGC(k)
			}
		case len(k.gens) > 1 || len(k.gens[0].revs) > 1:
			next = append(next, k)
		default:
			k.dirty = false
		}
	}
	clear(s.dirty[len(next):])
	s.dirty = next
	s.forgetBefore(rev)
	// Watches may start at rev itself (etcd refuses only start < compact).
	if drop := rev - s.logBase; drop > 0 {
		n := int64(len(s.log))
		if drop > n {
			drop = n
		}
		s.log = append([]revLog(nil), s.log[drop:]...)
		s.logBase += drop
	}
	return nil
}

// forgetBefore drops the bookkeeping of the changes before the one that
// made revision rev: its revision stays readable, so its change stays
// known. RevisionOf and HashOf* answer false for what was dropped.
func (s *State) forgetBefore(rev int64) {
	h, ok := s.HashOfRevision(rev)
	if !ok {
		return // rev 1 (the empty store): nothing before it
	}
	keepIdx := s.known[h].index
	for _, old := range s.idxHash[:keepIdx-s.idxBase] {
		at := s.known[old]
		delete(s.known, old)
		s.forget(old, at)
	}
	s.idxHash = append([]Hash(nil), s.idxHash[keepIdx-s.idxBase:]...)
	s.idxBase = keepIdx
	s.revHash = append([]Hash(nil), s.revHash[rev-s.revBase:]...)
	s.revBase = rev
}

// Events returns the history of [key, end) from revision from to the
// current one, in revision order, each change's events together, PrevKv
// filled where the key had a value before the change. end follows etcd's
// range_end: empty for the single key, "\x00" for every key >= key.
// ErrGRPCCompacted when from < CompactRev (etcd's watch rule).
func (s *State) Events(from int64, key, end []byte) ([]*mvccpb.Event, error) {
	if from < 1 {
		from = 1
	}
	if from < s.compactRev {
		return nil, rpctypes.ErrGRPCCompacted
	}
	if from < s.logBase {
		from = s.logBase
	}
	single, all := len(end) == 0, len(end) == 1 && end[0] == 0
	var out []*mvccpb.Event
	for r := from; r <= s.rev; r++ {
		for _, e := range s.log[r-s.logBase].evs {
			if single {
				if !bytes.Equal(e.key, key) {
					continue
				}
			} else if bytes.Compare(e.key, key) < 0 || (!all && bytes.Compare(e.key, end) >= 0) {
				continue
			}
			ev := eventOf(e, r)
			if r-1 < s.compactRev {
				// etcd reads the previous value at r-1, which compaction
				// has made unreadable: it sends no prev_kv then.
				ev.PrevKv = nil
			}
			out = append(out, ev)
		}
	}
	return out, nil
}

// HashKV hashes the keys and values alive at rev (0: now), in key order,
// with CRC-32C: revisions, versions and leases are left out, so two
// replicas that converged on the same key space agree whatever order they
// applied the changes in (part 2's convergence check). The errors are
// etcd's HashKV's.
func (s *State) HashKV(rev int64) (hash uint32, hashRev int64, err error) {
	if rev > 0 && rev < s.compactRev {
		return 0, 0, rpctypes.ErrGRPCCompacted
	}
	if rev > s.rev {
		return 0, s.rev, rpctypes.ErrGRPCFutureRev
	}
	if rev <= 0 {
		rev = s.rev
	}
	h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	var lb [20]byte
	s.order.ascend(nil, nil, func(k *keyRec) bool {
		v := k.at(rev)
		if v == nil {
			return true
		}
		h.Write(appendLen(lb[:0], len(k.key)))
		h.Write(k.key)
		h.Write(appendLen(lb[:0], len(v.value)))
		h.Write(v.value)
		return true
	})
	return h.Sum32(), rev, nil
}

func appendLen(b []byte, n int) []byte {
	for n >= 0x80 {
		b = append(b, byte(n)|0x80)
		n >>= 7
	}
	return append(b, byte(n))
}

// Replay re-applies a stored change during recovery, with the index and
// revision it got when it was first applied (rev 0: it touched no keys).
// Its ops are applied as recorded, never re-evaluated, so the state, the
// revisions and the hashes come out as they were. Leases come back with
// expiries from the change's stamp; call PromoteLeases once replay is done.
func (s *State) Replay(encoded []byte, index uint64, rev int64) error {
	c, err := DecodeChange(encoded)
	if err != nil {
		return fmt.Errorf("core: replay index %d: %w", index, err)
	}
	if index != s.index+1 {
		return fmt.Errorf("core: replay: index %d after %d", index, s.index)
	}
	if _, ok := s.known[hashOf(encoded)]; ok {
		return fmt.Errorf("core: replay index %d: change already applied", index)
	}
	if c.Replica != s.id {
		// A change merged from a peer: the conflict rule decided which of
		// its ops took effect, and deciding again in the same order gives
		// the same answer.
		if err := s.checkParents(c); err != nil {
			return fmt.Errorf("core: replay index %d: %w", index, err)
		}
		if want := s.mergeRev(c); want != rev {
			return fmt.Errorf("core: replay index %d: revision %d, the merge gives %d", index, rev, want)
		}
		w := s.newWriter()
		s.mergeOps(w, c)
		s.record(c, encoded, w)
		return nil
	}
	// Our own change was made on our heads of the time: anything else
	// means the log lost or reordered a change.
	if !slices.Equal(c.Parents, s.heads) {
		return fmt.Errorf("core: replay index %d: its parents are not the heads here: a change is missing or out of order", index)
	}
	if err := s.checkOps(c); err != nil {
		return fmt.Errorf("core: replay index %d: %w", index, err)
	}
	touches := false
	for _, op := range c.Ops {
		if op.Kind == OpPut || op.Kind == OpDelete {
			touches = true
		}
	}
	switch {
	case touches && rev != s.rev+1:
		return fmt.Errorf("core: replay index %d: revision %d, want %d", index, rev, s.rev+1)
	case !touches && rev != 0:
		return fmt.Errorf("core: replay index %d: revision %d for a change that touches no keys", index, rev)
	}
	w := s.newWriter()
	s.applyOps(w, c, time.Unix(0, c.Stamp.Wall))
	s.record(c, encoded, w)
	return nil
}

// checkOps refuses a change whose ops do not fit this state, before any is
// applied: a delete of a missing key, a grant of an existing lease, a
// revoke of a missing one.
func (s *State) checkOps(c *Change) error {
	live := map[string]bool{}
	leases := map[int64]bool{}
	exists := func(key []byte) bool {
		if v, ok := live[string(key)]; ok {
			return v
		}
		k := s.keys[string(key)]
		return k != nil && k.live() != nil
	}
	hasLease := func(id int64) bool {
		if v, ok := leases[id]; ok {
			return v
		}
		return s.leases[id] != nil
	}
	for i, op := range c.Ops {
		switch op.Kind {
		case OpPut:
			if len(op.Key) == 0 {
				return fmt.Errorf("op %d: put of the empty key", i)
			}
			live[string(op.Key)] = true
		case OpDelete:
			if !exists(op.Key) {
				return fmt.Errorf("op %d: delete of missing key %q", i, op.Key)
			}
			live[string(op.Key)] = false
		case OpLeaseGrant:
			if hasLease(op.Lease) || op.Lease == 0 {
				return fmt.Errorf("op %d: grant of lease %d, which exists", i, op.Lease)
			}
			leases[op.Lease] = true
		case OpLeaseRevoke:
			if !hasLease(op.Lease) {
				return fmt.Errorf("op %d: revoke of lease %d, which does not exist", i, op.Lease)
			}
			leases[op.Lease] = false
		}
	}
	return nil
}

// applyOps applies resolved ops through w; now is the grant time of the
// leases the change grants.
func (s *State) applyOps(w *writer, c *Change, now time.Time) {
	w.src = c
	for i, op := range c.Ops {
		switch op.Kind {
		case OpPut:
			if s.vm.IsJSON(op.Key) {
				s.jsonMergeOp(w, c, i, true)
				continue
			}
			w.put(op.Key, op.Value, op.Lease)
		case OpDelete:
			w.del(op.Key)
		case OpLeaseGrant:
			s.grant(op.Lease, op.TTL, c.Replica, now)
			w.ops = append(w.ops, op)
		case OpLeaseRevoke:
			delete(s.leases, op.Lease)
			w.ops = append(w.ops, op)
		}
	}
	if c.Replica == s.id {
		s.noteLeaseIDs(c)
	}
}

// sortedKeys returns m's keys in order.
func sortedKeys(m map[string]struct{}) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
