package bench

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// dirBytes counts what the files take on disk: a sparse file (bbolt grows
// its file that way) counts the pages written, not its length.
func TestDirBytes(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "full"), make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, "sub", "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(64 << 20); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(make([]byte, 4096), 32<<20); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	n, err := dirBytes(dir)
	if err != nil {
		t.Fatal(err)
	}
	if n < 1<<20+4096 || n > 2<<20 {
		t.Fatalf("dirBytes = %d, want about 1 MiB + 4 KiB (the sparse file's 64 MiB length not counted)", n)
	}
}

func TestTableRows(t *testing.T) {
	if got := tableRows(4, 11); !slices.Equal(got, []int{0, 1, 2, 3}) {
		t.Errorf("tableRows(4, 11) = %v", got)
	}
	got := tableRows(21, 11)
	if len(got) != 11 || got[0] != 0 || got[10] != 20 || got[5] != 10 {
		t.Errorf("tableRows(21, 11) = %v", got)
	}
}

func historySamples(disk0, diskStep, rss int64, n int) [][]EdgeHistorySample {
	var out [][]EdgeHistorySample
	for i := 0; i < n; i++ {
		var row []EdgeHistorySample
		for r := 0; r < 3; r++ {
			row = append(row, EdgeHistorySample{Second: float64(i * 60), DiskBytes: disk0 + int64(i)*diskStep + int64(r), DBBytes: disk0 / 2,
				RSSBytes: rss, AnonBytes: rss / 2, Writes: i * 100, Checkpoints: float64(i)})
		}
		out = append(out, row)
	}
	return out
}

// The section names both clusters' figures, the largest replica's, and
// the growth over the second half: the GC run's flat disk shows as +0.0,
// the other's as what it grew per minute.
func TestEdgeHistorySection(t *testing.T) {
	r := Report{Date: "d", Machine: "m", Command: "aether bench --scenario edge-history", EdgeHistory: &EdgeHistoryResult{
		Replicas: 3, Seconds: 600, Rate: 300, Keys: 1000, DeleteEvery: 10, ValueBytes: 256, RetentionSec: 30, CheckpointChanges: 10000,
		Runs: []EdgeHistoryRun{
			{HistoryGC: false, Samples: historySamples(1<<20, 1<<20, 50<<20, 11), Writes: 1000, Achieved: 300},
			{HistoryGC: true, Samples: historySamples(1<<20, 0, 40<<20, 11), Writes: 1000, Achieved: 300},
		},
	}}
	md := r.Markdown()
	for _, want := range []string{
		edgeHistoryBeginMark, edgeHistoryEndMark,
		"--auto-compaction-retention 30s --checkpoint-changes 10000",
		"| 600 s | 11.0 MiB (0.5 MiB) | 1.0 MiB (0.5 MiB) | 50.0 MiB (25.0 MiB) | 40.0 MiB (20.0 MiB) |",
		"disk +1.0 MiB without GC, +0.0 MiB with",
		"checkpoints per replica by the end: 10 without GC, 10 with",
		"`aether bench --scenario edge-history`",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("section lacks %q:\n%s", want, md)
		}
	}
	if rows := strings.Count(md, " s | "); rows != 11 {
		t.Errorf("%d table rows, want 11", rows)
	}
}
