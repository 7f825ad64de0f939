// Package storage is the edge store's durable change log: the only package
// of the edge store that touches disk.
//
// A Log holds, in one bbolt file (edge.db in the data directory):
//
//   - every change this replica applied, as a Record keyed by its apply
//     index (big-endian, so bbolt's key order is index order and Load
//     replays in the order the changes were applied);
//   - rev -> index for the changes that got a revision, so a revision can be
//     found without replaying;
//   - metadata: the compacted revision and the caller's keys (member id,
//     cluster id, ...);
//   - optionally a checkpoint: a snapshot of the caller's state as of an
//     index I, and the first index K <= I+1 the log still keeps, with the
//     records before K deleted in the same transaction. It is what bounds
//     the log: recovery is the snapshot, then Load of the records from K
//     (those up to I are only for the caller's other uses; those after I
//     are replayed). See Checkpoint.
//
// Append is the group commit primitive: the server collects the changes of
// many concurrent requests, appends them in one call, and acknowledges all
// of them once it returns nil. It costs one write and one fdatasync: the
// batch goes, as one CRC32C-checked frame, to a write-ahead log beside the
// bbolt file (segments edge.db.wal.N), etcd's own shape. A background
// flusher then commits the pending records to bbolt, in one fsync'd
// transaction per 100 ms (or per 10,000 records), and removes the WAL
// segments bbolt then holds; until then Load and IndexOfRevision serve them
// from memory. bbolt keeps fsyncing every commit (not NoSync): its meta
// page checksum covers only the meta page, so an unsynced commit could, on
// power loss, leave a valid newest meta over pages never written.
//
// Recovery (Open) replays bbolt's records, then the WAL's beyond bbolt's
// last index (a crash between a flush's commit and the removal of its
// segments leaves records in both; the index tells them apart), commits
// them to bbolt and starts a fresh segment. A frame that does not check out
// ends the log when nothing valid follows it: a torn last write, whose
// Append never returned. Damage with valid frames after it is an error
// naming the file: acknowledged batches lie beyond it, and recovery does not
// guess. A crash thus loses no acknowledged batch and never half a batch.
//
// Why bbolt and not pebble: the log is one file and a short WAL (simple to back up, move and
// defragment); bbolt is already in the module graph through etcd, so it adds
// no dependency; its transactions make the flush and the checkpoint atomic;
// and it is what etcd itself stores its backend in, so its behaviour
// under crashes and its tooling (bbolt check, bbolt compact) are known. An
// LSM's write throughput advantage matters little here: every write is one
// small append of an already-encoded change.
package storage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
)

// FileName is the bbolt file inside the data directory; the write-ahead
// log's segments are beside it, named FileName+".wal."+sequence.
const FileName = "edge.db"

// Record is one applied change as stored.
type Record struct {
	Index  uint64   // this replica's apply index, strictly increasing
	Rev    int64    // the revision the change got; 0 when it touched no key
	ID     [32]byte // the change hash
	Change []byte   // the change's canonical encoding
}

var (
	bucketChanges = []byte("changes") // index -> recordVersion|rev|id|change
	bucketRevs    = []byte("revs")    // rev -> index
	bucketMeta    = []byte("meta")    // metaCompacted, and "user/"+key
	// bucketSnapshot holds the checkpoint's snapshot in chunks
	// (chunk number -> bytes): see snapshotChunk.
	bucketSnapshot = []byte("snapshot")

	metaCompacted     = []byte("compacted")
	metaSnapshotIndex = []byte("snapshot-index") // the last index the snapshot covers
	metaSnapshotKeep  = []byte("snapshot-keep")  // the first index the checkpoint kept
	metaSnapshotMeta  = []byte("snapshot-meta")  // the caller's, with the checkpoint
	userPrefix        = "user/"
)

// recordVersion prefixes every stored record value so that a later format
// can be told apart from this one instead of being misread.
const recordVersion = 1

// recordHeader is the fixed part of a stored record: version, rev, id.
const recordHeader = 1 + 8 + 32

// ErrClosed is returned by every method of a closed Log.
var ErrClosed = errors.New("storage: log is closed")

// options are the flush policy; tests shrink or disable it.
type options struct {
	flushEvery   time.Duration // 0: no periodic flush (tests)
	flushRecords int           // pending records that start a flush early
	flushBytes   int           // pending change bytes that start a flush early
	segmentBytes int64         // a segment this large is rotated at the next flush

	// afterCommit, when set, runs after a flush's bbolt commit and before
	// the flushed segments are removed; an error stops the flush there,
	// as a crash at that point would.
	afterCommit func() error
}

