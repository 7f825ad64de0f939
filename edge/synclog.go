package edge

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	edgesyncv1 "github.com/aethermesh/aether/api/edgesync/v1"
	"github.com/aethermesh/aether/edge/internal/core"
)

// vector is a version vector: for each replica, how many of its changes
// (counted from its first) are held. See sync.go for why a prefix count
// describes a replica's whole history.
type vector map[core.ReplicaID]uint64

func (v vector) clone() vector {
	out := make(vector, len(v))
	for r, n := range v {
		out[r] = n
	}
	return out
}

// sum is how many changes v counts.
func (v vector) sum() uint64 {
	var n uint64
	for _, c := range v {
		n += c
	}
	return n
}

// equal reports whether v and o count the same changes (a missing entry
// is zero).
func (v vector) equal(o vector) bool {
	return v.lacks(o) == 0 && o.lacks(v) == 0
}

// lacks is how many changes v holds that o does not (replication lag in
// changes when v is this replica's and o a peer's).
func (v vector) lacks(o vector) uint64 {
	var n uint64
	for r, c := range v {
		if c > o[r] {
			n += c - o[r]
		}
	}
	return n
}

func (v vector) proto() []*edgesyncv1.VectorEntry {
	out := make([]*edgesyncv1.VectorEntry, 0, len(v))
	for r, n := range v {
		out = append(out, &edgesyncv1.VectorEntry{Replica: uint64(r), Count: n})
	}
	slices.SortFunc(out, func(a, b *edgesyncv1.VectorEntry) int {
		switch {
		case a.Replica < b.Replica:
			return -1
		case a.Replica > b.Replica:
			return 1
		}
		return 0
	})
	return out
}

func vectorOf(es []*edgesyncv1.VectorEntry) vector {
	v := make(vector, len(es))
	for _, e := range es {
		v[core.ReplicaID(e.GetReplica())] = e.GetCount()
	}
	return v
}

// logEntry is one applied change as the sync layer keeps it.
type logEntry struct {
	id      core.Hash
	enc     []byte
	replica core.ReplicaID
	seq     uint64 // 1-based position in its replica's chain
	// durableAt is when the change became durable here (unix ns, the
	// server's clock): the age of what a peer lacks is replication lag in
	// seconds.
	durableAt int64
}

// syncLog is every change this replica applied, in apply-index order, with
// each change's place in its author's chain. It is what the pushers send
// from: there is no per-peer queue (a peer's position in the log is its
// queue), so a slow or absent peer costs the write path nothing.
//
// Entries are added under the server's state lock, in index order (the
// committer's add hook, and recovery); they become sendable once durable
// (the committer's persist hook), so a change never leaves the replica
// before a crash could no longer take it back.
//
// GC (gc.go) cuts the log's prefix below the stable point, what every
// member holds: trimmed counts, per replica, the changes of its chain no
// longer here (always a prefix of the chain), and a peer whose vector is
// below it cannot be caught up from the log (errBehindGC): it gets a
// snapshot instead (snapshot_transfer.go). A merged snapshot raises
// trimmed too (absorb), and empties the log: what a peer lacks of it is
// then sent as a snapshot as well.
type syncLog struct {
	mu      sync.Mutex
	base    uint64 // index of entries[0]
	entries []logEntry
	byHash  map[core.Hash]uint64        // id -> index
	applied vector                      // every entry
	durable uint64                      // highest durable index
	dvec    vector                      // entries up to durable
	chains  map[core.ReplicaID][]uint64 // each replica's changes' indexes, in chain order
	now     func() time.Time
	bytes   int64
	// trimmed is, per replica, how many of its changes GC dropped from
	// entries: the first trimmed[r] of r's chain.
	trimmed vector
	// changed is closed (and replaced) whenever durable advances.
	changed chan struct{}
	// absorbs counts merged snapshots (absorb): a cursor that saw fewer
	// checks its peer against trimmed again (take).
	absorbs uint64
}

