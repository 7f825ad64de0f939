package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aethermesh/aether/disruption"
	"github.com/aethermesh/aether/registrar"
)

// The disruption section renders both runs, with where the drops were, in
// its own marked section; the battery itself is tested in package
// disruption.
func TestDisruptionSection(t *testing.T) {
	run := func(mode string, drops int64) disruption.Result {
		r := disruption.Result{
			Config:      disruption.Config{SyncMode: mode, SyncInterval: 5 * time.Second, DrainPeriod: 2 * time.Second, Clients: 8, ResolversPerClient: 2},
			Resolutions: 123456,
			Phases:      []disruption.PhaseResult{{Name: disruption.PhaseBaseline, Resolutions: 1000}, {Name: disruption.PhaseRoll, Resolutions: 122456}},
		}
		if drops > 0 {
			r.Tally = disruption.Tally{Drops: drops, DeadPicks: drops}
			r.Phases[1].Tally = r.Tally
			r.Windows = []disruption.Window{{Phase: disruption.PhaseRoll, Service: "svc-5", Tally: r.Tally, DeadEndpoints: 1}}
		}
		return r
	}
	path := filepath.Join(t.TempDir(), "benchmarks.md")
	reg := Report{Date: "d0", Writes: []WritesResult{{Concurrency: 3}}}
	if err := reg.UpdateFile(path); err != nil {
		t.Fatal(err)
	}
	for _, date := range []string{"first", "second"} {
		r := Report{Date: date, Command: "aether bench --scenario disruption", Disruption: &DisruptionResult{
			Runs: []disruption.Result{run(registrar.SyncWatch, 0), run(registrar.SyncPoll, 42)},
		}}
		if err := r.UpdateFile(path); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := os.ReadFile(path)
	doc := string(b)
	for _, want := range []string{
		"last run d0", "last run second",
		"| etcd (watch) | 5s | 123456 | **0** |",
		"| etcd (poll) | 5s | 123456 | **42** (dead picks 42, none found 0) — roll svc-1/svc-4/svc-5: svc-5 (42, 1 dead endpoint) |",
		"| roll svc-1/svc-4/svc-5 (0s) | 122456 | 0 | 122456 | 42 |",
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("document lacks %q:\n%s", want, doc)
		}
	}
	if strings.Count(doc, disrBeginMark) != 1 || strings.Count(doc, beginMark) != 1 || strings.Contains(doc, "last run first") {
		t.Errorf("sections not replaced in place:\n%s", doc)
	}
}