// defaultOptions: etcd commits its backend every 100 ms or 10,000 writes.
var defaultOptions = options{
	flushEvery:   100 * time.Millisecond,
	flushRecords: 10000,
	flushBytes:   16 << 20,
	segmentBytes: 16 << 20,
}

// segment is a rotated WAL segment: every record in it has an index up to
// last, so it can go once bbolt holds last.
type segment struct{ seq, last uint64 }

// Log is the durable change log. Its methods are safe for concurrent use.
type Log struct {
	dir, path string
	opts      options

	// mu guards db: Defragment and Close replace it (write lock); every
	// other method uses it under the read lock. bbolt serializes the
	// writers.
	mu sync.RWMutex
	db *bolt.DB

	// flushMu serializes flushes: the segment bookkeeping assumes one at a
	// time. Order: mu, flushMu, walMu.
	flushMu sync.Mutex

	// walMu guards the WAL and the records it holds that bbolt does not yet.
	walMu     sync.Mutex
	wal       *os.File
	walSeq    uint64
	walOff    int64
	rotated   []segment        // older segments, not yet removable
	tail      []Record         // in the WAL, not yet in bbolt, in index order; never modified in place
	tailRevs  map[int64]uint64 // rev -> index for tail
	tailBytes int
	last      uint64 // the last index appended (or checkpointed)
	failed    error  // sticky: after a failed write the WAL's state is unknown

	kick      chan struct{}
	stop      chan struct{}
	stopOnce  sync.Once
	flushDone chan struct{}
}

// Open opens the log in dir, creating dir and the file when missing, and
// recovers: bbolt's records, then the write-ahead log's beyond them, which
// it commits to bbolt before it returns.
func Open(dir string) (*Log, error) { return open(dir, defaultOptions) }

func open(dir string, opts options) (*Log, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("storage: create data dir: %w", err)
	}
	l := &Log{
		dir: dir, path: filepath.Join(dir, FileName), opts: opts,
		tailRevs:  map[int64]uint64{},
		kick:      make(chan struct{}, 1),
		stop:      make(chan struct{}),
		flushDone: make(chan struct{}),
	}
	db, err := openDB(l.path)
	if err != nil {
		return nil, err
	}
	l.db = db
	if err := l.recover(); err != nil {
		_ = db.Close()
		return nil, err
	}
	go l.flusher()
	return l, nil
}

