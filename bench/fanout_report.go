package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// ScenarioFanout: agent fan-out through two registrar processes, and (in a
// plain run, or alone with Options.Compare) the comparison with agents on
// etcd directly and through etcd's gRPC proxy.
const ScenarioFanout = "fanout"

const (
	fanoutBeginMark  = "<!-- bench:fanout:begin -->"
	fanoutEndMark    = "<!-- bench:fanout:end -->"
	compareBeginMark = "<!-- bench:fanout-compare:begin -->"
	compareEndMark   = "<!-- bench:fanout-compare:end -->"
)

// fanoutBatch is the registrars' --write-batch-interval in the scenario
// (but for one design-scale step at the default): with the default 100 ms
// at 100 changes/s, a change waits up to 100 ms for its flush, so the
// flush spacing alone puts the cross-replica p99 at the goal.
const fanoutBatch = 10 * time.Millisecond

// designLabel marks the design-scale step.
const designLabel = "design scale"

// checkCompare rejects Compare outside "--scenario fanout".
func (o Options) checkCompare() error {
	if o.Compare && (len(o.Scenarios) != 1 || o.Scenarios[0] != ScenarioFanout) {
		return errors.New("--compare applies only to --scenario fanout (alone); a run of every scenario includes the comparison")
	}
	return nil
}

func fanoutSteps(quick bool) []FanoutConfig {
	if quick {
		return []FanoutConfig{{Label: "quick", Services: 100, Endpoints: 2000, Streams: 200, Conns: 8, MaxDeps: 50,
			Phases: []FanoutLoad{{Rate: 100, Duration: 3 * time.Second}}, WriteBatchInterval: fanoutBatch, Drain: 5 * time.Second, Settle: 500 * time.Millisecond}}
	}
	base := FanoutConfig{Services: 3000, Endpoints: 100000, Conns: 200, MaxDeps: 200, WriteBatchInterval: fanoutBatch}
	var steps []FanoutConfig
	for _, n := range []int{1000, 2500, 5000} {
		s := base
		s.Streams, s.Phases = n, []FanoutLoad{{Rate: 100, Duration: 20 * time.Second}}
		steps = append(steps, s)
	}
	design := base
	design.Label, design.Streams = designLabel, 10000
	design.Phases = []FanoutLoad{{Rate: 100, Duration: 30 * time.Second}, {Rate: 400, Duration: 20 * time.Second}, {Rate: 1000, Duration: 20 * time.Second}}
	// The design scale at the default --write-batch-interval (100 ms): at
	// 100 changes/s a change waits up to the whole interval for its flush.
	def := design
	def.Label, def.WriteBatchInterval = designLabel+", default --write-batch-interval", 0
	def.Phases = []FanoutLoad{{Rate: 100, Duration: 30 * time.Second}}
	return append(steps, design, def)
}

func compareConfig(quick bool) CompareConfig {
	if quick {
		return CompareConfig{Services: 100, Endpoints: 2000, Agents: []int{100}, Conns: 8, MaxDeps: 50,
			Load: FanoutLoad{Rate: 100, Duration: 2 * time.Second}, WriteBatchInterval: fanoutBatch, Drain: 5 * time.Second, Settle: 500 * time.Millisecond}
	}
	return CompareConfig{Services: 3000, Endpoints: 100000, Agents: []int{1000, 4000, 10000, 20000, 40000}, Conns: 200, MaxDeps: 200,
		Load: FanoutLoad{Rate: 100, Duration: 10 * time.Second}, WriteBatchInterval: fanoutBatch}
}

// runFanout runs the fanout ladder and/or the comparison, as o asks.
func runFanout(ctx context.Context, o Options, r *Report, w io.Writer) error {
	if !o.Compare {
		fmt.Fprintf(w, "fanout: agent streams through two registrar processes on one etcd process...\n")
		res, err := Fanout(ctx, fanoutSteps(o.Quick), o.AetherBin, w)
		if err != nil {
			return fmt.Errorf("fanout: %w", err)
		}
		r.Fanout = &res
	}
	if o.Compare || len(o.Scenarios) == 0 {
		fmt.Fprintf(w, "fanout --compare: agents on etcd directly, through etcd's grpc-proxy, and through registrars...\n")
		res, err := Compare(ctx, compareConfig(o.Quick), o.AetherBin, w)
		if err != nil {
			return fmt.Errorf("fanout --compare: %w", err)
		}
		r.Compare = &res
	}
	return nil
}

