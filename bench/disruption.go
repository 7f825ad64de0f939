package bench

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/aethermesh/aether/disruption"
	"github.com/aethermesh/aether/registrar"
)

// ScenarioDisruption: the disruption battery (package disruption), full
// length, with watch sync and poll-only (the "Disruption battery" section),
// so the report shows the drops that poll-only sync's stale window costs.
const ScenarioDisruption = "disruption"

// DisruptionResult is the disruption scenario: the same battery run once
// with watch sync and once poll-only.
type DisruptionResult struct {
	Runs []disruption.Result `json:"runs"` // watch, then poll
}

const (
	disrBeginMark = "<!-- bench:disruption:begin -->"
	disrEndMark   = "<!-- bench:disruption:end -->"
)

// disruptionConfig is the full-length battery (about a minute and a half
// per sync mode, well over 100k resolutions) or, quick, a few seconds.
// Both modes use the registrar's default --sync-interval of 5s, so poll-only
// runs with the staleness a default deployment would have; the quick one
// shortens it to 1s to fit.
func disruptionConfig(quick bool) disruption.Config {
	if quick {
		return disruption.Config{
			SyncInterval:        time.Second,
			EndpointsPerService: 1,
			Clients:             2,
			ResolversPerClient:  2,
			ResolveRate:         1000,
			Quiet:               200 * time.Millisecond,
			ReadyDelay:          50 * time.Millisecond,
			DrainPeriod:         200 * time.Millisecond,
			Downtime:            100 * time.Millisecond,
			Storms:              1,
			ChurnRolls:          1,
		}
	}
	return disruption.Config{
		EndpointsPerService: 3,
		Clients:             8,
		ResolversPerClient:  2,
		ResolveRate:         1000,
		Quiet:               5 * time.Second,
		ReadyDelay:          500 * time.Millisecond,
		DrainPeriod:         2 * time.Second,
		Downtime:            3 * time.Second,
		Storms:              3,
		ChurnRolls:          2,
	}
}

// Disruption runs the battery cfg describes with each sync mode in turn.
func Disruption(ctx context.Context, cfg disruption.Config, w io.Writer) (DisruptionResult, error) {
	var out DisruptionResult
	for _, mode := range []string{registrar.SyncWatch, registrar.SyncPoll} {
		c := cfg
		c.SyncMode = mode
		c.Progress = indent{w}
		fmt.Fprintf(w, "disruption: %s sync...\n", mode)
		res, err := disruption.Run(ctx, c)
		if err != nil {
			return out, fmt.Errorf("%s sync: %w", mode, err)
		}
		out.Runs = append(out.Runs, res)
	}
	return out, nil
}

func runDisruption(ctx context.Context, o Options, r *Report, w io.Writer) error {
	res, err := Disruption(ctx, disruptionConfig(o.Quick), w)
	if err != nil {
		return fmt.Errorf("disruption: %w", err)
	}
	r.Disruption = &res
	return nil
}

// indent prefixes every line written through it with two spaces.
type indent struct{ w io.Writer }

func (i indent) Write(p []byte) (int, error) {
	s := strings.TrimRight(string(p), "\n")
	_, err := fmt.Fprintf(i.w, "  %s\n", strings.ReplaceAll(s, "\n", "\n  "))
	return len(p), err
}

