package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"
)

// Options choose what Run measures.
type Options struct {
	Quick bool // small sizes, finishes in well under a minute
	// Scenarios are the groups to run, from Scenarios; empty means all.
	Scenarios []string
	// Compare runs the fanout comparison (agents on etcd, through etcd's
	// grpc-proxy, through registrars) instead of the fanout steps; only
	// with Scenarios exactly {ScenarioFanout}. A run of all runs both.
	Compare bool
	// AetherBin is the aether CLI to run registrar processes from (the
	// CLI passes itself); empty: $AETHER_BIN, or built from ./cmd/aether.
	AetherBin string
}

// Scenario groups, each of which owns one section of docs/benchmarks.md.
const (
	// ScenarioRegistrar: propagation, write throughput, write-behind drain
	// and the agent cache read (the "Registrar core" section).
	ScenarioRegistrar = "registrar"
	// ScenarioReplication: multi-region replication lag and convergence,
	// with etcdctl make-mirror alongside in the full run.
	ScenarioReplication = "replication"
)

// Scenarios lists every scenario group in the order Run runs them.
var Scenarios = []string{ScenarioRegistrar, ScenarioReplication, ScenarioFanout, ScenarioDisruption, ScenarioXDS, ScenarioEdge, ScenarioEdgeScale, ScenarioEdgePartition, ScenarioEdgeConvergence, ScenarioEdgeHistory, ScenarioPeerWatch, ScenarioKubernetes}

// selected reports which groups o asks for, or an error naming an unknown one.
func (o Options) selected() (map[string]bool, error) {
	if err := o.checkCompare(); err != nil {
		return nil, err
	}
	sel := map[string]bool{}
	if len(o.Scenarios) == 0 {
		for _, s := range Scenarios {
			sel[s] = true
		}
		return sel, nil
	}
	for _, s := range o.Scenarios {
		if !slices.Contains(Scenarios, s) {
			return nil, fmt.Errorf("unknown scenario %q; choose from %s", s, strings.Join(Scenarios, ", "))
		}
		sel[s] = true
	}
	return sel, nil
}

// Report is everything one run measured, with where and how.
type Report struct {
	Date        string              `json:"date"`
	Machine     string              `json:"machine"`
	Command     string              `json:"command"`
	Propagation []PropagationResult `json:"propagation"`
	Writes      []WritesResult      `json:"writes"`
	CacheRead   CacheReadResult     `json:"client_cache_read"`
	Drain       DrainResult         `json:"write_behind_drain"`
	Replication *ReplicationResult  `json:"replication,omitempty"`
	Fanout      *FanoutResult       `json:"fanout,omitempty"`
	Compare     *CompareResult      `json:"fanout_compare,omitempty"`
	Disruption  *DisruptionResult   `json:"disruption,omitempty"`
	XDS         *XDSResult          `json:"xds,omitempty"`
	Edge        *EdgeResult         `json:"edge,omitempty"`
	EdgeScale   *EdgeScaleResult    `json:"edge_scale,omitempty"`
	PeerWatch   *PeerWatchResult    `json:"peer_watch,omitempty"`
	// EdgePartition is nil when the scenario was skipped (not root).
	EdgePartition   *EdgePartitionResult   `json:"edge_partition,omitempty"`
	EdgeConvergence *EdgeConvergenceResult `json:"edge_convergence,omitempty"`
	EdgeHistory     *EdgeHistoryResult     `json:"edge_history,omitempty"`
	Kubernetes      *KubernetesResult      `json:"kubernetes,omitempty"`
}