// recover replays the WAL segments into bbolt: the records past bbolt's
// last index (those before it are in both when a crash came between a
// flush's commit and the removal of its segments). A torn frame at the end
// of the last segment is a batch whose Append never returned; it goes with
// the segments, which are removed once bbolt's synced commit holds their
// records. Damage before valid frames is an error naming the file.
func (l *Log) recover() error {
	last, err := l.dbLast()
	if err != nil {
		return err
	}
	seqs, err := listSegments(l.dir)
	if err != nil {
		return fmt.Errorf("storage: list write-ahead log: %w", err)
	}
	var recs []Record
	for i, seq := range seqs {
		name := filepath.Join(l.dir, segmentName(seq))
		data, err := os.ReadFile(name)
		if err != nil {
			return fmt.Errorf("storage: read write-ahead log: %w", err)
		}
		valid, err := scanSegment(name, data, func(batch []Record) error {
			for _, r := range batch {
				if r.Index <= last {
					continue // bbolt has it
				}
				if n := len(recs); n > 0 && r.Index <= recs[n-1].Index {
					return fmt.Errorf("%w: record index %d is not after %d", errCorrupt, r.Index, recs[n-1].Index)
				}
				recs = append(recs, r)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("storage: recover: %w", err)
		}
		if valid < len(data) && i != len(seqs)-1 {
			// Only the newest segment is written to; a torn frame in an
			// older one is damage, with later batches behind it.
			return fmt.Errorf("storage: recover: %w %s: damaged at offset %d, before the newer segment %s",
				errCorrupt, name, valid, segmentName(seqs[len(seqs)-1]))
		}
	}
	if len(recs) > 0 {
		if err := l.db.Update(func(tx *bolt.Tx) error { return putRecords(tx, recs) }); err != nil {
			return fmt.Errorf("storage: recover %d records from the write-ahead log: %w", len(recs), err)
		}
		last = recs[len(recs)-1].Index
	}
	// bbolt's commit is fsync'd: the segments are redundant now.
	for _, seq := range seqs {
		if err := os.Remove(filepath.Join(l.dir, segmentName(seq))); err != nil {
			return fmt.Errorf("storage: remove replayed write-ahead log: %w", err)
		}
	}
	next := uint64(1)
	if len(seqs) > 0 {
		next = seqs[len(seqs)-1] + 1
	}
	// Creating it syncs the directory, which makes the removals durable
	// too: a torn tail cannot come back behind the new segment.
	f, err := createSegment(l.dir, next)
	if err != nil {
		return fmt.Errorf("storage: %w", err)
	}
	l.wal, l.walSeq, l.last = f, next, last
	return nil
}

// dbLast is bbolt's last index: the last record's, or the checkpoint's when
// the checkpoint took every record.
func (l *Log) dbLast() (uint64, error) {
	var last uint64
	err := l.db.View(func(tx *bolt.Tx) error {
		last = lastIndex(tx)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("storage: read last index: %w", err)
	}
	return last, nil
}

func lastIndex(tx *bolt.Tx) uint64 {
	var last uint64
	if v := tx.Bucket(bucketMeta).Get(metaSnapshotIndex); v != nil {
		last = binary.BigEndian.Uint64(v)
	}
	if k, _ := tx.Bucket(bucketChanges).Cursor().Last(); k != nil {
		last = max(last, binary.BigEndian.Uint64(k))
	}
	return last
}

func openDB(path string) (*bolt.DB, error) {
	// The timeout turns "another process has this data dir open" (bbolt
	// holds an exclusive flock) into an error instead of a hang.
	// NoFreelistSync: a commit writes only its data pages and the meta
	// page, not the free list as well, so the fsync'd group commit writes
	// less; Open rebuilds the list by a scan, cheap beside the replay the
	// server does anyway. InitialMmapSize: growing the file inside the
	// mapping needs no remap, and a remap makes a commit wait for every
	// open read transaction (etcd maps 10 GiB up front for the same reason).
	// Not NoSync: bbolt's meta checksum covers only the meta page, so
	// without the fsync between data pages and meta a power loss can leave
	// a valid newest meta over unwritten pages, and a commit can reuse the
	// pages of the last durable tree before it is superseded. Every bbolt
	// commit stays fsync'd; the WAL takes them off the acknowledgement path.
	db, err := bolt.Open(path, 0o600, &bolt.Options{
		Timeout:         2 * time.Second,
		FreelistType:    bolt.FreelistMapType,
		NoFreelistSync:  true,
		InitialMmapSize: 1 << 30,
	})
	if err != nil {
		return nil, fmt.Errorf("storage: open %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketChanges, bucketRevs, bucketMeta} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return fmt.Errorf("create bucket %s: %w", b, err)
			}
		}
		return nil
	})
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("storage: initialise %s: %w", path, err)
	}
	return db, nil
}

// putRecords stores recs, which follow bbolt's last index, in tx.
func putRecords(tx *bolt.Tx, recs []Record) error {
	changes, revs := tx.Bucket(bucketChanges), tx.Bucket(bucketRevs)
	// Keys only grow, so full pages pack the file instead of leaving
	// every page half empty for inserts that never come.
	changes.FillPercent, revs.FillPercent = 1, 1
	last := lastIndex(tx)
	for i := range recs {
		r := &recs[i]
		if r.Index <= last {
			return fmt.Errorf("record index %d is not after %d", r.Index, last)
		}
		last = r.Index
		key := u64(r.Index)
		if err := changes.Put(key, encodeRecord(r)); err != nil {
			return fmt.Errorf("put record %d: %w", r.Index, err)
		}
		if r.Rev != 0 {
			if err := revs.Put(u64(uint64(r.Rev)), key); err != nil {
				return fmt.Errorf("put revision %d: %w", r.Rev, err)
			}
		}
	}
	return nil
}

