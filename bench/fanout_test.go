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

func TestHistogramBucketsAndQuantiles(t *testing.T) {
	for _, us := range []int64{0, 1, 127, 128, 129, 255, 256, 1000, 99_999, 1 << 30, 1<<41 - 1} {
		i := histIndex(us)
		if i < 0 || i >= histBuckets {
			t.Fatalf("histIndex(%d) = %d out of range", us, i)
		}
		v := histValue(i)
		if d := v - us; d < -us/64-1 || d > us/64+1 {
			t.Errorf("value %d lands in bucket %d represented by %d: off by more than 1/64", us, i, v)
		}
		if i > 0 && histIndex(us) < histIndex(max(us-1, 0)) {
			t.Errorf("buckets not monotonic at %d", us)
		}
	}
	var h histogram
	for i := 1; i <= 1000; i++ {
		h.record(time.Duration(i) * time.Millisecond)
	}
	l := h.latencies()
	near := func(got, want float64) bool { return got >= want*0.98 && got <= want*1.02 }
	if l.N != 1000 || !near(l.P50, 500) || !near(l.P99, 990) || !near(l.P999, 999) || l.Max != 1000 {
		t.Fatalf("latencies %+v", l)
	}
}

func TestFanoutWorkloadShape(t *testing.T) {
	wl := newFanWorkload(3000, 100000, 10000, 200)
	subs, mean, median, maxN := wl.depStats()
	if maxN != 200 || median < 5 || median > 12 || mean < 15 || mean > 25 {
		t.Fatalf("deps: %d subscriptions, mean %.1f, median %d, max %d", subs, mean, median, maxN)
	}
	for a, deps := range wl.agents[:100] {
		seen := map[int32]bool{}
		for _, s := range deps {
			if seen[s] {
				t.Fatalf("agent %d depends on service %d twice", a, s)
			}
			seen[s] = true
		}
	}
	if wl.perSvc[0] != 34 || wl.perSvc[2999] != 33 {
		t.Fatalf("endpoints per service %d..%d", wl.perSvc[0], wl.perSvc[2999])
	}
	again := newFanWorkload(3000, 100000, 10000, 200)
	if len(again.agents[77]) != len(wl.agents[77]) || again.churn[5] != wl.churn[5] {
		t.Fatal("the workload is not reproducible")
	}
}