// Run runs the selected scenarios in turn, printing progress to w.
func Run(ctx context.Context, o Options, command string, w io.Writer) (Report, error) {
	defer removeBuilds() // etcd and etcdctl, if a scenario built them
	r := Report{Date: time.Now().UTC().Format("2006-01-02 15:04 MST"), Machine: machine(), Command: command}
	sel, err := o.selected()
	if err != nil {
		return r, err
	}
	if sel[ScenarioPeerWatch] {
		if err := peerWatchPreflight(); err != nil {
			return r, err
		}
	}
	if sel[ScenarioKubernetes] {
		if err := kubernetesPreflight(); err != nil {
			return r, err
		}
	}
	if sel[ScenarioRegistrar] {
		if err := runRegistrar(ctx, o, &r, w); err != nil {
			return r, err
		}
	}
	if sel[ScenarioReplication] {
		rc := ReplicationConfig{
			Changes:       10000,
			Partition:     time.Minute,
			PartitionRate: 200,
			// The default TTL, which a one-minute partition outlasts, and
			// one twice the partition, which it does not.
			LeaseTTLs:  []time.Duration{30 * time.Second, 2 * time.Minute},
			MakeMirror: true,
		}
		if o.Quick {
			rc.Changes, rc.Partition = 1000, 5*time.Second
			rc.LeaseTTLs = []time.Duration{30 * time.Second}
			rc.MakeMirror = false
		}
		fmt.Fprintf(w, "replication: region %s mirrored into %s's etcd through a fault proxy...\n", replOrigin, replPeer)
		res, err := Replication(ctx, rc, w)
		if err != nil {
			return r, fmt.Errorf("replication: %w", err)
		}
		r.Replication = &res
	}
	if sel[ScenarioFanout] {
		if err := runFanout(ctx, o, &r, w); err != nil {
			return r, err
		}
	}
	if sel[ScenarioDisruption] {
		if err := runDisruption(ctx, o, &r, w); err != nil {
			return r, err
		}
	}
	if sel[ScenarioXDS] {
		if err := runXDS(ctx, o, &r, w); err != nil {
			return r, err
		}
	}
	if sel[ScenarioEdge] {
		if err := runEdge(ctx, o, &r, w); err != nil {
			return r, err
		}
	}
	if sel[ScenarioEdgeScale] {
		if err := runEdgeScale(ctx, o, &r, w); err != nil {
			return r, err
		}
	}
	if sel[ScenarioEdgePartition] {
		if err := runEdgePartition(ctx, o, &r, w); err != nil {
			return r, err
		}
	}
	if sel[ScenarioEdgeConvergence] {
		if err := runEdgeConvergence(ctx, o, &r, w); err != nil {
			return r, err
		}
	}
	if sel[ScenarioEdgeHistory] {
		if err := runEdgeHistory(ctx, o, &r, w); err != nil {
			return r, err
		}
	}
	if sel[ScenarioPeerWatch] {
		if err := runPeerWatch(ctx, o, &r, w); err != nil {
			return r, err
		}
	}
	if sel[ScenarioKubernetes] {
		if err := runKubernetes(ctx, o, &r, w); err != nil {
			return r, err
		}
	}
	return r, nil
}

func runRegistrar(ctx context.Context, o Options, r *Report, w io.Writer) error {
	changes, regs := 5000, 20000
	if o.Quick {
		changes, regs = 500, 2000
	}
	for _, pc := range []PropagationConfig{
		{Changes: changes / 25, Interval: 200 * time.Millisecond},                                // ~5/s, a quiet cluster: no batching delay
		{Changes: changes, Interval: 2 * time.Millisecond},                                       // ~400/s, default batching
		{Changes: changes / 5, Interval: 10 * time.Millisecond},                                  // ~100/s, the design churn
		{Changes: changes, Interval: 2 * time.Millisecond, BatchInterval: 10 * time.Millisecond}, // ~400/s, short batching
	} {
		fmt.Fprintf(w, "propagation: %d registrations, one every %v, --write-batch-interval %v...\n", pc.Changes, pc.Interval, orDefault(pc.BatchInterval))
		res, err := Propagation(ctx, pc)
		if err != nil {
			return fmt.Errorf("propagation: %w", err)
		}
		fmt.Fprintf(w, "  same replica:  %s\n  cross replica: %s\n", res.SameReplica, res.CrossReplica)
		r.Propagation = append(r.Propagation, res)
	}
	for _, conc := range []int{1, 32} {
		wc := WritesConfig{Registrations: regs, Concurrency: conc}
		if conc == 1 {
			wc.Registrations = regs / 4
		}
		fmt.Fprintf(w, "writes: %d registrations, %d concurrent callers, write-behind vs direct etcd Put...\n", wc.Registrations, wc.Concurrency)
		res, err := Writes(ctx, wc)
		if err != nil {
			return fmt.Errorf("writes: %w", err)
		}
		fmt.Fprintf(w, "  write-behind: %.0f/s persisted (%.0f/s acknowledged, %d etcd revisions)\n  direct Put:   %.0f/s (%d etcd revisions)\n  speedup:      %.1fx\n",
			res.WriteBehindPS, res.AckPS, res.EtcdTxns, res.DirectPutPS, res.Registrations, res.Speedup)
		r.Writes = append(r.Writes, res)
	}
	var err error
	fmt.Fprintf(w, "write-behind drain: %d queued registrations persisted by one flush...\n", regs)
	if r.Drain, err = Drain(ctx, regs); err != nil {
		return fmt.Errorf("drain: %w", err)
	}
	fmt.Fprintf(w, "  %.0f/s in %d etcd revisions\n", r.Drain.DrainPS, r.Drain.Revisions)
	fmt.Fprintf(w, "client cache read: 20 services x 10 endpoints, Client.Endpoints on one...\n")
	if r.CacheRead, err = CacheRead(ctx, 20, 10); err != nil {
		return fmt.Errorf("cache read: %w", err)
	}
	fmt.Fprintf(w, "  %.1f ns/read (%d allocs), %.1f ns/read on all cores\n", r.CacheRead.NsPerRead, r.CacheRead.AllocsPerOp, r.CacheRead.ParallelNsOp)
	return nil
}