// Append stores recs and returns once they are durable: one frame written
// to the write-ahead log and one fdatasync, the group commit primitive.
// bbolt gets them at the next flush (at most flushEvery later); Load and
// IndexOfRevision see them at once.
// Indexes must be strictly increasing, within the batch and after every
// stored record: the log is append-only, and a gap in the order would make
// replay apply changes in a different order than they were acknowledged.
// On a refused batch nothing of it is stored. After a failed write or
// sync every later Append fails too: the WAL's state on disk is unknown
// (and a retried fsync may report success for lost data).
func (l *Log) Append(recs []Record) error {
	if len(recs) == 0 {
		return nil
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.db == nil {
		return ErrClosed
	}
	l.walMu.Lock()
	defer l.walMu.Unlock()
	if l.failed != nil {
		return fmt.Errorf("storage: append %d records: the log failed earlier: %w", len(recs), l.failed)
	}
	last, size := l.last, frameHeader+1+4
	for i := range recs {
		r := &recs[i]
		if r.Index <= last {
			return fmt.Errorf("storage: append %d records: record index %d is not after %d", len(recs), r.Index, last)
		}
		if r.Rev < 0 {
			return fmt.Errorf("storage: append %d records: record index %d: negative revision %d", len(recs), r.Index, r.Rev)
		}
		last = r.Index
		size += walRecHeader + len(r.Change)
	}
	frame := encodeFrame(make([]byte, 0, size), recs)
	// pwrite at the end we track, not O_APPEND: a short or failed write
	// leaves walOff where it was, and a torn frame is only ever the last.
	if _, err := l.wal.WriteAt(frame, l.walOff); err != nil {
		l.failed = err
		return fmt.Errorf("storage: append %d records: write-ahead log: %w", len(recs), err)
	}
	if err := fdatasync(l.wal); err != nil {
		l.failed = err
		return fmt.Errorf("storage: append %d records: sync write-ahead log: %w", len(recs), err)
	}
	l.walOff += int64(len(frame))
	l.last = last
	// The pending copies alias the frame (one allocation), not the
	// caller's slices, which it may reuse.
	stored, err := decodePayload(frame[frameHeader:])
	if err != nil {
		panic(fmt.Sprintf("storage: a frame just encoded does not decode: %v", err))
	}
	l.tail = append(l.tail, stored...)
	for _, r := range stored {
		if r.Rev != 0 {
			l.tailRevs[r.Rev] = r.Index
		}
		l.tailBytes += len(r.Change)
	}
	if len(l.tail) >= l.opts.flushRecords || l.tailBytes >= l.opts.flushBytes {
		select {
		case l.kick <- struct{}{}:
		default:
		}
	}
	return nil
}

// flusher commits the pending records to bbolt every flushEvery, or sooner
// when Append says enough are pending, until Close.
func (l *Log) flusher() {
	defer close(l.flushDone)
	var tick <-chan time.Time
	if l.opts.flushEvery > 0 {
		t := time.NewTicker(l.opts.flushEvery)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-l.stop:
			return
		case <-l.kick:
		case <-tick:
		}
		l.mu.RLock()
		if l.db != nil {
			// A failure is sticky in flushLocked; Append reports it.
			_ = l.flushLocked()
		}
		l.mu.RUnlock()
	}
}

// Flush commits every record appended so far to bbolt (one fsync'd
// transaction) and drops the WAL segments it makes redundant.
func (l *Log) Flush() error {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.db == nil {
		return ErrClosed
	}
	return l.flushLocked()
}

// flushLocked is Flush with mu held, in either mode.
func (l *Log) flushLocked() error {
	l.flushMu.Lock()
	defer l.flushMu.Unlock()

	// A large segment is replaced by a fresh one, created (and its
	// directory entry synced) before the swap so Append never waits for it.
	l.walMu.Lock()
	rotate, seq, failed := l.walOff >= l.opts.segmentBytes, l.walSeq+1, l.failed
	l.walMu.Unlock()
	var next *os.File
	if rotate && failed == nil {
		f, err := createSegment(l.dir, seq)
		if err != nil {
			return l.fail(fmt.Errorf("storage: flush: %w", err))
		}
		next = f
	}
	l.walMu.Lock()
	pending := l.tail
	var old *os.File
	if next != nil {
		l.rotated = append(l.rotated, segment{seq: l.walSeq, last: l.last})
		old, l.wal, l.walSeq, l.walOff = l.wal, next, seq, 0
	}
	drop := l.rotated // every record in them is in bbolt or in pending
	l.walMu.Unlock()
	if old != nil {
		if err := old.Close(); err != nil {
			return l.fail(fmt.Errorf("storage: flush: close write-ahead log: %w", err))
		}
	}

	if len(pending) > 0 {
		if err := l.db.Update(func(tx *bolt.Tx) error { return putRecords(tx, pending) }); err != nil {
			return l.fail(fmt.Errorf("storage: flush %d records: %w", len(pending), err))
		}
	}
	if h := l.opts.afterCommit; h != nil {
		if err := h(); err != nil {
			return err
		}
	}

	l.walMu.Lock()
	rest := l.tail[len(pending):]
	l.tail = append(make([]Record, 0, len(rest)), rest...)
	for _, r := range pending {
		if r.Rev != 0 && l.tailRevs[r.Rev] == r.Index {
			delete(l.tailRevs, r.Rev)
		}
		l.tailBytes -= len(r.Change)
	}
	l.rotated = l.rotated[len(drop):]
	l.walMu.Unlock()
	// bbolt's commit is fsync'd, so these are redundant. Not syncing the
	// directory: a removal lost to a power cut only means recovery reads
	// records bbolt already has, and skips them by index.
	for _, s := range drop {
		if err := os.Remove(filepath.Join(l.dir, segmentName(s.seq))); err != nil && !os.IsNotExist(err) {
			return l.fail(fmt.Errorf("storage: flush: remove write-ahead log: %w", err))
		}
	}
	return nil
}

