package bench

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestFirstSeenCoalescedPutsAndDeletes(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(msv int) time.Time { return t0.Add(time.Duration(msv) * time.Millisecond) }
	changes := []change{
		{Key: "k1", Val: "a", Rev: 1, Returned: at(1)},
		{Key: "k2", Val: "x", Rev: 2, Returned: at(2)},
		{Key: "k1", Val: "b", Rev: 3, Returned: at(3)},
		{Key: "k1", Del: true, Rev: 4, Returned: at(4)},
		{Key: "k2", Val: "y", Rev: 5, Returned: at(5)},
	}
	// The destination never shows k1=a or k1=b (coalesced into the delete)
	// and shows k2's values once each; "marker" matches nothing.
	dest := []observation{
		{At: at(10), Key: "marker", Val: "m"},
		{At: at(12), Key: "k2", Val: "x"},
		{At: at(20), Key: "k1", Del: true},
		{At: at(30), Key: "k2", Val: "y"},
		{At: at(40), Key: "k2", Val: "x"}, // a stale replay changes nothing already seen
	}
	got := firstSeen(changes, dest)
	want := []time.Time{at(20), at(12), at(20), at(20), at(30)}
	for i := range want {
		if !got[i].Equal(want[i]) {
			t.Errorf("change %d (%+v) first seen at %v, want %v", i, changes[i], got[i].Sub(t0), want[i].Sub(t0))
		}
	}

	// The origin's own watcher saw change 0 before its Put returned: the
	// earlier time counts as the commit.
	origin := []observation{{At: at(0), Key: "k1", Val: "a"}}
	ls := computeLags(changes, origin, dest)
	wantLags := []time.Duration{20, 10, 17, 16, 25}
	if len(ls.Lags) != len(wantLags) || ls.Missing != 0 {
		t.Fatalf("lags %v missing %d", ls.Lags, ls.Missing)
	}
	for i, l := range wantLags {
		if ls.Lags[i] != l*time.Millisecond {
			t.Errorf("lag %d = %v, want %v", i, ls.Lags[i], l*time.Millisecond)
		}
	}
	if !ls.LastCommit.Equal(at(5)) || !ls.LastSeen.Equal(at(30)) {
		t.Errorf("last commit %v, last seen %v", ls.LastCommit.Sub(t0), ls.LastSeen.Sub(t0))
	}

	// A change the destination never showed is missing, not lagging; k1,
	// created and deleted without one event, is coalesced away instead.
	ls = computeLags(changes, nil, dest[:2])
	if ls.Missing != 1 || ls.Coalesced != 3 || len(ls.Lags) != 1 {
		t.Errorf("with a short destination stream: %d lags, %d missing, %d coalesced", len(ls.Lags), ls.Missing, ls.Coalesced)
	}
}

// TestLagsCoalescedAwayAreNotMissing: the replicator keeps the last event
// per key of a catch-up batch, so a key registered, drained and deleted
// within one batch reaches the peer as the delete of a key it never had,
// which etcd applies without a watch event. Its changes have no time to
// date but are not lost; a shown key whose delete never came is.
func TestLagsCoalescedAwayAreNotMissing(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(msv int) time.Time { return t0.Add(time.Duration(msv) * time.Millisecond) }
	changes := []change{
		{Key: "gone", Val: "v1", Rev: 1, Returned: at(1)},
		{Key: "stale", Val: "s1", Rev: 2, Returned: at(2)},
		{Key: "gone", Val: "v2", Rev: 3, Returned: at(3)},
		{Key: "gone", Del: true, Rev: 4, Returned: at(4)},
		{Key: "stale", Del: true, Rev: 5, Returned: at(5)},
		{Key: "kept", Val: "k1", Rev: 6, Returned: at(6)},
		{Key: "late", Val: "l1", Rev: 7, Returned: at(7)},
	}
	dest := []observation{
		{At: at(10), Key: "stale", Val: "s1"},
		{At: at(11), Key: "kept", Val: "k1"},
	}
	ls := computeLags(changes, nil, dest)
	// gone: 3 coalesced; stale: its delete missing; late: never shown and
	// not deleted, missing.
	if ls.Coalesced != 3 || ls.Missing != 2 || len(ls.Lags) != 2 {
		t.Fatalf("%d lags, %d missing, %d coalesced; want 2, 2, 3", len(ls.Lags), ls.Missing, ls.Coalesced)
	}
	// Once the destination shows the delete, nothing is coalesced: the
	// delete dates all three.
	dest = append(dest, observation{At: at(20), Key: "gone", Del: true}, observation{At: at(21), Key: "stale", Del: true}, observation{At: at(22), Key: "late", Val: "l1"})
	ls = computeLags(changes, nil, dest)
	if ls.Coalesced != 0 || ls.Missing != 0 || len(ls.Lags) != len(changes) {
		t.Fatalf("%d lags, %d missing, %d coalesced; want %d, 0, 0", len(ls.Lags), ls.Missing, ls.Coalesced, len(changes))
	}
}