func orDefault(d time.Duration) string {
	if d == 0 {
		return "100ms (default)"
	}
	return d.String()
}

// JSON is the report as one line.
func (r Report) JSON() string {
	b, _ := json.Marshal(r)
	return string(b)
}

const (
	beginMark = "<!-- bench:registrar:begin -->"
	endMark   = "<!-- bench:registrar:end -->"

	replBeginMark = "<!-- bench:replication:begin -->"
	replEndMark   = "<!-- bench:replication:end -->"
)

// section is one marked section of docs/benchmarks.md.
type section struct {
	begin, end string
	render     func(*strings.Builder)
}

// sections are the sections this report has figures for: a run of some
// scenarios leaves the others' sections alone.
func (r Report) sections() []section {
	var out []section
	if len(r.Propagation) > 0 || len(r.Writes) > 0 || r.Drain.Registrations > 0 || r.CacheRead.Services > 0 {
		out = append(out, section{beginMark, endMark, r.registrarMarkdown})
	}
	if r.Replication != nil {
		out = append(out, section{replBeginMark, replEndMark, r.replicationMarkdown})
	}
	out = append(out, r.fanoutSections()...)
	if r.Disruption != nil {
		out = append(out, section{disrBeginMark, disrEndMark, r.disruptionMarkdown})
	}
	if r.XDS != nil {
		out = append(out, section{xdsBeginMark, xdsEndMark, r.xdsMarkdown})
	}
	if r.Edge != nil {
		out = append(out, section{edgeBeginMark, edgeEndMark, r.edgeMarkdown})
	}
	if r.EdgeScale != nil {
		out = append(out, section{edgeScaleBeginMark, edgeScaleEndMark, r.edgeScaleMarkdown})
	}
	if r.EdgePartition != nil {
		out = append(out, section{edgePartBeginMark, edgePartEndMark, r.edgePartitionMarkdown})
	}
	if r.EdgeConvergence != nil {
		out = append(out, section{edgeConvBeginMark, edgeConvEndMark, r.edgeConvergenceMarkdown})
	}
	if r.EdgeHistory != nil {
		out = append(out, section{edgeHistoryBeginMark, edgeHistoryEndMark, r.edgeHistoryMarkdown})
	}
	if r.PeerWatch != nil {
		out = append(out, section{peerBeginMark, peerEndMark, r.peerWatchMarkdown})
	}
	if r.Kubernetes != nil {
		out = append(out, section{kubeBeginMark, kubeEndMark, r.kubernetesMarkdown})
	}
	return out
}

// Markdown renders the sections of docs/benchmarks.md this report owns.
func (r Report) Markdown() string {
	var b strings.Builder
	for i, s := range r.sections() {
		if i > 0 {
			b.WriteString("\n")
		}
		b.WriteString(s.markdown(r))
	}
	return b.String()
}

func (s section) markdown(r Report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n", s.begin)
	s.render(&b)
	fmt.Fprintf(&b, "%s\n", s.end)
	return b.String()
}