// fail records err as the log's sticky failure and returns it.
func (l *Log) fail(err error) error {
	l.walMu.Lock()
	if l.failed == nil {
		l.failed = err
	}
	l.walMu.Unlock()
	return err
}

// SetCompacted persists the compacted revision. It never goes back: a
// lower revision than the stored one is refused, since it would make
// Range answer revisions whose history is already gone.
func (l *Log) SetCompacted(rev int64) error {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.db == nil {
		return ErrClosed
	}
	err := l.db.Update(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if v := meta.Get(metaCompacted); v != nil {
			if cur := int64(binary.BigEndian.Uint64(v)); rev < cur {
				return fmt.Errorf("revision %d is before the compacted revision %d", rev, cur)
			}
		}
		return meta.Put(metaCompacted, u64(uint64(rev)))
	})
	if err != nil {
		return fmt.Errorf("storage: set compacted revision: %w", err)
	}
	return nil
}

// Load calls fn with every record in index order and returns the compacted
// revision. The record's Change is the caller's to keep. An error from fn
// stops the load and is returned wrapped.
func (l *Log) Load(fn func(Record) error) (compacted int64, err error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.db == nil {
		return 0, ErrClosed
	}
	// The pending records first, then bbolt's view: a flush in between
	// puts records in both (skipped below by index), never in neither,
	// since a record leaves the tail only after bbolt committed it.
	l.walMu.Lock()
	tail := l.tail
	l.walMu.Unlock()
	err = l.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketMeta).Get(metaCompacted); v != nil {
			compacted = int64(binary.BigEndian.Uint64(v))
		}
		var last uint64
		c := tx.Bucket(bucketChanges).Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if len(k) != 8 {
				return fmt.Errorf("bad record key %x", k)
			}
			r, err := decodeRecord(binary.BigEndian.Uint64(k), v)
			if err != nil {
				return err
			}
			last = r.Index
			if err := fn(r); err != nil {
				return fmt.Errorf("record %d: %w", r.Index, err)
			}
		}
		for _, r := range tail {
			if r.Index <= last {
				continue
			}
			r.Change = bytes.Clone(r.Change)
			if err := fn(r); err != nil {
				return fmt.Errorf("record %d: %w", r.Index, err)
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("storage: load: %w", err)
	}
	return compacted, nil
}

// Checkpoint is a snapshot of the caller's state as of an index, with what
// the log keeps beside it.
//
// Records are kept from KeepFrom on: those in [KeepFrom, Index] are already
// in the snapshot but still stored, because the caller needs them for
// something else than its state (the edge server's sync log still sends
// them to peers that lack them); those after Index are not in the snapshot.
// Recovery is then: restore Snapshot, and for each record Load yields (all
// of them from KeepFrom on), replay it when its index is past Index, and
// only hand it to whatever needed it kept otherwise.
type Checkpoint struct {
	// Index is the last index the snapshot covers; 0 is a state that
	// covers no change of this log (one a peer's snapshot transfer built).
	Index uint64
	// KeepFrom is the first index still stored, at most Index+1: every
	// record before it is deleted with the checkpoint.
	KeepFrom uint64
	// Snapshot is the caller's encoding of its state as of Index.
	Snapshot []byte
	// Meta is the caller's, stored in the same transaction, so it always
	// describes this checkpoint's KeepFrom (the edge server: its sync log's
	// per replica counts of the changes before KeepFrom).
	Meta []byte
}