func newSyncLog(now func() time.Time) *syncLog {
	return &syncLog{
		now:     now,
		chains:  make(map[core.ReplicaID][]uint64),
		byHash:  make(map[core.Hash]uint64),
		applied: make(vector),
		dvec:    make(vector),
		trimmed: make(vector),
		changed: make(chan struct{}),
	}
}

// add records an applied change (index order). Recovered changes pass
// durable = true.
func (l *syncLog) add(index uint64, id core.Hash, enc []byte, replica core.ReplicaID, durable bool) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.entries) == 0 && l.base == 0 {
		l.base = index
	}
	if want := l.base + uint64(len(l.entries)); index != want {
		return fmt.Errorf("edge: sync log: change index %d, want %d", index, want)
	}
	l.applied[replica]++
	l.entries = append(l.entries, logEntry{id: id, enc: enc, replica: replica, seq: l.applied[replica]})
	l.byHash[id] = index
	l.chains[replica] = append(l.chains[replica], index)
	l.bytes += int64(len(enc))
	if durable {
		l.advance(index)
	}
	return nil
}

// addApplied is add for a change the core just applied.
func (l *syncLog) addApplied(ap *core.Applied) error {
	return l.add(ap.Index, ap.ID, ap.Encoded, ap.Change.Replica, false)
}

// addRecovered is add for a change replayed from storage (durable).
func (l *syncLog) addRecovered(index uint64, id core.Hash, enc []byte) error {
	c, err := core.DecodeChange(enc)
	if err != nil {
		return fmt.Errorf("edge: sync log: %w", err)
	}
	return l.add(index, id, enc, c.Replica, true)
}

// markDurable makes every change up to index sendable and wakes the
// pushers. It never blocks on them.
func (l *syncLog) markDurable(index uint64) {
	l.mu.Lock()
	l.advance(index)
	l.mu.Unlock()
}

func (l *syncLog) advance(index uint64) {
	if last := l.base + uint64(len(l.entries)) - 1; index > last {
		index = last
	}
	if index <= l.durable {
		return
	}
	start := l.durable + 1
	if start < l.base {
		start = l.base
	}
	at := l.now().UnixNano()
	for i := start; i <= index; i++ {
		e := &l.entries[i-l.base]
		l.dvec[e.replica]++
		e.durableAt = at
	}
	l.durable = index
	close(l.changed)
	l.changed = make(chan struct{})
}

// has reports whether the change id was applied here.
func (l *syncLog) has(id core.Hash) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.byHash[id]
	return ok
}

// position is the (replica, seq) of a change in the log (syncer.position
// answers for the others).
func (l *syncLog) position(id core.Hash) (core.ReplicaID, uint64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	i, ok := l.byHash[id]
	if !ok {
		return 0, 0, false
	}
	e := l.entries[i-l.base]
	return e.replica, e.seq, true
}

// nextSeq is the place the next change of replica r applied here will
// get in r's chain. The caller holds the state lock (so no add races it).
func (l *syncLog) nextSeq(r core.ReplicaID) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.applied[r] + 1
}

// durableVector is the version vector of the durable changes.
func (l *syncLog) durableVector() vector {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.dvec.clone()
}

// oldestLacking is when the oldest durable change that a peer holding v
// lacks became durable here; false when it lacks none.
func (l *syncLog) oldestLacking(v vector) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var oldest int64
	found := false
	for r, n := range l.dvec {
		if n <= v[r] {
			continue
		}
		// The peer holds a prefix of r's chain: its first missing change
		// is the oldest of r's it lacks (or, for a peer behind the GC
		// point, the oldest still here).
		k := uint64(0)
		if v[r] > l.trimmed[r] {
			k = v[r] - l.trimmed[r]
		}
		if k >= uint64(len(l.chains[r])) {
			continue
		}
		at := l.entries[l.chains[r][k]-l.base].durableAt
		if !found || at < oldest {
			oldest, found = at, true
		}
	}
	return time.Unix(0, oldest), found
}

