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
	"sync"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// testRecord is record i of a deterministic log: every fifth change gets
// no revision (a lease grant, say), so revisions and indexes differ as
// they do in the server. Its payload size varies so records straddle
// pages.
func testRecord(i uint64) Record {
	change := bytes.Repeat(binary.BigEndian.AppendUint64(nil, i), 1+int(i%40))
	r := Record{Index: i, ID: sha256.Sum256(change), Change: change}
	if i%5 != 0 {
		r.Rev = int64(i - i/5)
	}
	return r
}

func loadAll(t *testing.T, l *Log) ([]Record, int64) {
	t.Helper()
	var got []Record
	compacted, err := l.Load(func(r Record) error {
		got = append(got, r)
		return nil
	})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return got, compacted
}

func equalRecord(a, b Record) bool {
	return a.Index == b.Index && a.Rev == b.Rev && a.ID == b.ID && bytes.Equal(a.Change, b.Change)
}

func TestRoundTripAndRestart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "member") // Open creates it
	l, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	var want []Record
	for i := uint64(1); i <= 10; i++ {
		want = append(want, testRecord(i))
	}
	if err := l.Append(want[:3]); err != nil {
		t.Fatal(err)
	}
	if err := l.Append(want[3:]); err != nil {
		t.Fatal(err)
	}
	if err := l.SetCompacted(4); err != nil {
		t.Fatal(err)
	}
	if err := l.SetMeta("member-id", []byte{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	check := func(l *Log) {
		t.Helper()
		got, compacted := loadAll(t, l)
		if compacted != 4 {
			t.Errorf("compacted = %d, want 4", compacted)
		}
		if len(got) != len(want) {
			t.Fatalf("loaded %d records, want %d", len(got), len(want))
		}
		for i := range want {
			if !equalRecord(got[i], want[i]) {
				t.Errorf("record %d = %+v, want %+v", i, got[i], want[i])
			}
		}
		if v, err := l.Meta("member-id"); err != nil || !bytes.Equal(v, []byte{1, 2, 3}) {
			t.Errorf("Meta(member-id) = %v, %v", v, err)
		}
		if v, err := l.Meta("absent"); err != nil || v != nil {
			t.Errorf("Meta(absent) = %v, %v; want nil, nil", v, err)
		}
		// Record 7 got revision 6 (record 5 got none).
		if idx, ok, err := l.IndexOfRevision(6); err != nil || !ok || idx != 7 {
			t.Errorf("IndexOfRevision(6) = %d, %v, %v; want 7", idx, ok, err)
		}
		if _, ok, _ := l.IndexOfRevision(100); ok {
			t.Error("IndexOfRevision(100) found a record")
		}
		if l.Size() <= 0 {
			t.Errorf("Size = %d", l.Size())
		}
	}
	check(l)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := l.Append([]Record{testRecord(11)}); err != ErrClosed {
		t.Errorf("Append after Close = %v, want ErrClosed", err)
	}

	l, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	check(l)
}

// A loaded record's Change must not alias bbolt's mmap: the caller keeps
// it after the transaction (and a later remap would fault on it).
func TestLoadedRecordsAreCopies(t *testing.T) {
	l, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Append([]Record{testRecord(1)}); err != nil {
		t.Fatal(err)
	}
	got, _ := loadAll(t, l)
	got[0].Change[0] ^= 0xff
	again, _ := loadAll(t, l)
	if !equalRecord(again[0], testRecord(1)) {
		t.Fatal("modifying a loaded record changed the stored one")
	}
}

func TestAppendRefusesOutOfOrder(t *testing.T) {
	l, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Append([]Record{testRecord(1), testRecord(2)}); err != nil {
		t.Fatal(err)
	}
	for name, batch := range map[string][]Record{
		"repeat stored": {testRecord(2)},
		"before stored": {testRecord(1)},
		"within batch":  {testRecord(4), testRecord(3)},
		"zero index":    {{Index: 0}},
		"bad then good": {testRecord(3), testRecord(3)},
		"negative rev":  {{Index: 9, Rev: -1}},
	} {
		if err := l.Append(batch); err == nil {
			t.Errorf("%s: Append accepted %v", name, batch)
		}
	}
	// A refused batch stores nothing, not even its valid prefix.
	got, _ := loadAll(t, l)
	if len(got) != 2 {
		t.Fatalf("after refused batches: %d records, want 2", len(got))
	}
	if err := l.Append([]Record{testRecord(5)}); err != nil {
		t.Errorf("a gap is allowed (history may be trimmed in part 2): %v", err)
	}
}

func TestSetCompactedNeverGoesBack(t *testing.T) {
	l, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.SetCompacted(10); err != nil {
		t.Fatal(err)
	}
	if err := l.SetCompacted(10); err != nil {
		t.Errorf("same revision again: %v", err)
	}
	if err := l.SetCompacted(9); err == nil {
		t.Error("SetCompacted(9) after 10 accepted")
	}
	if _, c := loadAll(t, l); c != 10 {
		t.Errorf("compacted = %d, want 10", c)
	}
}

func TestManyRecordsAndDefragment(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	const n = 20000
	for i := uint64(1); i <= n; i += 100 {
		batch := make([]Record, 0, 100)
		for j := i; j < i+100; j++ {
			batch = append(batch, testRecord(j))
		}
		if err := l.Append(batch); err != nil {
			t.Fatal(err)
		}
	}
	// Meta rewrites leave free pages behind for defragment to drop.
	big := bytes.Repeat([]byte("x"), 1<<20)
	for i := 0; i < 8; i++ {
		if err := l.SetMeta(fmt.Sprintf("scratch-%d", i), big); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 8; i++ {
		if err := l.SetMeta(fmt.Sprintf("scratch-%d", i), nil); err != nil {
			t.Fatal(err)
		}
	}
	before, inUse := l.Size(), l.SizeInUse()
	if inUse <= 0 || inUse >= before {
		t.Errorf("SizeInUse %d with Size %d: the freed meta pages are not counted out", inUse, before)
	}
	if err := l.Defragment(); err != nil {
		t.Fatal(err)
	}
	after := l.Size()
	if after >= before {
		t.Errorf("Defragment: size %d -> %d, want smaller", before, after)
	}
	// Only the few pages the commits since have replaced are free.
	if got := l.SizeInUse(); after-got > 16*int64(os.Getpagesize()) {
		t.Errorf("after Defragment SizeInUse = %d, Size = %d: want next to no free pages", got, after)
	}
	if err := l.Append([]Record{testRecord(n + 1)}); err != nil {
		t.Fatalf("Append after Defragment: %v", err)
	}
	got, _ := loadAll(t, l)
	if len(got) != n+1 {
		t.Fatalf("loaded %d records, want %d", len(got), n+1)
	}
	for i, r := range got {
		if !equalRecord(r, testRecord(uint64(i+1))) {
			t.Fatalf("record %d differs after defragment", i+1)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, FileName+".defrag")); !os.IsNotExist(err) {
		t.Errorf("defragment left its copy behind: %v", err)
	}
}

// A stored value this version cannot read is an error naming the record,
// never a silently wrong record.
func TestLoadRefusesUnknownFormat(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Append([]Record{testRecord(1), testRecord(2)}); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(filepath.Join(dir, FileName), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketChanges).Put(u64(2), []byte{99, 0, 0})
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	l, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, err = l.Load(func(Record) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "record 2") {
		t.Fatalf("Load of a corrupt record = %v, want an error naming record 2", err)
	}
}

func TestSecondOpenFailsWhileHeld(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the open timeout")
	}
	dir := t.TempDir()
	l, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// The lock is per open file description, so a second open in the same
	// process contends like a second process would.
	if l2, err := Open(dir); err == nil {
		l2.Close()
		t.Fatal("a second Open of a held data dir succeeded")
	}
}

// crashChildEnv names the data dir in which the re-executed test binary
// appends until it is killed; crashModeEnv its flush policy.
const (
	crashChildEnv = "AETHER_STORAGE_CRASH_CHILD"
	crashModeEnv  = "AETHER_STORAGE_CRASH_MODE"
)

// crashModes are the flush policies the kill lands in: the default;
// never flushing (the kill comes between WAL and bbolt for every batch);
// flushing and rotating all the time (the kill lands inside flushes, between
// a flush's commit and its segment removal, in rotations).
var crashModes = map[string]options{
	"default": defaultOptions,
	"walonly": walOnly,
	"churn":   {flushEvery: time.Millisecond, flushRecords: 50, flushBytes: 1 << 20, segmentBytes: 4096},
}

// TestCrashLosesNothingAcknowledged kills a process with SIGKILL while it
// appends as fast as it can, then checks that every batch whose Append
// returned nil is there, and that what is there is a clean prefix of what
// was written: no torn record, no gap, no half batch.
func TestCrashLosesNothingAcknowledged(t *testing.T) {
	if dir := os.Getenv(crashChildEnv); dir != "" {
		crashChild(dir, crashModes[os.Getenv(crashModeEnv)])
		return
	}
	for _, mode := range []string{"default", "walonly", "churn"} {
		t.Run(mode, func(t *testing.T) { testCrash(t, mode) })
	}
}

func testCrash(t *testing.T, mode string) {
	for round := 0; round < 3; round++ {
		dir := t.TempDir()
		cmd := exec.Command(os.Args[0], "-test.run=^TestCrashLosesNothingAcknowledged$")
		cmd.Env = append(os.Environ(), crashChildEnv+"="+dir, crashModeEnv+"="+mode)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// The child prints "ack N" after each Append of records up to N
		// returned. Kill it at a varying point, mid-stream.
		killAfter := 50 + round*70
		var acked uint64
		sc := bufio.NewScanner(out)
		lines := 0
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) != 2 || f[0] != "ack" {
				continue
			}
			n, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				t.Fatalf("child said %q", sc.Text())
			}
			acked = n
			if lines++; lines == killAfter {
				if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				break
			}
		}
		_ = cmd.Wait() // killed: its error is the signal
		if lines < killAfter {
			t.Fatalf("child stopped after %d acks, before it was killed (scan error %v)", lines, sc.Err())
		}

		l, err := Open(dir)
		if err != nil {
			t.Fatalf("reopen after kill: %v", err)
		}
		got, _ := loadAll(t, l)
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if uint64(len(got)) < acked {
			t.Fatalf("round %d: %d records after the crash, but %d were acknowledged", round, len(got), acked)
		}
		for i, r := range got {
			if !equalRecord(r, testRecord(uint64(i+1))) {
				t.Fatalf("round %d: record at position %d is %+v, want record %d intact", round, i, r.Index, i+1)
			}
		}
		// Batches are whole: the child appends batches of batchSize(N).
		if !isBatchBoundary(uint64(len(got))) {
			t.Fatalf("round %d: %d records is not a batch boundary: half a batch survived", round, len(got))
		}
		t.Logf("round %d: acknowledged %d, found %d", round, acked, len(got))
	}
}

