package storage

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// walOnly keeps every record in the write-ahead log: nothing flushes until
// Close, so a crash() leaves bbolt without them.
var walOnly = options{flushRecords: 1 << 30, flushBytes: 1 << 30, segmentBytes: 1 << 40}

// appendBatches appends batches of per records from index 1 and returns
// the offset in the (single) segment at which each batch's frame ends.
func appendBatches(t *testing.T, l *Log, batches, per uint64) []int64 {
	t.Helper()
	var ends []int64
	for b := uint64(0); b < batches; b++ {
		batch := make([]Record, 0, per)
		for i := b*per + 1; i <= (b+1)*per; i++ {
			batch = append(batch, testRecord(i))
		}
		if err := l.Append(batch); err != nil {
			t.Fatal(err)
		}
		l.walMu.Lock()
		ends = append(ends, l.walOff)
		l.walMu.Unlock()
	}
	return ends
}

func onlySegment(t *testing.T, dir string) string {
	t.Helper()
	seqs, err := listSegments(dir)
	if err != nil || len(seqs) != 1 {
		t.Fatalf("segments %v, %v: want exactly one", seqs, err)
	}
	return filepath.Join(dir, segmentName(seqs[0]))
}

// checkPrefix reopens dir and checks it holds exactly records 1..n, then
// that the log goes on from there and keeps it across another restart.
func checkPrefix(t *testing.T, dir string, n uint64) {
	t.Helper()
	l, err := Open(dir)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	got, _ := loadAll(t, l)
	if uint64(len(got)) != n {
		t.Fatalf("recovered %d records, want %d", len(got), n)
	}
	for i, r := range got {
		if !equalRecord(r, testRecord(uint64(i+1))) {
			t.Fatalf("record %d differs after recovery", i+1)
		}
	}
	if err := l.Append([]Record{testRecord(n + 1)}); err != nil {
		t.Fatalf("append after recovery: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if got, _ := loadAll(t, l); uint64(len(got)) != n+1 {
		t.Fatalf("after append and restart: %d records, want %d", len(got), n+1)
	}
}

// A process killed between the WAL's fdatasync and bbolt's commit: every
// acknowledged batch comes back from the WAL alone.
func TestCrashBeforeFlushRecoversFromTheWAL(t *testing.T) {
	dir := t.TempDir()
	l, err := open(dir, walOnly)
	if err != nil {
		t.Fatal(err)
	}
	appendBatches(t, l, 20, 7)
	if n, err := l.dbLast(); err != nil || n != 0 {
		t.Fatalf("bbolt's last index before any flush = %d, %v: the test would not test the WAL", n, err)
	}
	l.crash()
	checkPrefix(t, dir, 140)
}

// A crash after a flush's bbolt commit but before its segments are
// removed leaves records in both: each must come back once.
func TestCrashAfterFlushCommitDedupes(t *testing.T) {
	dir := t.TempDir()
	crashed := errors.New("crash point")
	opts := walOnly
	opts.segmentBytes = 1 // rotate at every flush, so the flush has a segment to drop
	opts.afterCommit = func() error { return crashed }
	l, err := open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	appendBatches(t, l, 10, 5)
	if err := l.Flush(); !errors.Is(err, crashed) {
		t.Fatalf("Flush = %v, want the crash point", err)
	}
	if n, _ := l.dbLast(); n != 50 {
		t.Fatalf("bbolt holds up to %d, want 50 (the flush's commit)", n)
	}
	if seqs, _ := listSegments(dir); len(seqs) != 2 {
		t.Fatalf("segments %v: want the flushed one still there and the new one", seqs)
	}
	l.crash()
	checkPrefix(t, dir, 50)
}

// A torn last write (the file cut inside the last frame) was never
// acknowledged: recovery yields the batches before it. Garbage after the
// last whole frame (a torn write that reached the size but not the data)
// likewise ends the log.
func TestTornWALTailRecoversTheAcknowledgedPrefix(t *testing.T) {
	const batches, per = 8, 3
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, path string, ends []int64)
		want   uint64
	}{
		{"cut in the last header", func(t *testing.T, p string, ends []int64) { truncate(t, p, ends[batches-2]+3) }, (batches - 1) * per},
		{"cut in the last payload", func(t *testing.T, p string, ends []int64) { truncate(t, p, ends[batches-1]-5) }, (batches - 1) * per},
		{"last frame's checksum wrong", func(t *testing.T, p string, ends []int64) { flip(t, p, ends[batches-1]-1) }, (batches - 1) * per},
		{"garbage after the last frame", func(t *testing.T, p string, ends []int64) {
			appendBytes(t, p, []byte(strings.Repeat("\x00\x00\x01\x00garbage!", 40)))
		}, batches * per},
		{"zeros after the last frame", func(t *testing.T, p string, ends []int64) { appendBytes(t, p, make([]byte, 4096)) }, batches * per},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			l, err := open(dir, walOnly)
			if err != nil {
				t.Fatal(err)
			}
			ends := appendBatches(t, l, batches, per)
			l.crash()
			tc.damage(t, onlySegment(t, dir), ends)
			checkPrefix(t, dir, tc.want)
		})
	}
}