// Checkpoint bounds the log: in one transaction it stores cp and deletes
// every record before cp.KeepFrom (and their revision entries). A crash
// leaves either the old checkpoint and records or the new ones, never a
// mix, so recovery replays each change once and finds every kept record.
//
// cp.Index must not pass the last appended record, nor go back (the same
// index again is allowed: a state can change without a change of this
// log, as a peer's snapshot transfer does); cp.KeepFrom must be in
// [1, cp.Index+1] and must not go back either, since the records before
// the last checkpoint's are gone.
//
// It does not defragment: the pages of the deleted records (and of the
// previous snapshot) go to bbolt's free list, and the appends and the next
// snapshot reuse them, so under a steady load the file stays at its
// high-water mark instead of growing (TestCheckpointDiskStaysFlat measures
// it). Defragment gives the free pages back to the file system when the
// working set shrinks for good; it copies the whole file with appends
// blocked, too much to pay on every checkpoint.
func (l *Log) Checkpoint(cp Checkpoint) error {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.db == nil {
		return ErrClosed
	}
	if cp.KeepFrom < 1 || cp.KeepFrom > cp.Index+1 {
		return fmt.Errorf("storage: checkpoint at %d: keep-from %d is not in [1, %d]", cp.Index, cp.KeepFrom, cp.Index+1)
	}
	// The records it deletes must be in bbolt to be deleted with it, and
	// a crash must not bring them back from the write-ahead log.
	if err := l.flushLocked(); err != nil {
		return fmt.Errorf("storage: checkpoint at %d: %w", cp.Index, err)
	}
	err := l.db.Update(func(tx *bolt.Tx) error {
		meta, changes, revs := tx.Bucket(bucketMeta), tx.Bucket(bucketChanges), tx.Bucket(bucketRevs)
		prev, ok, err := checkpointOf(tx)
		if err != nil {
			return err
		}
		if ok {
			if cp.Index < prev.Index {
				return fmt.Errorf("index %d is before the last checkpoint at %d", cp.Index, prev.Index)
			}
			if cp.KeepFrom < prev.KeepFrom {
				return fmt.Errorf("keep-from %d is before the last checkpoint's %d: those records are deleted", cp.KeepFrom, prev.KeepFrom)
			}
		}
		if last := lastIndex(tx); cp.Index > last {
			return fmt.Errorf("index %d is past the last stored record %d", cp.Index, last)
		}
		c := changes.Cursor()
		// Delete moves the cursor unpredictably (bbolt #146): start over.
		for k, v := c.First(); k != nil && binary.BigEndian.Uint64(k) < cp.KeepFrom; k, v = c.First() {
			if len(v) >= recordHeader {
				if rev := binary.BigEndian.Uint64(v[1:9]); rev != 0 {
					if err := revs.Delete(u64(rev)); err != nil {
						return fmt.Errorf("delete revision %d: %w", rev, err)
					}
				}
			}
			if err := c.Delete(); err != nil {
				return fmt.Errorf("delete record %d: %w", binary.BigEndian.Uint64(k), err)
			}
		}
		if err := putSnapshot(tx, cp.Snapshot); err != nil {
			return err
		}
		for _, kv := range []struct{ k, v []byte }{
			{metaSnapshotMeta, cp.Meta},
			{metaSnapshotKeep, u64(cp.KeepFrom)},
			// Last: its presence says there is a checkpoint.
			{metaSnapshotIndex, u64(cp.Index)},
		} {
			// bbolt refuses a nil value; an empty one reads back as empty.
			if err := meta.Put(kv.k, append([]byte{}, kv.v...)); err != nil {
				return fmt.Errorf("put %s: %w", kv.k, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("storage: checkpoint at %d: %w", cp.Index, err)
	}
	return nil
}

// snapshotChunk is the size of the values the snapshot is stored in.
// One value of the whole snapshot would need a run of contiguous free
// pages as long as itself at every checkpoint, which the pages freed by
// deleted records (scattered, one or two at a time) seldom offer, so the
// file would grow to fit it; chunks of 8 pages fit the holes.
// TestCheckpointDiskStaysFlat measures the difference.
const snapshotChunk = 8 * 4096

// putSnapshot replaces the stored snapshot by snap.
func putSnapshot(tx *bolt.Tx, snap []byte) error {
	if tx.Bucket(bucketSnapshot) != nil {
		if err := tx.DeleteBucket(bucketSnapshot); err != nil {
			return fmt.Errorf("delete the previous snapshot: %w", err)
		}
	}
	b, err := tx.CreateBucket(bucketSnapshot)
	if err != nil {
		return fmt.Errorf("create snapshot bucket: %w", err)
	}
	b.FillPercent = 1 // keys only grow
	for i := 0; len(snap) > 0 || i == 0; i++ {
		n := min(len(snap), snapshotChunk)
		if err := b.Put(u64(uint64(i)), append([]byte{}, snap[:n]...)); err != nil {
			return fmt.Errorf("put snapshot chunk %d: %w", i, err)
		}
		snap = snap[n:]
	}
	return nil
}

// checkpointOf reads the checkpoint in tx; Meta aliases bbolt's memory
// (valid in the transaction only), Snapshot is a copy.
func checkpointOf(tx *bolt.Tx) (Checkpoint, bool, error) {
	meta := tx.Bucket(bucketMeta)
	v := meta.Get(metaSnapshotIndex)
	if v == nil {
		return Checkpoint{}, false, nil
	}
	k := meta.Get(metaSnapshotKeep)
	b := tx.Bucket(bucketSnapshot)
	if len(v) != 8 || len(k) != 8 || b == nil {
		return Checkpoint{}, false, fmt.Errorf("checkpoint metadata damaged (index %x, keep-from %x, snapshot bucket %v)", v, k, b != nil)
	}
	cp := Checkpoint{Index: binary.BigEndian.Uint64(v), KeepFrom: binary.BigEndian.Uint64(k), Meta: meta.Get(metaSnapshotMeta)}
	c := b.Cursor()
	want := uint64(0)
	for key, val := c.First(); key != nil; key, val = c.Next() {
		if len(key) != 8 || binary.BigEndian.Uint64(key) != want {
			return Checkpoint{}, false, fmt.Errorf("snapshot chunk %x where chunk %d belongs", key, want)
		}
		cp.Snapshot = append(cp.Snapshot, val...)
		want++
	}
	if cp.Snapshot == nil {
		cp.Snapshot = []byte{}
	}
	return cp, true, nil
}

// LastCheckpoint returns the last Checkpoint stored, false when there was
// none. Load then yields the records from its KeepFrom on.
func (l *Log) LastCheckpoint() (Checkpoint, bool, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.db == nil {
		return Checkpoint{}, false, ErrClosed
	}
	var (
		cp Checkpoint
		ok bool
	)
	err := l.db.View(func(tx *bolt.Tx) error {
		var err error
		if cp, ok, err = checkpointOf(tx); ok {
			cp.Meta = bytes.Clone(cp.Meta)
		}
		return err
	})
	if err != nil {
		return Checkpoint{}, false, fmt.Errorf("storage: read checkpoint: %w", err)
	}
	return cp, ok, nil
}

// IndexOfRevision returns the index of the record that got rev.
func (l *Log) IndexOfRevision(rev int64) (uint64, bool, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.db == nil {
		return 0, false, ErrClosed
	}
	// The tail first: a record leaves it only once bbolt has it.
	l.walMu.Lock()
	idx, found := l.tailRevs[rev]
	l.walMu.Unlock()
	if found {
		return idx, true, nil
	}
	err := l.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketRevs).Get(u64(uint64(rev))); v != nil {
			idx, found = binary.BigEndian.Uint64(v), true
		}
		return nil
	})
	if err != nil {
		return 0, false, fmt.Errorf("storage: revision %d: %w", rev, err)
	}
	return idx, found, nil
}

// Meta returns the value stored under key, nil when there is none.
func (l *Log) Meta(key string) ([]byte, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.db == nil {
		return nil, ErrClosed
	}
	var out []byte
	err := l.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketMeta).Get([]byte(userPrefix + key)); v != nil {
			out = bytes.Clone(v) // bbolt's memory is only valid in the tx
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("storage: meta %q: %w", key, err)
	}
	return out, nil
}