// batchSize varies so batches of different sizes are in flight when the
// kill comes.
func batchSize(first uint64) uint64 { return 1 + first%37 }

func isBatchBoundary(n uint64) bool {
	for next := uint64(1); ; {
		if next-1 == n {
			return true
		}
		if next-1 > n {
			return false
		}
		next += batchSize(next)
	}
}

func crashChild(dir string, opts options) {
	l, err := open(dir, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(1)
	}
	w := bufio.NewWriter(os.Stdout)
	for next := uint64(1); ; {
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
		// Acknowledged only after Append returned, as the server does.
		fmt.Fprintf(w, "ack %d\n", next-1)
		if err := w.Flush(); err != nil {
			os.Exit(1) // the parent stopped reading: it is about to kill us
		}
	}
}

// BenchmarkAppend measures group commit on this disk: one fdatasync'd WAL
// frame per batch of 1, 16 and 256 records of about 200 bytes, the size of
// a small encoded Put, with the flusher's bbolt commits running beside it
// as they do in the server ("fsyncs/s" counts acknowledged batches).
func BenchmarkAppend(b *testing.B) {
	for _, size := range []int{1, 16, 256} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			l, err := Open(b.TempDir())
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			payload := bytes.Repeat([]byte("v"), 200)
			next := uint64(1)
			batch := make([]Record, size)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for j := range batch {
					batch[j] = Record{Index: next, Rev: int64(next), Change: payload}
					next++
				}
				if err := l.Append(batch); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			sec := b.Elapsed().Seconds()
			b.ReportMetric(float64(b.N*size)/sec, "records/s")
			b.ReportMetric(float64(b.N)/sec, "fsyncs/s")
		})
	}
}

