package bench

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestPartitionFigures: operations land in the second they returned and
// the phase they were issued in; a request issued while cut and answered
// after the heal is served but not "served while cut".
func TestPartitionFigures(t *testing.T) {
	s := time.Second
	ops := []partOp{
		{start: 100 * time.Millisecond, end: 110 * time.Millisecond},                   // before, second 0
		{start: 900 * time.Millisecond, end: 1100 * time.Millisecond},                  // before, returned in second 1 (while cut)
		{start: 1200 * time.Millisecond, end: 1210 * time.Millisecond},                 // cut, served while cut
		{start: 1500 * time.Millisecond, end: 2500 * time.Millisecond},                 // cut, served after heal
		{start: 1600 * time.Millisecond, end: 2600 * time.Millisecond, err: "timeout"}, // cut, failed
		{start: 2100 * time.Millisecond, end: 3500 * time.Millisecond},                 // healed, returned after the end
	}
	secs, phases, late := partitionFigures(ops, 3*s, s, 2*s)
	if late != 1 {
		t.Errorf("late = %d, want 1", late)
	}
	wantSecs := []struct{ offered, served, errors int }{{2, 1, 0}, {3, 2, 0}, {1, 1, 1}}
	for i, w := range wantSecs {
		if g := secs[i]; g.Offered != w.offered || g.Served != w.served || g.Errors != w.errors {
			t.Errorf("second %d: %+v, want offered %d served %d errors %d", i, g, w.offered, w.served, w.errors)
		}
	}
	// Second 1 served the 200 ms and the 10 ms request; the 1 s one
	// returned in second 2.
	if secs[1].P99 != 200 || secs[2].P99 != 1000 {
		t.Errorf("p99 of seconds 1 and 2 = %v, %v ms, want 200, 1000", secs[1].P99, secs[2].P99)
	}
	cut := phases[1]
	if cut.Issued != 3 || cut.Served != 2 || cut.ServedWhileCut != 1 || cut.Errors["timeout"] != 1 {
		t.Errorf("cut phase %+v, want 3 issued, 2 served, 1 while cut, 1 timeout", cut)
	}
	if before := phases[0]; before.Issued != 2 || before.ServedWhileCut != 1 || before.Max != 200 {
		t.Errorf("before phase %+v, want 2 issued, 1 served while cut, max 200 ms", before)
	}
}

func TestErrKind(t *testing.T) {
	if k := errKind(context.DeadlineExceeded); k != "client deadline exceeded" {
		t.Errorf("deadline: %q", k)
	}
	if k := errKind(status.Error(codes.Unavailable, "etcdserver: no leader")); k != "Unavailable: etcdserver: no leader" {
		t.Errorf("unavailable: %q", k)
	}
	if k := errKind(errors.New(strings.Repeat("x", 100))); len(k) > 80 {
		t.Errorf("long message not clipped: %q", k)
	}
}

func partitionReport(edgeCut PartitionPhase, etcdCut PartitionPhase) Report {
	secs := []PartitionSecond{{Second: 0, Offered: 10, Served: 10, P50: 1, P99: 2}, {Second: 1, Offered: 10, Served: 10, P50: 1, P99: 2}}
	return Report{Date: "d", Machine: "m", Command: "c", EdgePartition: &EdgePartitionResult{
		Members: 3, LatencyMs: 10, Rate: 10, Records: 100, Seconds: 2, CutAt: 1, HealAt: 2, TimeoutSec: 5,
		Runs: []PartitionRun{
			{Server: "etcd", Local: "m1", Seconds: secs, Phases: []PartitionPhase{{Name: "before", Issued: 10, Served: 10, P99: 50}, etcdCut, {Name: "healed"}}},
			{Server: "aether edge", Local: "m0", Seconds: secs, Phases: []PartitionPhase{{Name: "before", Issued: 10, Served: 10, P50: 1, P99: 4}, edgeCut, {Name: "healed"}}},
		},
	}}
}

// TestEdgePartitionSection: the section has its marks, a row per second
// with the cut marked, and goal lines that say "not met" when the edge
// refuses or slows down, or etcd's cut-off member serves its site.
func TestEdgePartitionSection(t *testing.T) {
	etcdNone := PartitionPhase{Name: "cut", Issued: 10, Served: 3, Errors: map[string]int{"client deadline exceeded": 7}}
	for _, tc := range []struct {
		name       string
		edge       PartitionPhase
		etcd       PartitionPhase
		edgeWant   string
		etcdWanted string
	}{
		{"both met", PartitionPhase{Name: "cut", Issued: 10, Served: 10, ServedWhileCut: 9, P99: 8}, etcdNone, "met (10 of 10", "met (0 of"},
		{"edge refused one", PartitionPhase{Name: "cut", Issued: 10, Served: 9, P99: 4, Errors: map[string]int{"x": 1}}, etcdNone, "**not met** (9 of 10", "met (0 of"},
		{"edge slower", PartitionPhase{Name: "cut", Issued: 10, Served: 10, P99: 8.1}, etcdNone, "**not met** (10 of 10", "met (0 of"},
		{"etcd served", PartitionPhase{Name: "cut", Issued: 10, Served: 10, P99: 4}, PartitionPhase{Name: "cut", Issued: 10, Served: 10, ServedWhileCut: 2}, "met (10 of 10", "**not met** (2 of"},
	} {
		md := partitionReport(tc.edge, tc.etcd).Markdown()
		if !strings.Contains(md, edgePartBeginMark) || !strings.Contains(md, edgePartEndMark) || !strings.Contains(md, "| 1 (cut) | 10 |") {
			t.Fatalf("%s: section lacks its marks or rows:\n%s", tc.name, md)
		}
		if !strings.Contains(md, "at unchanged latency (every request issued while cut served, p99 within 2× of before the cut): "+tc.edgeWant) {
			t.Errorf("%s: want edge verdict %q in\n%s", tc.name, tc.edgeWant, md)
		}
		if !strings.Contains(md, "serves none while cut: "+tc.etcdWanted) {
			t.Errorf("%s: want etcd verdict %q in\n%s", tc.name, tc.etcdWanted, md)
		}
	}
	r := partitionReport(PartitionPhase{Name: "cut"}, etcdNone)
	r.EdgePartition.Runs[0].Check = PartitionCheck{NewLeaderMs: -1, NearWrite: "client deadline exceeded", LocalSawFarMs: -1, FarSawNearMs: -1}
	r.EdgePartition.Runs[1].Check = PartitionCheck{FarWrites: 100, NearWrite: "ok", LocalSawFarMs: 163, FarSawNearMs: 170}
	md := r.Markdown()
	for _, want := range []string{
		"7 client deadline exceeded",
		"| etcd | 0.00 s | 0.00 s | none before the heal | 0 | client deadline exceeded | n/a (no far marker) | n/a (refused) |",
		"| aether edge | 0.00 s | 0.00 s | none needed | 100 | ok | 163 ms after the heal | 170 ms after the heal |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("want %q in\n%s", want, md)
		}
	}
}

// TestEdgePartitionSkippedLeavesSection: a quick run that skipped the
// scenario (not root) rewrites nothing of it.
func TestEdgePartitionSkippedLeavesSection(t *testing.T) {
	if strings.Contains((Report{}).Markdown(), edgePartBeginMark) {
		t.Error("a report without the scenario renders its section")
	}
}
