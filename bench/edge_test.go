package bench

import (
	"strings"
	"testing"
)

// go-ycsb v1.0.3's output of a run against real etcd (the end of it: an
// interval report, then the final one), plus an error line as its
// DbWrapper names failed operations.
const ycsbSample = `READ   - Takes(s): 1.0, Count: 3000, OPS: 3000.0, Avg(us): 9000, Min(us): 400, Max(us): 20000, 50th(us): 1, 90th(us): 2, 95th(us): 3, 99th(us): 4, 99.9th(us): 5, 99.99th(us): 6
**********************************************
Run finished, takes 3.359626843s
READ   - Takes(s): 3.4, Count: 9951, OPS: 2969.4, Avg(us): 9863, Min(us): 412, Max(us): 258303, 50th(us): 7123, 90th(us): 16111, 95th(us): 21647, 99th(us): 53375, 99.9th(us): 255999, 99.99th(us): 257407
READ_ERROR - Takes(s): 3.4, Count: 7, OPS: 2.0, Avg(us): 9863, Min(us): 412, Max(us): 258303, 50th(us): 7123, 90th(us): 16111, 95th(us): 21647, 99th(us): 53375, 99.9th(us): 255999, 99.99th(us): 257407
TOTAL  - Takes(s): 3.4, Count: 20000, OPS: 5968.5, Avg(us): 10622, Min(us): 412, Max(us): 258303, 50th(us): 7947, 90th(us): 17007, 95th(us): 22847, 99th(us): 55583, 99.9th(us): 253183, 99.99th(us): 257023
UPDATE - Takes(s): 3.3, Count: 10049, OPS: 3000.5, Avg(us): 11374, Min(us): 776, Max(us): 254719, 50th(us): 8599, 90th(us): 17903, 95th(us): 24367, 99th(us): 56511, 99.9th(us): 250751, 99.99th(us): 254591
`

func TestParseYCSB(t *testing.T) {
	r, err := parseYCSB(ycsbSample)
	if err != nil {
		t.Fatal(err)
	}
	want := EdgeRun{OpsPerSec: 5968.5, ReadP50: 7.123, ReadP99: 53.375, UpdateP50: 8.599, UpdateP99: 56.511, TotalP99: 55.583, Errors: 7}
	r.ErrorLines = ""
	if r != want {
		t.Errorf("parsed %+v\nwant   %+v", r, want)
	}
	if _, err := parseYCSB("READ - Takes(s): 1.0, Count: 1, OPS: 1.0, 50th(us): 1, 99th(us): 1,\n"); err == nil {
		t.Error("output without a final report parsed")
	}
}

func TestYCSBKeyLength(t *testing.T) {
	if n := len(ycsbKey(99999)); n != 18 {
		t.Errorf("key %q is %d bytes, want 18", ycsbKey(99999), n)
	}
}

// TestEdgeSection: the goal line reads the unbounded rows, and says "not
// met" when aether edge is slower or its p99 worse.
func TestEdgeSection(t *testing.T) {
	for _, tc := range []struct {
		edgeOps, edgeP99 float64
		want             string
	}{{5000, 9, "met ("}, {4000, 9, "**not met**"}, {5000, 11, "**not met**"}} {
		r := Report{Date: "d", Machine: "m", Command: "c", Edge: &EdgeResult{Records: 10, KeyBytes: 18, ValueBytes: 33, Runs: []EdgeRun{
			{Server: "etcd", Target: 1000, Threads: 16, OpsPerSec: 1000, TotalP99: 1},
			{Server: "etcd", Target: 0, Threads: 64, OpsPerSec: 4500, TotalP99: 10},
			{Server: "aether edge", Target: 1000, Threads: 16, OpsPerSec: 1000, TotalP99: 100},
			{Server: "aether edge", Target: 0, Threads: 64, OpsPerSec: tc.edgeOps, TotalP99: tc.edgeP99},
		}}}
		md := r.Markdown()
		if !strings.Contains(md, edgeBeginMark) || !strings.Contains(md, "| aether edge | unbounded | 64 |") {
			t.Fatalf("section lacks its marks or rows:\n%s", md)
		}
		if !strings.Contains(md, "same run: "+tc.want) {
			t.Errorf("edge %.0f ops/s at p99 %.0f ms against etcd 4500 at 10: want %q in\n%s", tc.edgeOps, tc.edgeP99, tc.want, md)
		}
	}
}