// fanoutSections are the fanout sections this report has figures for.
func (r Report) fanoutSections() []section {
	var out []section
	if r.Fanout != nil {
		out = append(out, section{fanoutBeginMark, fanoutEndMark, r.fanoutMarkdown})
	}
	if r.Compare != nil {
		out = append(out, section{compareBeginMark, compareEndMark, r.compareMarkdown})
	}
	return out
}

func mb(v float64) string { return fmt.Sprintf("%.0f MB", v) }

func (r Report) fanoutMarkdown(b *strings.Builder) {
	res := r.Fanout
	fmt.Fprintf(b, "### Agent fan-out (last run %s)\n\n", r.Date)
	fmt.Fprintf(b, "- Machine: %s\n- Command: `%s`\n\n", r.Machine, r.Command)
	if len(res.Steps) == 0 {
		b.WriteString("No steps.\n")
		return
	}
	s0 := res.Steps[0]
	fmt.Fprintf(b, "**Setup.** Each step starts a fresh world of processes: one real etcd (v3.7.3, etcd's own main built by the harness from `tools/etcd`) and two `aether registrar` processes on it, A and B, with `%s` (every simulated agent connects from 127.0.0.1, which is one identity to the registrar; the default limit of 64 streams would refuse the rest) and the `--write-batch-interval` in the tables; every other flag at its default (`--watch-buffer 4096`, `--sync-interval 5s`). ", res.RegistrarFlags)
	fmt.Fprintf(b, "The %d endpoints (spread evenly over %d services) are written into etcd in v1 keys before the registrars start, which load them. ", s0.Endpoints, s0.Services)
	b.WriteString("The harness process is the load generator: the agents are WatchEndpoints streams, each with its own service list, round-robin over the gRPC connections, half of them to A and half to B, connecting at most 500 at a time; a dependency count is drawn from a bounded Pareto (P(deps ≥ k) = 4/k, capped at the step's maximum: a median of 8, one agent in ten above 40) and the services by popularity (Zipf-Mandelbrot, weight 1/(rank+10)); the same seed every run. ")
	fmt.Fprintf(b, "**Churn**: updates of existing endpoints (a shuffled cycle through all of them) by `RegisterEndpoint` on A, open loop at the rate, %d calls in flight at most (a change due when all are busy and a second's worth is queued is skipped, and counted); each update carries its send time in its metadata, and each receiving stream records receipt minus send time (one process, one clock). **Same replica** is the agents on A; **cross replica** the agents on B, which learns of the change only through etcd after A's write-behind flush. ", churnWriters)
	fmt.Fprintf(b, "The first phase starts %.1f s after every agent has its snapshot, so that what is measured is churn, not the setup's garbage being collected. ", s0.SettleSec)
	fmt.Fprintf(b, "A phase is **saturated** when the cross-replica p99 exceeds %.0f ms, a stream is cut off, a delivery is still missing %.0f s after the last change, or a write fails. CPU seconds are read from `/proc/<pid>/stat` (utime+stime), peak RSS is VmHWM; the machine's cores are shared by all the processes and the load generator (which decodes every message the agents receive).\n\n", ms(FanoutGoalP99), s0.DrainSec)
	b.WriteString("| step | streams / conns | deps mean / median / max | subscriptions | --write-batch-interval | preload | all snapshots | etcd watches (streams) | etcd CPU / peak RSS | A CPU / peak RSS | B CPU / peak RSS | load generator CPU / peak RSS |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for i, s := range res.Steps {
		short := ""
		if s.SnapshotsShort > 0 {
			short = fmt.Sprintf(" (%d short)", s.SnapshotsShort)
		}
		fmt.Fprintf(b, "| %s | %d / %d | %.1f / %d / %d | %d | %s | %.1f s | %.1f s, %d endpoints%s | %d (%d) | %.1f s / %s | %.1f s / %s | %.1f s / %s | %.1f s / %s |\n",
			stepName(i, s), s.Streams, s.Conns, s.MeanDeps, s.MedianDeps, min(s.MaxDeps, s.Services/2), s.Subscriptions, s.WriteBatchInterval,
			s.PreloadSec, s.SnapshotSec, s.SnapshotEndpoints, short, s.EtcdWatchers, s.EtcdWatchStreams,
			s.Etcd.CPUSec, mb(s.Etcd.PeakRSSMB), s.RegistrarA.CPUSec, mb(s.RegistrarA.PeakRSSMB), s.RegistrarB.CPUSec, mb(s.RegistrarB.PeakRSSMB), s.LoadGen.CPUSec, mb(s.LoadGen.PeakRSSMB))
	}
	b.WriteString("\nLatency from the RegisterEndpoint call to each subscribed stream's receipt, and CPU seconds used during the churn (the phase's length is the second column):\n\n")
	b.WriteString("| step | changes/s (achieved, s) | same replica p50 / p99 / p99.9 | cross replica p50 / p99 / p99.9 / max | deliveries/s | missing | streams cut off | CPU s: etcd / A / B / load generator | verdict |\n|---|---|---|---|---|---|---|---|---|\n")
	var sustained []string
	for i, s := range res.Steps {
		for _, p := range s.Phases {
			verdict := "sustained"
			if p.Saturated {
				verdict = "**saturated**: " + p.Why
			}
			fmt.Fprintf(b, "| %s | %d/s (%.0f/s, %.0f s) | %.2f / %.2f / %.2f ms | %.2f / %.2f / %.2f / %.2f ms | %.0f | %d of %d | %d | %.1f / %.1f / %.1f / %.1f | %s |\n",
				stepName(i, s), p.Rate, p.Achieved, p.Seconds, p.Same.P50, p.Same.P99, p.Same.P999, p.Cross.P50, p.Cross.P99, p.Cross.P999, p.Cross.Max,
				p.DeliveriesPS, p.Missing, p.Expected, p.StreamsEnded, p.EtcdCPU, p.RegACPU, p.RegBCPU, p.LoadGenCPU, verdict)
			if !p.Saturated {
				sustained = append(sustained, fmt.Sprintf("%d streams at %d/s", s.Streams, p.Rate))
			}
		}
	}
	var notes []string
	for _, s := range res.Steps {
		for _, p := range s.Phases {
			if p.EndedReason != "" {
				notes = append(notes, fmt.Sprintf("%d streams, %d/s: streams cut off with: %s", s.Streams, p.Rate, p.EndedReason))
			}
			if p.WriteError != "" {
				notes = append(notes, fmt.Sprintf("%d streams, %d/s: first write error: %s", s.Streams, p.Rate, p.WriteError))
			}
		}
	}
	if len(notes) > 0 {
		b.WriteString("\n")
		for _, n := range notes {
			fmt.Fprintf(b, "- %s\n", n)
		}
	}
	b.WriteString("\n" + fanoutVerdict(res) + "\n")
}