func (r Report) registrarMarkdown(b *strings.Builder) {
	fmt.Fprintf(b, "### Registrar core (last run %s)\n\n", r.Date)
	fmt.Fprintf(b, "- Machine: %s\n- Command: `%s`\n\n", r.Machine, r.Command)
	b.WriteString("**Propagation.** Registrations through replica A, one at a time at a steady rate; latency from the RegisterEndpoint call to a watcher's receipt. Replica B shares A's etcd and learns of A's writes only through its etcd watch, after A's write-behind flush; so B's latency is bounded by `--write-batch-interval`.\n\n")
	b.WriteString("| rate | --write-batch-interval | path | p50 | p99 | p99.9 | max |\n|---|---|---|---|---|---|---|\n")
	for _, p := range r.Propagation {
		for _, row := range []struct {
			name string
			l    Latencies
		}{{"same replica", p.SameReplica}, {"cross replica", p.CrossReplica}} {
			fmt.Fprintf(b, "| %.0f/s | %s | %s | %.2f ms | %.2f ms | %.2f ms | %.2f ms |\n", p.RatePerSec, p.BatchInterval, row.name, row.l.P50, row.l.P99, row.l.P999, row.l.Max)
		}
	}
	b.WriteString("\n**Write throughput.** The same number of registrations through the registrar (write-behind) and as one etcd Put each, against the same embedded etcd in the same run. Write-behind is counted until etcd holds every registration.\n\n")
	b.WriteString("| callers | registrations | write-behind, persisted | write-behind, acknowledged | direct Put | speedup | etcd revisions (write-behind / direct) |\n|---|---|---|---|---|---|---|\n")
	for _, w := range r.Writes {
		fmt.Fprintf(b, "| %d | %d | %.0f/s | %.0f/s | %.0f/s | %.1f× | %d / %d |\n", w.Concurrency, w.Registrations, w.WriteBehindPS, w.AckPS, w.DirectPutPS, w.Speedup, w.EtcdTxns, w.Registrations)
	}
	fmt.Fprintf(b, "\n**etcd side of write-behind.** %d acknowledged registrations queued in a registrar (flusher held back), then persisted by its flush: **%.0f/s**, in %d etcd revisions. Compare the direct-Put rows above: this is the rate etcd absorbs registrations once they are coalesced, independent of how fast one registrar's gRPC front end can acknowledge them on this machine.\n",
		r.Drain.Registrations, r.Drain.DrainPS, r.Drain.Revisions)
	cr := r.CacheRead
	fmt.Fprintf(b, "\n**Agent cache read.** `client.Client.Endpoints` for one service on a client synced to a real registrar holding %d services × %d endpoints: **%.1f ns** per read (%d allocations); %.1f ns per read with every core reading. The Go benchmark `go test -run x -bench EndpointsCacheHit ./client/` measures the same.\n",
		cr.Services, cr.PerService, cr.NsPerRead, cr.AllocsPerOp, cr.ParallelNsOp)
}

// UpdateFile replaces the report's sections in path (creating the file if
// needed), leaving the rest of the document alone.
func (r Report) UpdateFile(path string) error {
	old, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	doc := string(old)
	for _, s := range r.sections() {
		sec := s.markdown(r)
		if i, j := strings.Index(doc, s.begin), strings.Index(doc, s.end); i >= 0 && j > i {
			doc = doc[:i] + sec + strings.TrimPrefix(doc[j+len(s.end):], "\n")
		} else {
			if doc == "" {
				doc = "# Benchmarks\n\n"
			}
			doc = strings.TrimRight(doc, "\n") + "\n\n" + sec
		}
	}
	return os.WriteFile(path, []byte(doc), 0o644)
}

// machine describes this host: CPU model, cores, memory, OS and Go.
func machine() string {
	cpu := "unknown CPU"
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		s := bufio.NewScanner(f)
		for s.Scan() {
			if k, v, ok := strings.Cut(s.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				cpu = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	mem := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int64
		if _, err := fmt.Sscanf(string(b), "MemTotal: %d kB", &kb); err == nil {
			mem = fmt.Sprintf(", %.0f GiB RAM", float64(kb)/(1<<20))
		}
	}
	return fmt.Sprintf("%s, %d cores%s, %s/%s, %s", cpu, runtime.NumCPU(), mem, runtime.GOOS, runtime.GOARCH, runtime.Version())
}