// SetMeta stores v under key, durably.
func (l *Log) SetMeta(key string, v []byte) error {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.db == nil {
		return ErrClosed
	}
	err := l.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put([]byte(userPrefix+key), v)
	})
	if err != nil {
		return fmt.Errorf("storage: set meta %q: %w", key, err)
	}
	return nil
}

// Size is the size of the database file in bytes (Status' db_size), 0 when
// closed.
func (l *Log) Size() int64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.db == nil {
		return 0
	}
	var n int64
	_ = l.db.View(func(tx *bolt.Tx) error {
		n = tx.Size()
		return nil
	})
	return n
}

// SizeInUse is Size less the free pages (Status' db_size_in_use), as
// etcd's backend computes it; Defragment gives the difference back.
func (l *Log) SizeInUse() int64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.db == nil {
		return 0
	}
	var n int64
	_ = l.db.View(func(tx *bolt.Tx) error {
		n = tx.Size() - int64(l.db.Stats().FreePageN)*int64(l.db.Info().PageSize)
		return nil
	})
	return n
}

// Defragment rewrites the file without its free pages, as etcd's
// Maintenance.Defragment does for its backend. Appends wait while it runs.
// The copy is written and fsync'd beside the file, then renamed over it, so
// a crash in between leaves either the old file or the new one.
func (l *Log) Defragment() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.db == nil {
		return ErrClosed
	}
	// The copy must hold every record; and the flusher waits on mu.
	if err := l.flushLocked(); err != nil {
		return fmt.Errorf("storage: defragment: %w", err)
	}
	tmp := l.path + ".defrag"
	_ = os.Remove(tmp) // left over from a crash during an earlier defragment
	dst, err := bolt.Open(tmp, 0o600, &bolt.Options{Timeout: 2 * time.Second, FreelistType: bolt.FreelistMapType})
	if err != nil {
		return fmt.Errorf("storage: defragment: open copy: %w", err)
	}
	if err := bolt.Compact(dst, l.db, 0); err != nil {
		_ = dst.Close()
		_ = os.Remove(tmp)
		return fmt.Errorf("storage: defragment: copy: %w", err)
	}
	// Compact's commits are fsync'd; Close releases the copy's lock.
	if err := dst.Close(); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("storage: defragment: close copy: %w", err)
	}
	if err := l.db.Close(); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("storage: defragment: close: %w", err)
	}
	l.db = nil
	renameErr := os.Rename(tmp, l.path)
	if renameErr == nil {
		renameErr = syncDir(filepath.Dir(l.path))
	}
	// Reopen whichever file is now in place, so a failed rename still
	// leaves a working log.
	db, err := openDB(l.path)
	if err != nil {
		return fmt.Errorf("storage: defragment: reopen: %w", errors.Join(renameErr, err))
	}
	l.db = db
	if renameErr != nil {
		return fmt.Errorf("storage: defragment: replace file: %w", renameErr)
	}
	return nil
}

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Close commits what is pending to bbolt, removes the write-ahead log it
// makes redundant, and closes the files. Calling it again returns nil.
func (l *Log) Close() error {
	// The flusher takes mu, so it is stopped before Close takes it.
	l.stopOnce.Do(func() { close(l.stop) })
	<-l.flushDone
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.db == nil {
		if l.wal != nil { // a failed Defragment reopen left the WAL open
			err := l.wal.Close()
			l.wal = nil
			return err
		}
		return nil
	}
	err := l.flushLocked()
	if err == nil {
		// Everything is in bbolt: the current segment goes too, and Open
		// starts the next one.
		err = os.Remove(filepath.Join(l.dir, segmentName(l.walSeq)))
	}
	err = errors.Join(err, l.wal.Close(), l.db.Close())
	l.db, l.wal = nil, nil
	if err != nil {
		return fmt.Errorf("storage: close: %w", err)
	}
	return nil
}