// stats is the DAG size: changes held and their encoded bytes.
func (l *syncLog) stats() (changes int, bytes int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.entries), l.bytes
}

// maxScan bounds the entries one take looks at under the lock.
const maxScan = 1 << 14

// closedChan is a channel that is always ready.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// cursor is a pusher's position: the last index considered and what the
// peer is known or assumed (sent on a live stream) to hold.
type cursor struct {
	next uint64 // first index not yet considered
	sent vector
	// absorbs is the log's count of merged snapshots when the cursor last
	// checked its peer against trimmed.
	absorbs uint64

	// Forwarding (set by the pusher; the zero value sends everything at
	// once, as a plain vector walk). self is this replica, peer the one
	// the cursor feeds: see take for why a change of neither waits.
	// released is the highest index the peer has answered a probe about:
	// a change at or below it that the peer still lacks is not on its way
	// to the peer by another path, so it goes at once. holding is set by
	// take when it stopped at a change that waits (the pusher then asks,
	// with a probe).
	forward    bool
	self, peer core.ReplicaID
	released   uint64
	holding    bool
	// relayed is how many relayed changes (authored by neither side) the
	// last take returned because a probe's answer showed the peer lacking
	// them (not those flushed ahead of an own change): it is not getting
	// them directly, and the pusher probes at its quickest again (peer.go,
	// relayPacer).
	relayed int
}

// newCursor starts a pusher at the first change peer (whose vector is pv)
// lacks. Everything before it the peer holds, so the walk that follows
// sends exactly the vector difference, in index order.
// A peer that lacks a change GC dropped gets errBehindGC: it cannot be
// caught up from the log.
func (l *syncLog) newCursor(pv vector) (*cursor, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.behind(pv); err != nil {
		return nil, err
	}
	c := &cursor{next: l.base + uint64(len(l.entries)), sent: pv.clone(), absorbs: l.absorbs}
	if l.base == 0 {
		c.next = 1
	}
	for i, e := range l.entries {
		if e.seq > pv[e.replica] {
			c.next = l.base + uint64(i)
			break
		}
	}
	return c, nil
}

// errBehindGC: a peer lacks changes this replica's GC dropped. Sending it
// what is left would leave a hole in its history (the next change would
// not merge, or worse, a key's older value would stay), so the sender
// refuses it loudly instead (gc.go).
var errBehindGC = errors.New("edge: peer is behind this replica's GC point")

// errMergedAhead (wrapping errBehindGC): the peer lacks changes that
// reached this replica in a merged snapshot after the cursor started, so
// they are in no log entry to send (absorb): the stream ends, and the
// next one starts with a snapshot (wantsSnapshot). Unlike a cursor GC
// overtook, nothing is wrong with the peer.
var errMergedAhead = errors.New("edge: a merged snapshot brought changes the peer lacks")

// behindErr is behind for a caller not holding l.mu.
func (l *syncLog) behindErr(v vector) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.behind(v)
}

// behind reports, for what a peer holds (v), whether it lacks a trimmed
// change. The caller holds l.mu.
func (l *syncLog) behind(v vector) error {
	for r, n := range l.trimmed {
		if v[r] < n {
			return fmt.Errorf("%w: it holds %d of replica %x's changes, %d are no longer in the log", errBehindGC, v[r], uint64(r), n)
		}
	}
	return nil
}