func stepName(i int, s FanoutStep) string {
	if s.Label != "" {
		return fmt.Sprintf("%d (%s)", i+1, s.Label)
	}
	return fmt.Sprint(i + 1)
}

// fanoutVerdict states the design goal's outcome and where load saturated.
func fanoutVerdict(res *FanoutResult) string {
	var goal, where []string
	for i, s := range res.Steps {
		var ok, sat []string
		for _, p := range s.Phases {
			if p.Saturated {
				sat = append(sat, fmt.Sprintf("%d/s", p.Rate))
			} else {
				ok = append(ok, fmt.Sprintf("%d/s", p.Rate))
			}
			if strings.HasPrefix(s.Label, designLabel) && p.Rate == 100 {
				met := "**met**"
				if p.Saturated {
					met = "**not met**"
				}
				goal = append(goal, fmt.Sprintf("%s in step %s (cross-replica p99 %.2f ms)", met, stepName(i, s), p.Cross.P99))
			}
		}
		w := fmt.Sprintf("step %d (%d streams)", i+1, s.Streams)
		if len(ok) > 0 {
			w += ": sustained " + strings.Join(ok, ", ")
		}
		if len(sat) > 0 {
			if len(ok) > 0 {
				w += ";"
			} else {
				w += ":"
			}
			w += " saturated at " + strings.Join(sat, ", ")
		}
		where = append(where, w)
	}
	var b strings.Builder
	if len(goal) > 0 {
		fmt.Fprintf(&b, "**Design goal** (cross-replica p99 ≤ %.0f ms at 100 changes/s with 10k streams, 3k services, 100k endpoints, deps up to 200): %s. ", ms(FanoutGoalP99), strings.Join(goal, "; "))
	}
	fmt.Fprintf(&b, "**Where it saturates**: %s.", strings.Join(where, "; "))
	return b.String()
}