// TestTornCommitFallsBackToThePreviousOne simulates power loss in the
// middle of a bbolt commit (a flush): the newest meta page (bbolt writes it
// last, after the data pages are fsync'd) is half written, so its checksum
// fails. With the write-ahead log gone (here: a clean Close removed it),
// bbolt must open with exactly the transactions before it, every record
// intact. With the log still there, as it is when a flush is torn, recovery
// takes the torn commit's records from the log: nothing is lost.
func TestTornCommitFallsBackToThePreviousOne(t *testing.T) {
	for _, walKept := range []bool{false, true} {
		t.Run(fmt.Sprintf("walKept=%v", walKept), func(t *testing.T) { testTornCommit(t, walKept) })
	}
}

func testTornCommit(t *testing.T, walKept bool) {
	dir := t.TempDir()
	l, err := open(dir, options{flushRecords: 1 << 30, flushBytes: 1 << 30, segmentBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	const batches, per = 10, 5
	for b := uint64(0); b < batches; b++ {
		batch := make([]Record, 0, per)
		for i := b*per + 1; i <= (b+1)*per; i++ {
			batch = append(batch, testRecord(i))
		}
		if err := l.Append(batch); err != nil {
			t.Fatal(err)
		}
		// One bbolt commit per batch, so the torn one is the last batch.
		if err := l.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	if walKept {
		l.crash()
	} else if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	// Meta pages are pages 0 and 1; in each, after the 16-byte page header,
	// the meta's txid is at byte 48 and its checksum at byte 56.
	path := filepath.Join(dir, FileName)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	pageSize := int64(os.Getpagesize())
	txid := func(page int64) uint64 {
		var b [8]byte
		if _, err := f.ReadAt(b[:], page*pageSize+16+48); err != nil {
			t.Fatal(err)
		}
		return binary.LittleEndian.Uint64(b[:])
	}
	newest := int64(0)
	if txid(1) > txid(0) {
		newest = 1
	}
	if t0, t1 := txid(0), txid(1); t0 == t1 || max(t0, t1)-min(t0, t1) != 1 {
		t.Fatalf("meta txids %d and %d: not two consecutive commits (layout misread?)", t0, t1)
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
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	l, err = Open(dir)
	if err != nil {
		t.Fatalf("open after a torn commit: %v", err)
	}
	defer l.Close()
	got, _ := loadAll(t, l)
	want := (batches - 1) * per
	if walKept {
		want = batches * per
	}
	if len(got) != want {
		t.Fatalf("after a torn last commit (WAL kept: %v): %d records, want %d", walKept, len(got), want)
	}
	for i, r := range got {
		if !equalRecord(r, testRecord(uint64(i+1))) {
			t.Fatalf("record %d differs after recovery", i+1)
		}
	}
	// And the log goes on from there.
	if err := l.Append([]Record{testRecord(uint64(len(got) + 1))}); err != nil {
		t.Fatalf("append after recovery: %v", err)
	}
}

// The server appends from its committer while Status reads sizes and
// Defragment may run: all of it concurrently (run with -race).
func TestConcurrentUse(t *testing.T) {
	l, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	const n = 2000
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	wg.Add(1)
	go func() { // the committer
		defer wg.Done()
		for i := uint64(1); i <= n; i += 10 {
			batch := make([]Record, 0, 10)
			for j := i; j < i+10; j++ {
				batch = append(batch, testRecord(j))
			}
			if err := l.Append(batch); err != nil {
				errs <- err
				return
			}
		}
	}()
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func() { // Status and the extension API
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				// Each is its own snapshot (an append or a defragment may
				// come between), so only their sanity is checked.
				if l.Size() <= 0 || l.SizeInUse() <= 0 {
					errs <- fmt.Errorf("size %d, in use %d", l.Size(), l.SizeInUse())
					return
				}
				if _, _, err := l.IndexOfRevision(5); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Add(1)
	go func() { // Maintenance.Defragment
		defer wg.Done()
		for i := 0; i < 3; i++ {
			if err := l.Defragment(); err != nil {
				errs <- err
				return
			}
		}
	}()
	// Wait for the committer and the defragments, then stop the readers.
	done := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			count := 0
			if _, err := l.Load(func(Record) error { count++; return nil }); err != nil {
				errs <- err
				return
			}
			if count == n {
				close(done)
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	select {
	case <-done:
	case err := <-errs:
		close(stop)
		wg.Wait()
		t.Fatal(err)
	case <-time.After(60 * time.Second):
		close(stop)
		wg.Wait()
		t.Fatal("appends did not finish")
	}
	close(stop)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	got, _ := loadAll(t, l)
	for i, r := range got {
		if !equalRecord(r, testRecord(uint64(i+1))) {
			t.Fatalf("record %d differs", i+1)
		}
	}
}