// TestFanoutAndCompareQuickRun runs a tiny fanout step and a tiny
// comparison with real processes: an etcd and an etcd gRPC proxy built
// from tools/etcd, registrars built from ./cmd/aether. (The run takes
// about 20 s; the timeout leaves room for building both on a cold cache.)
func TestFanoutAndCompareQuickRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	t.Cleanup(removeBuilds)
	fr, err := Fanout(ctx, []FanoutConfig{{
		Services: 40, Endpoints: 400, Streams: 60, Conns: 4, MaxDeps: 20,
		Phases:             []FanoutLoad{{Rate: 50, Duration: 2 * time.Second}},
		WriteBatchInterval: 10 * time.Millisecond, Settle: 200 * time.Millisecond,
	}}, "", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	st := fr.Steps[0]
	ph := st.Phases[0]
	if ph.Changes < 90 || ph.Missing != 0 || ph.StreamsEnded != 0 || ph.WriteErrors != 0 || ph.Delivered != ph.Expected || ph.Expected == 0 {
		t.Fatalf("phase %+v", ph)
	}
	for _, l := range []Latencies{ph.Same, ph.Cross} {
		if l.N == 0 || !(l.P50 > 0 && l.P50 <= l.P99 && l.P99 <= l.Max) {
			t.Fatalf("latencies out of order or empty: %+v", l)
		}
	}
	if int64(ph.Same.N+ph.Cross.N) != ph.Delivered || st.SnapshotsShort != 0 || st.SnapshotEndpoints == 0 {
		t.Fatalf("step %+v", st)
	}
	// The registrars each hold one etcd watch, however many agents.
	if st.EtcdWatchers < 2 || st.EtcdWatchers > 6 {
		t.Fatalf("etcd watchers %d with registrars", st.EtcdWatchers)
	}
	for name, f := range map[string]ProcFigures{"etcd": st.Etcd, "A": st.RegistrarA, "B": st.RegistrarB} {
		if f.CPUSec <= 0 || f.PeakRSSMB <= 0 {
			t.Fatalf("%s figures %+v", name, f)
		}
	}

	cr, err := Compare(ctx, CompareConfig{
		Services: 40, Endpoints: 400, Agents: []int{40}, Conns: 4, MaxDeps: 20,
		Load: FanoutLoad{Rate: 50, Duration: 2 * time.Second}, WriteBatchInterval: 10 * time.Millisecond,
		Settle: 200 * time.Millisecond,
	}, "", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(cr.Loads) != 1 || len(cr.Loads[0].Modes) != 3 || cr.At != 0 || len(cr.Ratios) != 2 || !cr.Ratios[0].Measured || !cr.Ratios[1].Measured {
		t.Fatalf("compare %+v", cr)
	}
	load := cr.Loads[0]
	for _, m := range load.Modes {
		if !m.Survived || m.Missing != 0 || m.Delivered != m.Expected || m.Expected == 0 || m.Latency.P50 <= 0 || m.EtcdPeakRSSMB <= 0 || m.EtcdCPU <= 0 {
			t.Fatalf("mode %s: %+v", m.Mode, m)
		}
	}
	direct, proxy, reg := load.Modes[0], load.Modes[1], load.Modes[2]
	if direct.EtcdWatchers != load.Subscriptions || direct.EtcdWatchStreams != load.Agents {
		t.Errorf("etcd-direct: %d etcd watchers on %d streams, want one per subscription (%d) on one per agent (%d)", direct.EtcdWatchers, direct.EtcdWatchStreams, load.Subscriptions, load.Agents)
	}
	if proxy.EtcdWatchers > load.Subscriptions || proxy.TierPeakRSSMB <= 0 {
		t.Errorf("grpc-proxy: %d etcd watchers for %d subscriptions, proxy RSS %.0f MB", proxy.EtcdWatchers, load.Subscriptions, proxy.TierPeakRSSMB)
	}
	if reg.EtcdWatchers < 2 || reg.EtcdWatchers > 6 || reg.SameReplica == nil || reg.SameReplica.N == 0 || reg.TierCPU <= 0 {
		t.Errorf("registrar: %d etcd watchers, same replica %+v, tier CPU %.2f", reg.EtcdWatchers, reg.SameReplica, reg.TierCPU)
	}

	r := Report{Date: "test", Fanout: &fr, Compare: &cr}
	md := r.Markdown()
	for _, want := range []string{fanoutBeginMark, fanoutEndMark, compareBeginMark, compareEndMark, "| 50/s (", ModeEtcdDirect, ModeGRPCProxy} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	path := filepath.Join(t.TempDir(), "benchmarks.md")
	if err := r.UpdateFile(path); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); strings.Count(string(b), fanoutBeginMark) != 1 {
		t.Fatalf("document:\n%s", b)
	}
}

func TestCompareOnlyWithFanoutAlone(t *testing.T) {
	for _, scen := range [][]string{nil, {ScenarioRegistrar}, {ScenarioFanout, ScenarioRegistrar}} {
		if _, err := (Options{Compare: true, Scenarios: scen}).selected(); err == nil || !strings.Contains(err.Error(), "--compare") {
			t.Errorf("--compare with scenarios %v: %v", scen, err)
		}
	}
	sel, err := Options{Compare: true, Scenarios: []string{ScenarioFanout}}.selected()
	if err != nil || !sel[ScenarioFanout] || len(sel) != 1 {
		t.Fatalf("--compare --scenario fanout: %v, %v", sel, err)
	}
	if sel, _ := (Options{}).selected(); !sel[ScenarioFanout] {
		t.Fatal("a plain run leaves out fanout")
	}
}