// Damage before valid frames is not a torn tail: acknowledged batches lie
// beyond it. Open must refuse, naming the file, and leave it for repair.
func TestCorruptWALFrameIsAnError(t *testing.T) {
	for _, tc := range []struct {
		name string
		at   func(ends []int64) int64
	}{
		{"payload of frame 3", func(ends []int64) int64 { return ends[2] + 20 }},
		{"length of frame 2", func(ends []int64) int64 { return ends[0] + 2 }},
		{"first frame's checksum", func(ends []int64) int64 { return 5 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			l, err := open(dir, walOnly)
			if err != nil {
				t.Fatal(err)
			}
			ends := appendBatches(t, l, 6, 4)
			l.crash()
			path := onlySegment(t, dir)
			flip(t, path, tc.at(ends))
			before, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			l, err = Open(dir)
			if err == nil {
				l.Close()
				t.Fatal("Open accepted a WAL damaged before valid frames")
			}
			if !errors.Is(err, errCorrupt) || !strings.Contains(err.Error(), path) {
				t.Fatalf("Open = %v, want a corrupt-WAL error naming %s", err, path)
			}
			after, err := os.ReadFile(path)
			if err != nil || string(after) != string(before) {
				t.Fatalf("the damaged segment was changed or removed (%v)", err)
			}
		})
	}
}

// Segments rotate and go once bbolt has them, so the WAL stays bounded
// while the records stay.
func TestSegmentsRotateAndGo(t *testing.T) {
	dir := t.TempDir()
	opts := walOnly
	opts.segmentBytes = 2048
	l, err := open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for b := uint64(0); b < 40; b++ {
		batch := []Record{testRecord(2*b + 1), testRecord(2*b + 2)}
		if err := l.Append(batch); err != nil {
			t.Fatal(err)
		}
		if b%5 == 4 {
			if err := l.Flush(); err != nil {
				t.Fatal(err)
			}
			if seqs, _ := listSegments(dir); len(seqs) != 1 {
				t.Fatalf("after flush %d: segments %v, want only the current one", b/5, seqs)
			}
		}
	}
	if got, _ := loadAll(t, l); len(got) != 80 {
		t.Fatalf("%d records, want 80", len(got))
	}
	if idx, ok, err := l.IndexOfRevision(testRecord(79).Rev); err != nil || !ok || idx != 79 {
		t.Fatalf("IndexOfRevision = %d, %v, %v", idx, ok, err)
	}
}

func truncate(t *testing.T, path string, size int64) {
	t.Helper()
	if err := os.Truncate(path, size); err != nil {
		t.Fatal(err)
	}
}

func flip(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b [1]byte
	if _, err := f.ReadAt(b[:], off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x5a
	if _, err := f.WriteAt(b[:], off); err != nil {
		t.Fatal(err)
	}
}

func appendBytes(t *testing.T, path string, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
}
