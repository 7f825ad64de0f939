package storage

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

func appendRange(t testing.TB, l *Log, from, to uint64) {
	t.Helper()
	var recs []Record
	for i := from; i <= to; i++ {
		recs = append(recs, testRecord(i))
	}
	if err := l.Append(recs); err != nil {
		t.Fatal(err)
	}
}

func TestCheckpointKeepsFromKeepFrom(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	appendRange(t, l, 1, 20)
	if _, ok, err := l.LastCheckpoint(); err != nil || ok {
		t.Fatalf("LastCheckpoint before any = %v, %v", ok, err)
	}
	for name, cp := range map[string]Checkpoint{
		"past the last record":  {Index: 21, KeepFrom: 1},
		"keep-from zero":        {Index: 12, KeepFrom: 0},
		"keep-from past index":  {Index: 12, KeepFrom: 14},
		"keep-from past record": {Index: 20, KeepFrom: 22},
	} {
		if err := l.Checkpoint(cp); err == nil {
			t.Errorf("%s: Checkpoint(%+v) accepted", name, cp)
		}
	}
	// Snapshot as of 12; the records from 8 stay (the sync log still
	// needs 8..12), those before go.
	if err := l.Checkpoint(Checkpoint{Index: 12, KeepFrom: 8, Snapshot: []byte("state@12"), Meta: []byte("below 8")}); err != nil {
		t.Fatal(err)
	}
	for name, cp := range map[string]Checkpoint{
		"index going back":     {Index: 11, KeepFrom: 8},
		"keep-from going back": {Index: 13, KeepFrom: 7},
	} {
		if err := l.Checkpoint(cp); err == nil {
			t.Errorf("%s: Checkpoint(%+v) accepted", name, cp)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	l, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	cp, ok, err := l.LastCheckpoint()
	if err != nil || !ok || cp.Index != 12 || cp.KeepFrom != 8 || string(cp.Snapshot) != "state@12" || string(cp.Meta) != "below 8" {
		t.Fatalf("LastCheckpoint = %+v, %v, %v; want 12, keep 8, state@12, below 8", cp, ok, err)
	}
	got, _ := loadAll(t, l)
	if len(got) != 13 || got[0].Index != 8 {
		t.Fatalf("after the checkpoint Load gives %d records from %d, want 13 from 8", len(got), got[0].Index)
	}
	for _, r := range got {
		if !equalRecord(r, testRecord(r.Index)) {
			t.Fatalf("record %d differs", r.Index)
		}
	}
	// Revisions of deleted records are gone; kept ones stay, covered by
	// the snapshot or not.
	if _, ok, _ := l.IndexOfRevision(testRecord(3).Rev); ok {
		t.Error("revision of a deleted record still indexed")
	}
	for _, i := range []uint64{9, 14} {
		if idx, ok, _ := l.IndexOfRevision(testRecord(i).Rev); !ok || idx != i {
			t.Errorf("IndexOfRevision of kept record %d = %d, %v", i, idx, ok)
		}
	}
	// The same index again (a state changed without a change of this
	// log): allowed, and it may move keep-from on.
	if err := l.Checkpoint(Checkpoint{Index: 12, KeepFrom: 13, Snapshot: []byte("state@12'")}); err != nil {
		t.Fatal(err)
	}
	if got, _ := loadAll(t, l); len(got) != 8 || got[0].Index != 13 {
		t.Fatalf("keep-from 13: %d records from %d", len(got), got[0].Index)
	}
	if cp, _, _ := l.LastCheckpoint(); cp.Meta == nil || len(cp.Meta) != 0 {
		t.Errorf("a checkpoint without meta reads back meta %q, want empty", cp.Meta)
	}
	// A checkpoint of everything still keeps the index moving forward.
	if err := l.Checkpoint(Checkpoint{Index: 20, KeepFrom: 21, Snapshot: []byte("state@20")}); err != nil {
		t.Fatal(err)
	}
	if got, _ := loadAll(t, l); len(got) != 0 {
		t.Fatalf("keep-from 21: %d records", len(got))
	}
	if err := l.Append([]Record{testRecord(20)}); err == nil {
		t.Error("Append of an index the checkpoint covers was accepted")
	}
	appendRange(t, l, 21, 22)
}

// A checkpoint at index 0: a replica whose whole state came from a peer's
// snapshot transfer before it applied a change of its own.
func TestCheckpointAtIndexZero(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Checkpoint(Checkpoint{Index: 0, KeepFrom: 1, Snapshot: []byte("transferred")}); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if l, err = Open(dir); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	cp, ok, err := l.LastCheckpoint()
	if err != nil || !ok || cp.Index != 0 || string(cp.Snapshot) != "transferred" {
		t.Fatalf("LastCheckpoint = %+v, %v, %v", cp, ok, err)
	}
	appendRange(t, l, 1, 3)
	if got, _ := loadAll(t, l); len(got) != 3 {
		t.Fatalf("%d records, want 3", len(got))
	}
}

// The records a checkpoint deletes must not come back from the write-ahead
// log: Checkpoint flushes them to bbolt first, and a crash right after it
// (the segments still on disk) must not resurrect them.
func TestCheckpointThenCrashKeepsThemDeleted(t *testing.T) {
	dir := t.TempDir()
	l, err := open(dir, walOnly)
	if err != nil {
		t.Fatal(err)
	}
	appendRange(t, l, 1, 30)
	if err := l.Checkpoint(Checkpoint{Index: 25, KeepFrom: 20, Snapshot: []byte("s")}); err != nil {
		t.Fatal(err)
	}
	appendRange(t, l, 31, 35) // WAL only
	l.crash()
	if l, err = open(dir, walOnly); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got, _ := loadAll(t, l)
	if len(got) != 16 || got[0].Index != 20 || got[len(got)-1].Index != 35 {
		t.Fatalf("after crash: %d records, %d..%d; want 20..35", len(got), got[0].Index, got[len(got)-1].Index)
	}
}

// snapshotOf is the deterministic snapshot the crash child writes as of
// index i: its size varies (up to ~200 KiB, overflow pages of varying
// length) and it names i, so a snapshot paired with the wrong index or
// torn shows.
func snapshotOf(i uint64) []byte {
	h := sha256.Sum256(binary.BigEndian.AppendUint64(nil, i))
	return append(binary.BigEndian.AppendUint64(nil, i), bytes.Repeat(h[:], 1+int(i%6400))...)
}

// metaOf is the meta the child stores with keep-from k.
func metaOf(k uint64) []byte { return []byte(fmt.Sprintf("below %d", k)) }

// TestCrashDuringCheckpoints kills a process with SIGKILL while it appends
// and checkpoints in a loop (keep-from trailing the checkpoint index, as
// the server's sync log does), then checks: the checkpoint is whole (its
// snapshot, meta and keep-from belong together), the records are exactly
// keep-from..N with nothing before keep-from and no gap, every
// acknowledged record is there, and a checkpoint acknowledged before the
// kill is the one found or an older one never is.
func TestCrashDuringCheckpoints(t *testing.T) {
	if dir := os.Getenv(crashChildEnv); dir != "" {
		checkpointChild(dir, crashModes[os.Getenv(crashModeEnv)])
		return
	}
	for _, mode := range []string{"default", "walonly", "churn"} {
		t.Run(mode, func(t *testing.T) {
			for round := 0; round < 3; round++ {
				testCrashDuringCheckpoints(t, mode, round)
			}
		})
	}
}

func testCrashDuringCheckpoints(t *testing.T, mode string, round int) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashDuringCheckpoints$")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+dir, crashModeEnv+"="+mode)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// "ack N" after an Append up to N returned, "cp I K" after a
	// Checkpoint returned. The kill lands after a varying number of
	// lines: with a checkpoint every few batches, inside appends,
	// flushes and checkpoints alike.
	killAfter := 40 + round*53
	var acked, cpIndex, cpKeep uint64
	sc := bufio.NewScanner(out)
	lines := 0
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 2 && f[0] == "ack":
			acked, _ = strconv.ParseUint(f[1], 10, 64)
		case len(f) == 3 && f[0] == "cp":
			cpIndex, _ = strconv.ParseUint(f[1], 10, 64)
			cpKeep, _ = strconv.ParseUint(f[2], 10, 64)
		default:
			continue
		}
		if lines++; lines == killAfter {
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	_ = cmd.Wait()
	if lines < killAfter {
		t.Fatalf("child stopped after %d lines, before it was killed (scan error %v)", lines, sc.Err())
	}

	l, err := Open(dir)
	if err != nil {
		t.Fatalf("reopen after kill: %v", err)
	}
	defer l.Close()
	cp, ok, err := l.LastCheckpoint()
	if err != nil {
		t.Fatal(err)
	}
	if cpIndex > 0 && (!ok || cp.Index < cpIndex) {
		t.Fatalf("round %d: checkpoint at %d was acknowledged, found %+v (%v)", round, cpIndex, cp.Index, ok)
	}
	first := uint64(1)
	if ok {
		if !bytes.Equal(cp.Snapshot, snapshotOf(cp.Index)) {
			t.Fatalf("round %d: the snapshot found with index %d is not the one written with it", round, cp.Index)
		}
		if !bytes.Equal(cp.Meta, metaOf(cp.KeepFrom)) || cp.KeepFrom != keepFromOf(cp.Index) {
			t.Fatalf("round %d: checkpoint at %d has keep-from %d, meta %q: not written together", round, cp.Index, cp.KeepFrom, cp.Meta)
		}
		if cp.Index == cpIndex && cp.KeepFrom != cpKeep {
			t.Fatalf("round %d: acknowledged keep-from %d, found %d", round, cpKeep, cp.KeepFrom)
		}
		first = cp.KeepFrom
	}
	got, _ := loadAll(t, l)
	for i, r := range got {
		if !equalRecord(r, testRecord(first+uint64(i))) {
			t.Fatalf("round %d: record at position %d is %d, want record %d intact (keep-from %d)", round, i, r.Index, first+uint64(i), first)
		}
	}
	end := first - 1 + uint64(len(got))
	if ok {
		end = max(end, cp.Index)
	}
	if end < acked {
		t.Fatalf("round %d: the log ends at %d, but %d were acknowledged", round, end, acked)
	}
	if !isBatchBoundary(end) {
		t.Fatalf("round %d: the log ends at %d, not a batch boundary: half a batch survived", round, end)
	}
	t.Logf("%s round %d: acknowledged %d and a checkpoint at %d; found records %d..%d, checkpoint %d keep-from %d",
		mode, round, acked, cpIndex, first, end, cp.Index, cp.KeepFrom)
}

// keepFromOf is the keep-from the child checkpoints index i with: a
// trailing window, so some records the snapshot covers are kept.
func keepFromOf(i uint64) uint64 {
	if i < 50 {
		return 1
	}
	return i - 49
}

func checkpointChild(dir string, opts options) {
	l, err := open(dir, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(1)
	}
	w := bufio.NewWriter(os.Stdout)
	say := func(format string, args ...any) {
		fmt.Fprintf(w, format, args...)
		if err := w.Flush(); err != nil {
			os.Exit(1) // the parent stopped reading: it is about to kill us
		}
	}
	for next, batches := uint64(1), 0; ; batches++ {
		n := batchSize(next)
		batch := make([]Record, 0, n)
		for i := next; i < next+n; i++ {
			batch = append(batch, testRecord(i))
		}
		if err := l.Append(batch); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		next += n
		say("ack %d\n", next-1)
		if batches%3 == 2 {
			// As of a little behind the head, as the server's snapshot
			// is of a durable index while appends go on.
			idx := next - 1 - n/2
			k := keepFromOf(idx)
			if err := l.Checkpoint(Checkpoint{Index: idx, KeepFrom: k, Snapshot: snapshotOf(idx), Meta: metaOf(k)}); err != nil {
				fmt.Fprintln(os.Stderr, "child:", err)
				os.Exit(1)
			}
			say("cp %d %d\n", idx, k)
		}
	}
}

// TestTornCheckpointFallsBackToThePreviousOne tears the meta page of a
// checkpoint's commit, as a power cut in the middle of it would: bbolt
// opens with the transaction before, which must be the old checkpoint
// with every record it kept, none of the deletions half done.
func TestTornCheckpointFallsBackToThePreviousOne(t *testing.T) {
	dir := t.TempDir()
	l, err := open(dir, options{flushRecords: 1 << 30, flushBytes: 1 << 30, segmentBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	appendRange(t, l, 1, 200)
	if err := l.Checkpoint(Checkpoint{Index: 100, KeepFrom: 60, Snapshot: snapshotOf(100), Meta: metaOf(60)}); err != nil {
		t.Fatal(err)
	}
	// Everything is in bbolt now, so the next commit is the checkpoint's
	// alone.
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := l.Checkpoint(Checkpoint{Index: 190, KeepFrom: 150, Snapshot: snapshotOf(190), Meta: metaOf(150)}); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil { // its flush has nothing to commit
		t.Fatal(err)
	}
	tearNewestMeta(t, filepath.Join(dir, FileName))

	if l, err = Open(dir); err != nil {
		t.Fatalf("open after a torn checkpoint: %v", err)
	}
	defer l.Close()
	cp, ok, err := l.LastCheckpoint()
	if err != nil || !ok || cp.Index != 100 || cp.KeepFrom != 60 || !bytes.Equal(cp.Snapshot, snapshotOf(100)) || !bytes.Equal(cp.Meta, metaOf(60)) {
		t.Fatalf("after a torn checkpoint: %d keep-from %d (%v, %v), want the previous one at 100 keep-from 60", cp.Index, cp.KeepFrom, ok, err)
	}
	got, _ := loadAll(t, l)
	if len(got) != 141 || got[0].Index != 60 {
		t.Fatalf("after a torn checkpoint: %d records from %d, want 141 from 60", len(got), got[0].Index)
	}
	for _, r := range got {
		if !equalRecord(r, testRecord(r.Index)) {
			t.Fatalf("record %d differs", r.Index)
		}
	}
}

// tearNewestMeta flips a byte of the checksum of the newer of bbolt's two
// meta pages (after the 16-byte page header the txid is at byte 48, the
// checksum at 56), as a torn last commit leaves it.
func tearNewestMeta(t *testing.T, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	pageSize := int64(os.Getpagesize())
	txid := func(page int64) uint64 {
		var b [8]byte
		if _, err := f.ReadAt(b[:], page*pageSize+16+48); err != nil {
			t.Fatal(err)
		}
		return binary.LittleEndian.Uint64(b[:])
	}
	t0, t1 := txid(0), txid(1)
	if max(t0, t1)-min(t0, t1) != 1 {
		t.Fatalf("meta txids %d and %d: not two consecutive commits (layout misread?)", t0, t1)
	}
	newest := int64(0)
	if t1 > t0 {
		newest = 1
	}
	var b [1]byte
	off := newest*pageSize + 16 + 56
	if _, err := f.ReadAt(b[:], off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b[:], off); err != nil {
		t.Fatal(err)
	}
}

// TestCheckpointDiskStaysFlat is the claim Checkpoint's comment makes:
// under a steady load (appends, and a checkpoint every 2,000 records
// keeping a trailing window of 500 and a 512 KiB snapshot) the database
// stops growing once bbolt's free list holds what one cycle frees, without
// Defragment. Measured on this test (bbolt's high-water mark; the file
// itself grows in 16 MiB steps past it): with the snapshot in one value,
// 2.8 MB after 15 cycles, 3.9 MB after 30, 4.4 MB from 120 to 240 (2.5x
// the 1.8 MB in use: its 128 contiguous pages seldom fit the holes deleted
// records leave); in 32 KiB chunks, 2.2, 2.6, and 2.8 MB from cycle 40 to
// 240 (1.5x). The test runs 80 cycles: flat over the second half.
func TestCheckpointDiskStaysFlat(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	const perCycle, window, cycles = 2000, 500, 80
	snap := bytes.Repeat([]byte("s"), 512<<10)
	next := uint64(1)
	var (
		sizes          []int64
		written, inUse int64
	)
	for c := 0; c < cycles; c++ {
		for b := 0; b < perCycle/100; b++ {
			appendRange(t, l, next, next+99)
			for i := next; i < next+100; i++ {
				written += int64(len(testRecord(i).Change)) + recordHeader
			}
			next += 100
		}
		idx := next - 1
		snap[0] = byte(c) // a new value each time, as a real one is
		if err := l.Checkpoint(Checkpoint{Index: idx, KeepFrom: idx + 1 - window, Snapshot: snap}); err != nil {
			t.Fatal(err)
		}
		// bbolt's high-water mark: the file itself grows in steps of
		// its allocation size (16 MiB) past it.
		sizes = append(sizes, l.Size())
		inUse = max(inUse, l.SizeInUse())
	}
	half, last := sizes[cycles/2-1], sizes[cycles-1]
	t.Logf("database size after cycle 1: %d, 20: %d, %d: %d, %d: %d bytes; at most %d in use; file %d (%d records kept of %d written, %d bytes, snapshot %d bytes)",
		sizes[0], sizes[19], cycles/2, half, cycles, last, inUse, fileSize(t, filepath.Join(dir, FileName)), window, next-1, written, len(snap))
	// Pages that were never reused would grow the file by about what a
	// cycle writes on every cycle: 40 cycles' worth over the second half.
	// Reuse leaves some drift (which pages are free when a commit needs a
	// run of them depends on the flusher's timing: 200 to 270 KB measured
	// on loaded machines), so the bound is one cycle's writes, a fortieth
	// of what a leak would add.
	cycleBytes := written/cycles + int64(len(snap))
	if last > half+cycleBytes {
		t.Fatalf("the database grew from %d to %d bytes between cycles %d and %d under a steady load, more than one cycle writes (%d): freed pages are not reused", half, last, cycles/2, cycles, cycleBytes)
	}
	if last > 2*inUse {
		t.Errorf("database of %d bytes for at most %d in use: the free pages are not reused well", last, inUse)
	}
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}