func (r Report) compareMarkdown(b *strings.Builder) {
	c := r.Compare
	fmt.Fprintf(b, "### Agents on etcd directly, through etcd's gRPC proxy, and through the registrar (last run %s)\n\n", r.Date)
	fmt.Fprintf(b, "- Machine: %s\n- Command: `%s`\n\n", r.Machine, r.Command)
	fmt.Fprintf(b, "**Setup.** The fan-out workload (%d services, %d endpoints preloaded into etcd, dependency counts capped at %d, drawn as in the fan-out section) at a ladder of agent counts, %d changes/s for %.0f s; at each load every mode runs against a fresh etcd process, one after the other. The agents share %d connections (clients). ",
		c.Services, c.Endpoints, c.MaxDeps, c.Rate, c.Seconds, c.Conns)
	fmt.Fprintf(b, "**%s** (every agent watching etcd itself: a watch per dependency per agent, the load a discovery tier exists to absorb): each agent, for each dependency, Gets the service's key prefix and Watches it from the next revision (`clientv3`, one Watch per dependency, an agent's watches on one gRPC watch stream of its own as with an agent's own client, confirmed created before the churn); changes are etcd Puts of the v1 key, decoded with `registry.DecodeEndpoint`. ", ModeEtcdDirect)
	fmt.Fprintf(b, "**%s**: the same clients pointed at a real `etcd grpc-proxy start` process (etcd's watch coalescing: watchers of the same key range share one etcd watch); writes still go to etcd. ", ModeGRPCProxy)
	fmt.Fprintf(b, "**%s**: two registrar processes with `--write-batch-interval %s`, one WatchEndpoints stream per agent (half on each), changes through A's RegisterEndpoint; its latency row is the cross-replica agents (on B, through etcd), the same-replica ones are below it. ", ModeRegistrar, c.WriteBatchInterval)
	fmt.Fprintf(b, "In every mode the churn starts %.1f s after the agents' setup. ", c.SettleSec)
	fmt.Fprintf(b, "A mode **survives** a load when every delivery arrives within %.0f s of the last change, no watch or stream ends, and every write succeeds. Once etcd-direct fails a load, larger ones are not run; a mode that failed a load is not run at larger ones. The *tier* is what stands between agents and etcd: the proxy, or both registrars. *Delivered* counts every agent's receipts (for the registrar, both replicas').\n\n", c.DrainSec)
	b.WriteString("| agents (subscriptions) | mode | p50 | p99 | p99.9 | max | delivered | setup | etcd watches (streams) | etcd RSS after preload → peak | etcd CPU s: setup / churn / total | tier peak RSS / CPU s | load generator CPU s | survived |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, l := range c.Loads {
		for _, m := range l.Modes {
			tier := "—"
			if m.TierPeakRSSMB > 0 {
				tier = fmt.Sprintf("%s / %.1f", mb(m.TierPeakRSSMB), m.TierCPU)
			}
			surv := "yes"
			if !m.Survived {
				surv = "**no**: " + m.Why
			}
			lat := func(l Latencies) string {
				if l.N == 0 {
					return "— | — | — | —"
				}
				return fmt.Sprintf("%.2f ms | %.2f ms | %.2f ms | %.2f ms", l.P50, l.P99, l.P999, l.Max)
			}
			fmt.Fprintf(b, "| %d (%d) | %s | %s | %d of %d | %.1f s | %d (%d) | %s → %s | %.1f / %.1f / %.1f | %s | %.1f | %s |\n",
				l.Agents, l.Subscriptions, m.Mode, lat(m.Latency), m.Delivered, m.Expected, m.SetupSec, m.EtcdWatchers, m.EtcdWatchStreams,
				mb(m.EtcdBaseRSSMB), mb(m.EtcdPeakRSSMB), m.EtcdSetupCPU, m.EtcdChurnCPU, m.EtcdCPU, tier, m.LoadGenCPU, surv)
			if m.SameReplica != nil && m.SameReplica.N > 0 {
				fmt.Fprintf(b, "| | ↳ same replica | %s | | | | | | | | | |\n", lat(*m.SameReplica))
			}
		}
	}
	b.WriteString("\n")
	if c.At < 0 {
		b.WriteString("**Ratios**: etcd-direct survived no load of the ladder, so there is no load to compare at.\n")
		return
	}
	at := c.Loads[c.At]
	fmt.Fprintf(b, "**Ratios**, the other mode's figure over the registrar's (above 1: the registrar is better; its p99 is the cross-replica p99), against etcd-direct at the largest load it survived (%d agents, %d subscriptions; the ladder's largest is %d agents), against grpc-proxy at the largest load up to that one which the proxy survived:\n\n", at.Agents, at.Subscriptions, c.Loads[len(c.Loads)-1].Agents)
	b.WriteString("| registrar mode | vs | at (agents) | etcd peak RSS | etcd RSS above the preloaded data | etcd CPU | p99 | etcd + tier peak RSS |\n|---|---|---|---|---|---|---|---|\n")
	for _, x := range c.Ratios {
		if !x.Measured {
			fmt.Fprintf(b, "| %s | %s | — (did not survive) | — | — | — | — | — |\n", x.Registrar, x.Versus)
			continue
		}
		fmt.Fprintf(b, "| %s | %s | %d | %.1f× | %.1f× | %.1f× | %.1f× | %.1f× |\n", x.Registrar, x.Versus, x.Agents, x.EtcdPeakRSS, x.EtcdGrowth, x.EtcdCPU, x.P99, x.TotalRSS)
	}
	b.WriteString("\n" + compareVerdict(c) + "\n")
}

