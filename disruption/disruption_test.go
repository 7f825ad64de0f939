package disruption_test

import (
	"strings"
	"testing"
	"time"

	"github.com/aethermesh/aether/disruption"
	"github.com/aethermesh/aether/registrar"
)

// logWriter sends the battery's progress lines to the test log.
type logWriter struct{ t testing.TB }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// shortForm is the battery CI runs: the defaults (two pods per service,
// three clients with two resolvers each, a drain period of 1s, 750ms quiet
// phases), with resolvers paced so that the registrars keep their share of
// a small machine's cores.
func shortForm(t *testing.T, mode string) disruption.Config {
	return disruption.Config{SyncMode: mode, ResolveRate: 5000, Progress: logWriter{t}}
}

// retirements is how many pods the short form drains: two per roll, one
// roll each of svc-1, svc-4 and svc-5, of svc-3, svc-4 and svc-2 around the
// registrar restarts, and two each of svc-2 and svc-3 in the churn.
const retirements = 2 * (3 + 3 + 2*2)

// With watch sync, B learns of A's writes within milliseconds, far inside
// the drain period: no resolution ever picks a dead endpoint or misses a
// live one.
func TestDisruptionBattery(t *testing.T) {
	res, err := disruption.Run(t.Context(), shortForm(t, registrar.SyncWatch))
	if err != nil {
		t.Fatal(err)
	}
	if res.Drops != 0 {
		t.Errorf("%d drops over %d resolutions with watch sync, want 0: %s; e.g. %s",
			res.Drops, res.Resolutions, res.Where(), strings.Join(res.Samples, "; "))
	}
	if res.Resolutions < 10_000 {
		t.Errorf("only %d resolutions: the battery did not exercise the resolvers", res.Resolutions)
	}
	if res.DrainPropagation.N != retirements {
		t.Errorf("%d drains reached every client, want %d: the rolls did not run", res.DrainPropagation.N, retirements)
	}
}

// With poll-only sync, B learns of A's writes only at its next re-list, up
// to --sync-interval (here 3s) later; the drain period is 1s, so most
// retirements leave B's clients holding a dead endpoint until the poll.
// The battery must see those drops: it is the proof that it can fail.
//
// Why this is reliable: each retirement's drain reaches B's clients in time
// only if B's next re-list falls within the 1s drain period, about one
// chance in three; and the retirements, about 1.1s apart, cannot all line
// up with a 3s tick.
func TestDisruptionBatteryPollOnlyDrops(t *testing.T) {
	cfg := shortForm(t, registrar.SyncPoll)
	cfg.SyncInterval = 3 * time.Second
	res, err := disruption.Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.DeadPicks == 0 {
		t.Errorf("poll-only sync (--sync-interval %v, drain period %v): no dead picks over %d resolutions; the battery cannot see stale clients",
			cfg.SyncInterval, res.Config.DrainPeriod, res.Resolutions)
	}
	if res.WrongPicks != 0 {
		t.Errorf("%d wrong picks (unknown endpoints or wrong ports): %s", res.WrongPicks, strings.Join(res.Samples, "; "))
	}
	if res.DrainPropagation.Max < res.Config.DrainPeriod {
		t.Errorf("slowest drain reached every client in %v, within the drain period %v, yet poll-only sync should be slower", res.DrainPropagation.Max, res.Config.DrainPeriod)
	}
	if res.DrainPropagation.N != retirements {
		t.Errorf("%d drains reached every client, want %d", res.DrainPropagation.N, retirements)
	}
}
