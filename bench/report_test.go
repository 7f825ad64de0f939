package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aethermesh/aether/registry"
)

func TestSummarize(t *testing.T) {
	var ds []time.Duration
	for i := 1; i <= 1000; i++ {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	l := summarize(ds)
	if l.N != 1000 || l.P50 != 500 || l.P99 != 990 || l.P999 != 999 || l.Max != 1000 {
		t.Fatalf("summarize = %+v", l)
	}
	if (summarize(nil) != Latencies{}) {
		t.Fatal("empty sample")
	}
}

func TestUpdateFileReplacesOnlyItsSection(t *testing.T) {
	path := filepath.Join(t.TempDir(), "benchmarks.md")
	head := "# Benchmarks\n\nHand-written notes stay.\n"
	if err := os.WriteFile(path, []byte(head), 0o644); err != nil {
		t.Fatal(err)
	}
	r := Report{Date: "first", Propagation: []PropagationResult{{Changes: 1}}, Writes: []WritesResult{{Concurrency: 3}}}
	if err := r.UpdateFile(path); err != nil {
		t.Fatal(err)
	}
	r.Date = "second"
	if err := r.UpdateFile(path); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	doc := string(b)
	if !strings.HasPrefix(doc, head) || strings.Contains(doc, "first") || strings.Count(doc, beginMark) != 1 || !strings.Contains(doc, "last run second") {
		t.Fatalf("document after two updates:\n%s", doc)
	}
}

func TestBenchIPsAreDistinctAndValid(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 70000; i++ {
		ip := benchIP(i)
		if c, err := registry.CanonicalIP(ip); err != nil || c != ip || seen[ip] {
			t.Fatalf("benchIP(%d) = %s repeats or is invalid", i, ip)
		}
		seen[ip] = true
	}
}