func TestTrackerConvergesOnTarget(t *testing.T) {
	tr := &tracker{state: map[string]string{}}
	t0 := time.Unix(2000, 0)
	tr.applyLocked(t0, "a", "1", false)
	tr.setTarget(map[string]string{"a": "2", "b": "1"})
	if at, n, _ := tr.converged(); !at.IsZero() || n != 2 {
		t.Fatalf("converged %v with %d differing, want not yet with 2", at, n)
	}
	tr.applyLocked(t0.Add(1), "b", "1", false)
	tr.applyLocked(t0.Add(2), "c", "9", false) // a key the target lacks
	tr.applyLocked(t0.Add(3), "a", "2", false)
	if at, n, _ := tr.converged(); !at.IsZero() || n != 1 {
		t.Fatalf("converged %v with %d differing, want not yet with 1", at, n)
	}
	tr.applyLocked(t0.Add(4), "c", "", true)
	if at, n, _ := tr.converged(); !at.Equal(t0.Add(4)) || n != 0 {
		t.Fatalf("converged %v with %d differing, want at +4 with 0", at, n)
	}
	tr.applyLocked(t0.Add(5), "a", "2", false) // the same value again: no change
	if at, _, _ := tr.converged(); !at.Equal(t0.Add(4)) {
		t.Fatalf("a no-op re-put moved convergence to %v", at)
	}
	// Already equal when the target is set: converged at the last change.
	tr.setTarget(map[string]string{"a": "2", "b": "1"})
	if at, n, _ := tr.converged(); !at.Equal(t0.Add(4)) || n != 0 {
		t.Fatalf("converged %v with %d differing", at, n)
	}
	tr.applyLocked(t0.Add(6), "a", "", true)
	tr.applyLocked(t0.Add(7), "b", "", true)
	if at, _, _ := tr.converged(); !at.IsZero() || !tr.emptied().Equal(t0.Add(7)) {
		t.Fatalf("after losing every key: converged %v, emptied %v", at, tr.emptied())
	}
}

// TestReplicationQuickRun runs the scenario at a small size against real
// embedded etcds and a real replicator: the peer must converge after the
// burst and after a partition, and every change must have a positive lag.
func TestReplicationQuickRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := Replication(ctx, ReplicationConfig{
		Changes: 300, Writers: 3, Partition: 2 * time.Second, PartitionRate: 100,
		LeaseTTLs: []time.Duration{30 * time.Second}, HealDeadline: 20 * time.Second, BurstDeadline: 20 * time.Second,
	}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Runs) != 1 || !strings.HasPrefix(res.MakeMirror, "not measured") {
		t.Fatalf("result %+v", res)
	}
	run := res.Runs[0]
	t.Logf("burst: %d shown, %d coalesced away, %d missing", run.Lag.N, run.LagCoalesced, run.LagMissing)
	// Keys created and deleted inside one replicator catch-up batch are
	// never shown (see TestLagsCoalescedAwayAreNotMissing); every other
	// change must be.
	if run.Lag.N+run.LagCoalesced != 300 || run.Lag.N < 150 || run.LagMissing != 0 || run.BurstPuts+run.BurstDeletes != 300 || run.BurstDeletes == 0 {
		t.Fatalf("burst: %+v", run)
	}
	if !(run.Lag.P50 > 0 && run.Lag.P50 <= run.Lag.P99 && run.Lag.P99 <= run.Lag.Max) {
		t.Fatalf("lag figures out of order or not positive: %+v", run.Lag)
	}
	if run.BurstConvergedMs < 0 || run.HealConvergedMs < 0 {
		t.Fatalf("did not converge: burst %v ms, after heal %v ms", run.BurstConvergedMs, run.HealConvergedMs)
	}
	if run.PartitionChanges < 150 || run.KeysAtHeal == 0 || run.PeerEmptiedAfterMs != 0 {
		t.Fatalf("partition: %+v", run)
	}
	if run.AvgValueB < 150 {
		t.Fatalf("values of %d bytes are not endpoint-sized", run.AvgValueB)
	}
}

func TestUpdateFileReplacesOnlyTheSectionsItRan(t *testing.T) {
	path := filepath.Join(t.TempDir(), "benchmarks.md")
	core := Report{Date: "core-run", Propagation: []PropagationResult{{Changes: 1}}}
	if err := core.UpdateFile(path); err != nil {
		t.Fatal(err)
	}
	repl := Report{Date: "repl-run", Replication: &ReplicationResult{
		MakeMirror: "measured",
		Runs: []ReplicationRun{
			{Tool: "aether replicator", LeaseTTL: "30s", BurstChanges: 10, Lag: Latencies{N: 10, P50: 1, P99: 2, Max: 3}, PartitionSec: 60, HealConvergedMs: 900, PeerEmptiedAfterMs: 35000},
			{Tool: "etcdctl make-mirror", BurstChanges: 10, PartitionSec: 60, HealConvergedMs: -1, StaleKeys: 7, Exits: []string{"12.0s into the partition: context deadline exceeded"}},
		},
	}}
	for range 2 {
		if err := repl.UpdateFile(path); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := os.ReadFile(path)
	doc := string(b)
	for _, want := range []string{"last run core-run", "last run repl-run", "| etcdctl make-mirror | none | 10 (0/s) |", "never (see below)", "7 keys the origin had deleted", "expired on the peer 35.0 s into the partition", "What make-mirror lacks"} {
		if !strings.Contains(doc, want) {
			t.Errorf("document lacks %q:\n%s", want, doc)
		}
	}
	if strings.Count(doc, replBeginMark) != 1 || strings.Count(doc, beginMark) != 1 {
		t.Errorf("sections duplicated:\n%s", doc)
	}
}

func TestScenarioSelection(t *testing.T) {
	if _, err := (Options{Scenarios: []string{"replication", "nope"}}).selected(); err == nil || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("unknown scenario: %v", err)
	}
	sel, err := Options{}.selected()
	if err != nil || !sel[ScenarioRegistrar] || !sel[ScenarioReplication] {
		t.Fatalf("default selection %v, %v", sel, err)
	}
}