// compareVerdict states the goals' outcomes for each registrar mode: at
// least 10x better than etcd-direct on etcd memory and p99, and better
// than the proxy.
func compareVerdict(c *CompareResult) string {
	var parts []string
	for _, x := range c.Ratios {
		if !x.Measured {
			continue
		}
		switch x.Versus {
		case ModeEtcdDirect:
			met := "**met**"
			if x.EtcdPeakRSS < 10 || x.P99 < 10 {
				met = "**not met**"
			}
			parts = append(parts, fmt.Sprintf("%s ≥ 10× better than etcd-direct on etcd peak memory and p99: %s (%.1f× and %.1f×, at %d agents).", x.Registrar, met, x.EtcdPeakRSS, x.P99, x.Agents))
		case ModeGRPCProxy:
			met := "**met**"
			if x.EtcdPeakRSS <= 1 || x.P99 <= 1 {
				met = "**not met**"
			}
			parts = append(parts, fmt.Sprintf("%s better than grpc-proxy on etcd peak memory and p99: %s (%.1f× and %.1f×, at %d agents).", x.Registrar, met, x.EtcdPeakRSS, x.P99, x.Agents))
		}
	}
	if len(parts) == 0 {
		return "**Goals**: not evaluated (a mode did not survive the load)."
	}
	return "**Goals**: " + strings.Join(parts, " ")
}
