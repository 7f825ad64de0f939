package disruption_test

import (
	"strings"
	"testing"
	"time"

	"github.com/aethermesh/aether/disruption"
	"github.com/aethermesh/aether/internal/testutil/dynalite"
	"github.com/aethermesh/aether/registrar"
)

// The battery on DynamoDB (dynalite), which has no change feed: both
// registrars poll the table. Poll-only, B learns A's writes at its next
// poll, up to --sync-interval (3s, as the etcd poll-only test) later,
// against a drain period of 1s, so B's clients hand out drained pods: the
// battery can fail on DynamoDB. With peer-watch, the same rolls reach B
// over A's peer stream within milliseconds, and nothing is dropped. One
// test, both runs (about 25 s each on an idle machine), so that CI's
// short form shows the comparison the benchmark makes at full length.
func TestDisruptionBatteryDynamoDB(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "test") // the SDK's chain; dynalite wants requests signed, by anyone
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	d := dynalite.Start(t)
	cfg := func(peerWatch bool) disruption.Config {
		c := shortForm(t, registrar.SyncPoll)
		c.Backend, c.DynamoDBEndpoint, c.PeerWatch = disruption.BackendDynamoDB, d.Endpoint, peerWatch
		c.SyncInterval = 3 * time.Second
		return c
	}

	poll, err := disruption.Run(t.Context(), cfg(false))
	if err != nil {
		t.Fatalf("poll-only: %v", err)
	}
	if poll.DeadPicks == 0 {
		t.Errorf("DynamoDB poll-only (--sync-interval %v, drain period %v): no dead picks over %d resolutions; the battery cannot see stale clients",
			poll.Config.SyncInterval, poll.Config.DrainPeriod, poll.Resolutions)
	}
	if poll.DrainPropagation.Max < poll.Config.DrainPeriod {
		t.Errorf("poll-only: slowest drain reached every client in %v, within the drain period %v", poll.DrainPropagation.Max, poll.Config.DrainPeriod)
	}

	pw, err := disruption.Run(t.Context(), cfg(true))
	if err != nil {
		t.Fatalf("peer-watch: %v", err)
	}
	if pw.Drops != 0 {
		t.Errorf("DynamoDB with peer-watch: %d drops over %d resolutions, want 0: %s; e.g. %s",
			pw.Drops, pw.Resolutions, pw.Where(), strings.Join(pw.Samples, "; "))
	}
	for name, r := range map[string]disruption.Result{"poll-only": poll, "peer-watch": pw} {
		if r.WrongPicks != 0 {
			t.Errorf("%s: %d wrong picks (unknown endpoints or wrong ports): %s", name, r.WrongPicks, strings.Join(r.Samples, "; "))
		}
		if r.DrainPropagation.N != retirements {
			t.Errorf("%s: %d drains reached every client, want %d: the rolls did not run", name, r.DrainPropagation.N, retirements)
		}
	}
	if pw.Resolutions < 10_000 {
		t.Errorf("only %d resolutions with peer-watch: the battery did not exercise the resolvers", pw.Resolutions)
	}
}