// crash closes the files as a killed process would: nothing flushed,
// nothing removed. For tests of recovery.
func (l *Log) crash() {
	l.stopOnce.Do(func() { close(l.stop) })
	<-l.flushDone
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.db != nil {
		_ = l.wal.Close()
		_ = l.db.Close()
		l.db = nil
	}
}

func u64(v uint64) []byte {
	return binary.BigEndian.AppendUint64(make([]byte, 0, 8), v)
}

func encodeRecord(r *Record) []byte {
	b := make([]byte, 0, recordHeader+len(r.Change))
	b = append(b, recordVersion)
	b = binary.BigEndian.AppendUint64(b, uint64(r.Rev))
	b = append(b, r.ID[:]...)
	return append(b, r.Change...)
}

func decodeRecord(index uint64, v []byte) (Record, error) {
	if len(v) < recordHeader {
		return Record{}, fmt.Errorf("record %d: %d bytes, shorter than its header", index, len(v))
	}
	if v[0] != recordVersion {
		return Record{}, fmt.Errorf("record %d: unknown format version %d", index, v[0])
	}
	r := Record{
		Index:  index,
		Rev:    int64(binary.BigEndian.Uint64(v[1:9])),
		Change: bytes.Clone(v[recordHeader:]),
	}
	copy(r.ID[:], v[9:recordHeader])
	return r, nil
}