// take returns the next batch for c (at most maxN changes, maxBytes bytes
// unless a single change is larger), advancing c, and the channel that is
// closed when more becomes durable: taken together, under the lock, so no
// wake-up is lost between an empty batch and the wait. held is what the
// peer is known to hold besides what c sent (the changes it sent us, its
// acks): not sent.
//
// A cursor GC overtook (its peer stopped holding the stable point back,
// then came back on the same stream) gets errBehindGC unless the peer is
// known to hold what was trimmed.
//
// # Forwarding (c.forward)
//
// Every replica pushes every change it applied to each of its peers, so a
// change authored by A reaches B from A and, relayed, from every other
// replica that merged it before B's ack could say B holds it: in a
// complete graph of N replicas each receives each change N-1 times, and
// the relaying costs every replica N-2 sends, receipts, hash checks and
// acks per change (the edge-scale benchmark measured 3.9 receipts per
// merged change at 5 replicas and 5.8 at 7, and that traffic was most of a
// non-writing replica's CPU). Two rules cut it without giving up
// transitivity (a change still reaches a peer that is only reachable
// through this replica, Config.SyncPeers) or causal order (a peer refuses
// a change whose parents it lacks):
//
//   - A change authored by the peer is never sent to it: its author
//     applied it before anyone else could, and a replica's log is never
//     lost under the same member id (sync.go), so it holds it.
//   - A change authored by neither this replica nor the peer (a relayed
//     one) waits until the peer has answered a probe sent after the change
//     became durable here (c.released, the pusher's probe bookkeeping in
//     peer.go). The author pushes to its own peers when the change is
//     durable there, before this replica could even have merged it; so
//     when the peer is the author's peer too and the link is up, the
//     answer, one round trip later, already shows the change held (the
//     ack vector) and it is skipped like any held change. When the answer
//     lacks it, the peer is not getting it directly (no link to the
//     author, a cut link, a slow one) and it goes then: one round trip of
//     this link more per relaying hop, and at most one duplicate, as
//     before, when the direct copy was merely late.
//
// Order is kept because the walk never passes a waiting change: it stops
// there (c.holding) and everything after it waits too, except that a
// change of this replica's own must not wait behind it: an own change's
// parents are this replica's heads when it was made, so it depends on
// every change applied before it. When one is durable, everything before
// it goes first (what the peer is not known to hold), as the walk always
// did. That is where duplicates remain: relayed changes interleaved with
// this replica's own writes (several replicas writing at a high rate)
// are flushed with them unless a probe's answer came first.
func (l *syncLog) take(c *cursor, held vector, maxN int, maxBytes int) ([][]byte, <-chan struct{}, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out [][]byte
	size := 0
	c.holding, c.relayed = false, 0
	// A merged snapshot since the cursor last looked raised trimmed by
	// what it stood for, and may not have moved base (the log was already
	// empty): the walk ahead would never show those changes, so the peer
	// is checked against trimmed whether or not base passed the cursor.
	if c.next < l.base || c.absorbs != l.absorbs {
		known := c.sent.clone()
		for r, n := range held {
			known[r] = max(known[r], n)
		}
		if err := l.behind(known); err != nil {
			if c.next >= l.base {
				// Not overtaken by GC: the peer lacks only what a merge
				// brought, which the next stream sends as a snapshot.
				err = fmt.Errorf("%w: %w", errMergedAhead, err)
			}
			return nil, nil, err
		}
		c.next = max(c.next, l.base)
		c.absorbs = l.absorbs
	}
	// flush is the index of this replica's last durable change: the walk
	// sends everything up to it without waiting (see above).
	var flush uint64
	if c.forward {
		ch := l.chains[c.self]
		for k := len(ch) - 1; k >= 0; k-- {
			if ch[k] <= l.durable {
				flush = ch[k]
				break
			}
		}
	}
	for scanned := 0; c.next <= l.durable && len(out) < maxN; scanned++ {
		if scanned == maxScan {
			// A long run the peer holds: let writers have the lock, and
			// tell the caller to come back at once.
			return out, closedChan, nil
		}
		e := &l.entries[c.next-l.base]
		if e.seq <= c.sent[e.replica] || e.seq <= held[e.replica] || (c.forward && e.replica == c.peer) {
			// The peer holds it (often: it came from that peer).
			c.sent[e.replica] = max(c.sent[e.replica], e.seq)
			c.next++
			continue
		}
		if c.forward && e.replica != c.self && c.next > c.released && c.next > flush {
			c.holding = true
			break
		}
		if len(out) > 0 && size+len(e.enc) > maxBytes {
			break
		}
		if c.forward && e.replica != c.self && c.next <= c.released {
			// Released by a probe's answer, not flushed ahead of an own
			// change: the answer showed the peer lacking it.
			c.relayed++
		}
		out = append(out, e.enc)
		size += len(e.enc)
		c.sent[e.replica] = e.seq
		c.next++
	}
	return out, l.changed, nil
}