// TestEdgeScaleSection: the goal compares every aether edge size with one
// replica's p99 of the same placement and says "not met" past 2x or on
// errors.
func TestEdgeScaleSection(t *testing.T) {
	for _, tc := range []struct {
		p99at5 float64
		errors int
		want   string
	}{{3.9, 0, "met ("}, {4.1, 0, "**not met**"}, {3, 1, "**not met**"}} {
		r := Report{Date: "d", Machine: "m", Command: "c", EdgeScale: &EdgeScaleResult{LatencyMs: 10, Rate: 500, Seconds: 10, Concurrency: 32, Runs: []EdgeScaleRun{
			{Server: "etcd", Size: 1, P99: 1, Placement: PlacementShared}, {Server: "aether edge", Size: 1, P99: 2, Placement: PlacementShared},
			{Server: "etcd", Size: 5, P99: 60, Placement: PlacementShared}, {Server: "aether edge", Size: 5, P99: tc.p99at5, Errors: tc.errors, Placement: PlacementShared},
			// Pinned: one replica 10 ms, 5 members 12 ms, met whatever
			// the shared runs say (the ratio is within a placement).
			{Server: "aether edge", Size: 1, P99: 10, Placement: PlacementPinned}, {Server: "aether edge", Size: 5, P99: 12, Placement: PlacementPinned},
		}}}
		md := r.Markdown()
		if !strings.Contains(md, edgeScaleBeginMark) || !strings.Contains(md, "| shared | aether edge | 5 |") || !strings.Contains(md, "| pinned | aether edge | 5 |") {
			t.Fatalf("section lacks its marks or rows:\n%s", md)
		}
		if !strings.Contains(md, "shared: aether edge's write p99 within 2× of one replica's at every size: "+tc.want) {
			t.Errorf("p99 %.1f ms at 5 members (one: 2 ms), %d errors: want %q in\n%s", tc.p99at5, tc.errors, tc.want, md)
		}
		if !strings.Contains(md, "pinned: aether edge's write p99 within 2× of one replica's at every size: met (worst 1.20×") {
			t.Errorf("pinned goal not judged on its own runs:\n%s", md)
		}
	}
}

// TestEdgeScaleGoalTakesTheMedian: each size runs once per round; the
// goal compares medians, so one slow baseline run passes nothing and one
// slow run at a size fails nothing, and a baseline whose median is far
// above its lowest run makes the verdict inconclusive.
func TestEdgeScaleGoalTakesTheMedian(t *testing.T) {
	runs := func(pl string, size int, errs int, p99s ...float64) []EdgeScaleRun {
		var out []EdgeScaleRun
		for i, p := range p99s {
			out = append(out, EdgeScaleRun{Server: "aether edge", Size: size, P99: p, Placement: pl, Round: i + 1, Errors: errs})
		}
		return out
	}
	var all []EdgeScaleRun
	for _, rs := range [][]EdgeScaleRun{
		// One slow baseline run (18 ms): the median is 2.2, and 7
		// members' median 8 is past 2x.
		runs(PlacementShared, 1, 0, 18, 2, 2.2), runs(PlacementShared, 7, 0, 8, 8, 3),
		// One slow run at 7 members (30 ms): the median 3.5 is within.
		runs(PlacementPinned, 1, 0, 2, 2.2, 2.1), runs(PlacementPinned, 7, 0, 3.5, 30, 3.4),
		// Two of three baseline runs slow: inconclusive, though "met".
		runs("noisy", 1, 0, 2, 9, 10), runs("noisy", 3, 0, 12, 11, 3),
		// Noisy baselines, but a run with failed writes: not met.
		runs("failing", 1, 0, 2, 9, 10), runs("failing", 3, 1, 2.5, 2.5, 2.5),
	} {
		all = append(all, rs...)
	}
	r := Report{Date: "d", Machine: "m", Command: "c", EdgeScale: &EdgeScaleResult{LatencyMs: 10, Rate: 500, Seconds: 10, Concurrency: 32, Rounds: 3, Runs: all}}
	md := r.Markdown()
	for _, want := range []string{
		"shared: aether edge's write p99 within 2× of one replica's at every size: **not met** (worst 3.64× of one replica's 2.20 ms, the median of its runs' 18.00, 2.00 and 2.20 ms).",
		"pinned: aether edge's write p99 within 2× of one replica's at every size: met (worst 1.67× of one replica's 2.10 ms, the median of its runs' 2.00, 2.20 and 2.10 ms).",
		"noisy: aether edge's write p99 within 2× of one replica's at every size: **inconclusive** (worst 1.22× of one replica's 9.00 ms, the median of its runs' 2.00, 9.00 and 10.00 ms, 4.5× their lowest: most of them were slowed, and the machine was too noisy for a verdict).",
		"failing: aether edge's write p99 within 2× of one replica's at every size: **not met** (worst 0.28× of one replica's 9.00 ms, the median of its runs' 2.00, 9.00 and 10.00 ms; writes failed).",
		"| pinned | aether edge | 7 | 0/s | 0.00 ms | 3.50 ms | 3.50, 30.00 and 3.40 ms | 0.00 ms | 0 |",
		"| failing | aether edge | 3 | 0/s | 0.00 ms | 2.50 ms | 2.50, 2.50 and 2.50 ms | 0.00 ms | 3 |",
		"ran 3 times, round after round",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("want %q in\n%s", want, md)
		}
	}
}