func (r Report) disruptionMarkdown(b *strings.Builder) {
	d := r.Disruption
	fmt.Fprintf(b, "### Disruption battery (last run %s)\n\n", r.Date)
	fmt.Fprintf(b, "- Machine: %s\n- Command: `%s`\n\n", r.Machine, r.Command)
	if len(d.Runs) == 0 {
		return
	}
	c := d.Runs[0].Config
	fmt.Fprintf(b, "**Setup.** The disruption battery, in one process over real sockets (package `disruption`; its test runs a short form in CI). One embedded etcd; two registrar replicas, A and B. Writes go through A (through B while A is down). %d agent clients (package `client`) watch through B, failing over to A; each runs %d resolvers that resolve %d times a second: a random service, a random SERVING endpoint from the client's cache, checked against ground truth. %d services × %d pods; svc-5 is multi-port (h1 8080, h2c 3001).\n\n",
		c.Clients, c.ResolversPerClient, c.ResolveRate, len(disruption.Services), c.EndpointsPerService)
	fmt.Fprintf(b, "Phases: baseline (%v) → roll svc-1, svc-4, svc-5 → registrar rolling restart (each replica down %v, with a roll while it is down; then svc-2 through A) → reconnect storm (every client replaced, %d×) → churn (svc-2 and svc-3 rolled %d× each, at once) → settle (%v). A roll replaces a service's pods one at a time by the clock, as a Deployment does, never waiting for the clients: register a new pod; %v later drain an old one; %v after the drain, deregister it, and it dies.\n\n",
		c.Quiet, c.Downtime, c.Storms, c.ChurnRolls, c.Quiet, c.ReadyDelay, c.DrainPeriod)
	b.WriteString("A **drop** is a resolution that picked an endpoint whose pod is dead (dead pick), or found no SERVING endpoint while a registered live pod existed (none found). **In-window**: a dead pick counts in the roll window (phase, service) in which the picked pod was drained; the dead endpoints are the distinct dead pods picked there. **Drain reached every client**: from the drain being sent until no client shows the pod SERVING; a drain slower than the drain period is a window of dead picks.\n\n")
	b.WriteString("| sync | --sync-interval | resolutions | drops (in-window) | drain reached every client: p50 / max | battery |\n|---|---|---|---|---|---|\n")
	for _, run := range d.Runs {
		drops := fmt.Sprintf("**%d**", run.Drops)
		if run.Drops > 0 {
			drops += fmt.Sprintf(" (dead picks %d, none found %d", run.DeadPicks, run.NoneFound)
			if run.WrongPicks > 0 {
				drops += fmt.Sprintf(", wrong picks %d", run.WrongPicks)
			}
			drops += ") — " + run.Where()
		}
		fmt.Fprintf(b, "| etcd (%s) | %v | %d | %s | %s / %s | %.0f s |\n", run.Config.SyncMode, run.Config.SyncInterval,
			run.Resolutions, drops, roundDur(run.DrainPropagation.P50), roundDur(run.DrainPropagation.Max), run.Duration.Seconds())
	}
	fmt.Fprintf(b, "\nPer phase (durations of the %s run), by when the resolution happened: a stale cache may hand out a pod drained in an earlier phase.\n\n| phase |", d.Runs[0].Config.SyncMode)
	for _, run := range d.Runs {
		fmt.Fprintf(b, " %s: resolutions | %s: drops |", run.Config.SyncMode, run.Config.SyncMode)
	}
	b.WriteString("\n|---|" + strings.Repeat("---|---|", len(d.Runs)) + "\n")
	for i, ph := range d.Runs[0].Phases {
		fmt.Fprintf(b, "| %s (%s) |", ph.Name, roundDur(ph.Duration))
		for _, run := range d.Runs {
			if i < len(run.Phases) {
				fmt.Fprintf(b, " %d | %d |", run.Phases[i].Resolutions, run.Phases[i].Drops)
			}
		}
		b.WriteString("\n")
	}
	b.WriteString("\n**Reading.** ")
	for _, run := range d.Runs {
		how := "applies A's writes as etcd's watch reports them"
		if run.Config.SyncMode == registrar.SyncPoll {
			how = fmt.Sprintf("opens no watch and learns A's writes only from its full re-list every %v", run.Config.SyncInterval)
		}
		fmt.Fprintf(b, "With %s sync, B %s: the slowest drain reached every client %s after it was sent, against a drain period of %v, and the resolvers saw %d drops. ",
			run.Config.SyncMode, how, roundDur(run.DrainPropagation.Max), run.Config.DrainPeriod, run.Drops)
	}
	b.WriteString("Poll-only, a drain B has not listed when the drain period ends leaves B's clients handing out the dead pod until the next re-list, and a client that connects to B meanwhile starts from that same stale view. ")
	b.WriteString("The seed's table (DynamoDB poll 3 drops, etcd poll 1, etcd watch 0) counted requests that still failed after retries in an e2e run; here every resolution that picks a dead endpoint is a drop, at a steady rate, so a stale window costs every resolution of that service made during it.\n")
}

func roundDur(d time.Duration) string {
	switch {
	case d >= 10*time.Second:
		return d.Round(time.Second).String()
	case d >= time.Second:
		return d.Round(10 * time.Millisecond).String()
	default:
		return d.Round(time.Millisecond).String()
	}
}