// durableIndex is the highest durable index: a probe sent now is about
// every change up to it (take's forwarding).
func (l *syncLog) durableIndex() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.durable
}

// trim drops the log's longest prefix of durable changes that stable
// (what every peer GC waits for holds) covers, and returns how many it
// dropped. stable is causally closed (a minimum of vectors that are), so
// the prefix is too; a stable change behind an unstable one waits for it.
func (l *syncLog) trim(stable vector) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := 0
	for k < len(l.entries) && l.base+uint64(k) <= l.durable {
		e := &l.entries[k]
		if e.seq > stable[e.replica] {
			break
		}
		k++
	}
	for i := 0; i < k; i++ {
		e := &l.entries[i]
		delete(l.byHash, e.id)
		l.trimmed[e.replica]++
		l.bytes -= int64(len(e.enc))
		// A replica's chain is in index order: its front is this entry.
		ch := l.chains[e.replica]
		ch[0] = 0
		l.chains[e.replica] = ch[1:]
		// Release the encoding now: the backing array lives on until
		// append outgrows it.
		*e = logEntry{}
	}
	l.entries = l.entries[k:]
	l.base += uint64(k)
	return k
}

// absorb records that a merged snapshot (snapshot_transfer.go) stood for
// the changes v counts: they are applied and durable here without being
// in the log. The log is emptied: per replica, every change held is
// counted as trimmed (the state, not the log, now carries them), and a
// peer lacking any of them gets a snapshot too. Dropping only what v
// covers would leave holes in the log's index order (a changes of this
// replica's own the sender lacked sits between covered ones), and a
// checkpoint rebuilds the log from its first index with the counts below
// it (checkpoint.go), which holes would break. Streams already open see
// the new counts at their next take (cursor.absorbs, errMergedAhead), so
// a peer lacking what the merge brought gets its snapshot even when no
// stream breaks. The caller holds the state lock and every applied change
// is durable (the committer drained), so no add races it.
func (l *syncLog) absorb(v vector) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.base, l.applied = l.absorbBaseLocked(v)
	clear(l.entries)
	l.entries = nil
	clear(l.byHash)
	clear(l.chains)
	l.bytes = 0
	for r, n := range l.applied {
		l.dvec[r] = n
		l.trimmed[r] = n
	}
	l.absorbs++
	close(l.changed)
	l.changed = make(chan struct{})
}

// absorbBase is what absorb(v) will leave as the log's base and trimmed
// counts (checkpointBase after it), without changing the log: the
// checkpoint of a merge is written from it before the log takes the merge
// in (mergeTransfer).
func (l *syncLog) absorbBase(v vector) (uint64, vector) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.absorbBaseLocked(v)
}

func (l *syncLog) absorbBaseLocked(v vector) (uint64, vector) {
	base := l.base
	if base != 0 || len(l.entries) != 0 {
		base += uint64(len(l.entries))
	}
	applied := l.applied.clone()
	for r, n := range v {
		applied[r] = max(applied[r], n)
	}
	return base, applied
}

// trimmedVector is, per replica, how many of its changes GC dropped.
func (l *syncLog) trimmedVector() vector {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.trimmed.clone()
}
