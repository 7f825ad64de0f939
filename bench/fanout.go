package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	"github.com/aethermesh/aether/client"
)

// The fanout scenario: simulated agents, N WatchEndpoints streams over M
// gRPC connections to two registrar processes sharing one etcd process,
// each stream subscribed to its own services, while endpoints churn at a
// set rate through replica A.

// FanoutGoalP99 is the design goal: cross-replica p99 at the design churn.
const FanoutGoalP99 = 100 * time.Millisecond

// FanoutLoad is one churn phase: endpoint updates per second for a while.
type FanoutLoad struct {
	Rate     int           // changes per second
	Duration time.Duration // how long
}

// FanoutConfig sizes one fanout step: a fresh etcd and two registrars,
// the agents, and one or more churn phases.
type FanoutConfig struct {
	Label     string
	Services  int
	Endpoints int
	Streams   int // agent streams, half on each replica
	Conns     int // gRPC connections they share, half to each replica
	MaxDeps   int // cap of an agent's dependency count
	Phases    []FanoutLoad
	// WriteBatchInterval is the registrars' --write-batch-interval (0: the
	// default, 100ms).
	WriteBatchInterval time.Duration
	// ExtraFlags are more registrar flags for this step.
	ExtraFlags []string
	// Connecting bounds the agents opening streams at once (default 500).
	Connecting int
	// Drain is how long after a phase's last change missing deliveries are
	// waited for (default 10 s).
	Drain time.Duration
	// SetupTimeout bounds the agents' setup (default 5 minutes).
	SetupTimeout time.Duration
	// Settle is the pause between the agents' setup and the first phase
	// (default 5 s): the setup's snapshots leave the registrars with
	// gigabytes of garbage to collect, which is not what churn costs in
	// steady state.
	Settle time.Duration
}

func (c FanoutConfig) withDefaults() FanoutConfig {
	if c.Connecting <= 0 {
		c.Connecting = 500
	}
	if c.Drain <= 0 {
		c.Drain = 10 * time.Second
	}
	if c.SetupTimeout <= 0 {
		c.SetupTimeout = 5 * time.Minute
	}
	if c.Settle <= 0 {
		c.Settle = defaultSettle
	}
	c.Conns = max(c.Conns, 2)
	return c
}

// ProcFigures are a process's CPU time and peak resident memory.
type ProcFigures struct {
	CPUSec    float64 `json:"cpu_s"`
	PeakRSSMB float64 `json:"peak_rss_mb"`
}

func figures(s procStats) ProcFigures {
	return ProcFigures{CPUSec: s.CPUSec, PeakRSSMB: float64(s.PeakRSS) / (1 << 20)}
}

// FanoutResult is the fanout scenario: its steps, in order.
type FanoutResult struct {
	Steps []FanoutStep `json:"steps"`
	// RegistrarFlags are the flags the harness gave the registrars beyond
	// addresses and etcd.
	RegistrarFlags string `json:"registrar_flags"`
}

// FanoutStep is one step of the load: the world, its setup and its phases.
type FanoutStep struct {
	Label              string   `json:"label,omitempty"`
	Services           int      `json:"services"`
	Endpoints          int      `json:"endpoints"`
	Streams            int      `json:"streams"`
	Conns              int      `json:"conns"`
	MaxDeps            int      `json:"max_deps"`
	Subscriptions      int      `json:"subscriptions"` // the sum of all agents' dependency counts
	MeanDeps           float64  `json:"mean_deps"`
	MedianDeps         int      `json:"median_deps"`
	WriteBatchInterval string   `json:"write_batch_interval"`
	ExtraFlags         []string `json:"extra_registrar_flags,omitempty"`

	PreloadSec float64 `json:"preload_s"`
	// SnapshotSec is from the first agent's connect until every agent had
	// its initial FULL_SNAPSHOT; SnapshotEndpoints is what they held then.
	SnapshotSec       float64 `json:"snapshot_s"`
	SnapshotEndpoints int64   `json:"snapshot_endpoints"`
	SnapshotsShort    int     `json:"snapshots_short,omitempty"` // snapshots missing endpoints
	DrainSec          float64 `json:"drain_s"`                   // how long missing deliveries were waited for
	SettleSec         float64 `json:"settle_s"`                  // pause between the agents' setup and the first phase

	EtcdWatchers     int `json:"etcd_watchers"`
	EtcdWatchStreams int `json:"etcd_watch_streams"`

	Phases []FanoutPhase `json:"phases"`

	// Totals at the end of the step, since each process started.
	Etcd       ProcFigures `json:"etcd"`
	RegistrarA ProcFigures `json:"registrar_a"`
	RegistrarB ProcFigures `json:"registrar_b"`
	LoadGen    ProcFigures `json:"load_generator"`
}

// FanoutPhase is one churn phase of a step.
type FanoutPhase struct {
	Rate        int     `json:"rate_per_s"`
	Seconds     float64 `json:"seconds"`
	Changes     int     `json:"changes"`
	Achieved    float64 `json:"achieved_per_s"`
	WriteErrors int     `json:"write_errors,omitempty"`
	WriteError  string  `json:"write_error,omitempty"`
	Behind      int     `json:"writer_behind,omitempty"` // changes skipped: every writer busy

	Same  Latencies `json:"same_replica"`
	Cross Latencies `json:"cross_replica"`
	// Expected deliveries (a change of a service reaches every stream
	// subscribed to it), delivered, and missing after the drain.
	Expected     int64   `json:"expected"`
	Delivered    int64   `json:"delivered"`
	Missing      int64   `json:"missing"`
	DeliveriesPS float64 `json:"deliveries_per_s"`
	StreamsEnded int     `json:"streams_ended"` // evicted or otherwise cut off
	EndedReason  string  `json:"ended_reason,omitempty"`

	// CPU seconds each process used during the phase's churn.
	EtcdCPU    float64 `json:"etcd_cpu_s"`
	RegACPU    float64 `json:"registrar_a_cpu_s"`
	RegBCPU    float64 `json:"registrar_b_cpu_s"`
	LoadGenCPU float64 `json:"load_generator_cpu_s"`

	Saturated bool   `json:"saturated"`
	Why       string `json:"why,omitempty"`
}

// bins are the programs the scenario runs as processes.
type bins struct {
	etcd, aether string
}

func fanoutBins(ctx context.Context, exe string, w io.Writer) (bins, error) {
	var b bins
	var err error
	if !etcdBin.built() {
		fmt.Fprintf(w, "  building etcd from %s ($%s names a prebuilt one)...\n", etcdBin.dir, etcdBin.env)
	}
	if b.etcd, err = etcdBinary(ctx); err != nil {
		return b, err
	}
	if b.aether, err = aetherBinary(ctx, exe); err != nil {
		return b, err
	}
	return b, nil
}

// registrarFlags are the flags the scenario gives each registrar: no
// per-identity stream limit (every simulated agent connects from
// 127.0.0.1, one identity, where the default limit is 64), and the write
// batch interval.
func registrarFlags(batch time.Duration) []string {
	f := []string{"--max-streams-per-identity", "0"}
	if batch > 0 {
		f = append(f, "--write-batch-interval", batch.String())
	}
	return f
}

// Fanout runs the steps one after another, each in a fresh world.
func Fanout(ctx context.Context, steps []FanoutConfig, exe string, w io.Writer) (FanoutResult, error) {
	res := FanoutResult{RegistrarFlags: strings.Join(registrarFlags(0), " ")}
	b, err := fanoutBins(ctx, exe, w)
	if err != nil {
		return res, err
	}
	for _, cfg := range steps {
		cfg = cfg.withDefaults()
		fmt.Fprintf(w, "  %d services, %d endpoints, %d streams over %d connections, deps up to %d, --write-batch-interval %s...\n",
			cfg.Services, cfg.Endpoints, cfg.Streams, cfg.Conns, cfg.MaxDeps, orDefault(cfg.WriteBatchInterval))
		st, err := fanoutStep(ctx, cfg, b, w)
		if err != nil {
			return res, err
		}
		res.Steps = append(res.Steps, st)
	}
	return res, nil
}

// regWorld is one etcd process and two registrar processes on it, with
// the harness's connections.
type regWorld struct {
	wl     *fanWorkload
	etcd   *etcdProc
	cli    *clientv3.Client
	regs   [2]*registrarProc
	conns  [2][]*grpc.ClientConn // agents' connections to A and B
	writer registrarv1.RegistrarClient
	wconn  *grpc.ClientConn
	// preloaded is etcd's figures after the preload, before registrars.
	preloaded procStats
}

func (rw *regWorld) close() {
	for _, cs := range rw.conns {
		for _, c := range cs {
			c.Close()
		}
	}
	if rw.wconn != nil {
		rw.wconn.Close()
	}
	for _, r := range rw.regs {
		if r != nil {
			r.stop(15 * time.Second)
		}
	}
	if rw.cli != nil {
		rw.cli.Close()
	}
	if rw.etcd != nil {
		rw.etcd.stop(15 * time.Second)
	}
}

// newRegWorld starts etcd, preloads the workload, starts registrars A and
// B and dials conns connections, half to each.
func newRegWorld(ctx context.Context, wl *fanWorkload, b bins, conns int, batch time.Duration, extra []string) (_ *regWorld, preload time.Duration, err error) {
	rw := &regWorld{wl: wl}
	defer func() {
		if err != nil {
			rw.close()
		}
	}()
	if rw.etcd, err = startEtcdProc(ctx, b.etcd); err != nil {
		return nil, 0, err
	}
	if rw.cli, err = clientv3.New(clientv3.Config{Endpoints: []string{rw.etcd.url}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}); err != nil {
		return nil, 0, err
	}
	t0 := time.Now()
	if err = wl.preload(ctx, rw.cli); err != nil {
		return nil, 0, fmt.Errorf("preload: %w", err)
	}
	preload = time.Since(t0)
	rw.preloaded, _ = rw.etcd.stats()
	for i, name := range []string{"registrar A", "registrar B"} {
		if rw.regs[i], err = startRegistrarProc(ctx, b.aether, name, rw.etcd.url, append(registrarFlags(batch), extra...)...); err != nil {
			return nil, 0, err
		}
	}
	dial := func(addr string) (*grpc.ClientConn, error) {
		// The agents' connections are set up as the client library's.
		return grpc.NewClient(addr, append(client.FlowControl(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	}
	for i := range conns {
		r := i % 2
		c, err := dial(rw.regs[r].grpcAddr)
		if err != nil {
			return nil, 0, err
		}
		rw.conns[r] = append(rw.conns[r], c)
	}
	if rw.wconn, err = dial(rw.regs[0].grpcAddr); err != nil {
		return nil, 0, err
	}
	rw.writer = registrarv1.NewRegistrarClient(rw.wconn)
	return rw, preload, nil
}

// regAgents are the agents' streams of a registrar world.
type regAgents struct {
	rc       *receipts
	ended    atomic.Int64
	endedWhy atomic.Pointer[string]
	snapEPs  atomic.Int64
	short    atomic.Int64
	cancel   context.CancelFunc
	wg       sync.WaitGroup
}

// startRegAgents opens one WatchEndpoints stream per agent (agent a on
// replica a%2, round-robin over that replica's connections), at most
// connecting at once, and returns when every stream had its snapshot.
func (rw *regWorld) startRegAgents(ctx context.Context, phases, connecting int, timeout time.Duration) (*regAgents, time.Duration, error) {
	actx, cancel := context.WithCancel(ctx)
	ag := &regAgents{rc: newReceipts(phases), cancel: cancel}
	sem := make(chan struct{}, connecting)
	ready := make(chan error, len(rw.wl.agents))
	start := time.Now()
	for a, deps := range rw.wl.agents {
		path := a % 2
		cs := rw.conns[path]
		client := registrarv1.NewRegistrarClient(cs[(a/2)%len(cs)])
		svcs := make([]string, len(deps))
		for i, s := range deps {
			svcs[i] = rw.wl.services[s]
		}
		want := rw.wl.snapshotSize(a)
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			ag.stop()
			return nil, 0, ctx.Err()
		}
		ag.wg.Add(1)
		go func() {
			defer ag.wg.Done()
			ag.run(actx, client, path, a, svcs, want, func(err error) { <-sem; ready <- err })
		}()
	}
	deadline := time.After(timeout)
	for range rw.wl.agents {
		select {
		case err := <-ready:
			if err != nil {
				ag.stop()
				return nil, 0, err
			}
		case <-deadline:
			ag.stop()
			return nil, 0, fmt.Errorf("agents not all synced after %v", timeout)
		case <-ctx.Done():
			ag.stop()
			return nil, 0, ctx.Err()
		}
	}
	return ag, time.Since(start), nil
}

func (ag *regAgents) run(ctx context.Context, c registrarv1.RegistrarClient, path, agent int, svcs []string, want int, synced func(error)) {
	st, err := c.WatchEndpoints(ctx, &registrarv1.WatchEndpointsRequest{ClusterName: "bench", NodeName: "agent-" + strconv.Itoa(agent), Services: svcs})
	if err != nil {
		synced(fmt.Errorf("agent %d: WatchEndpoints: %w", agent, err))
		return
	}
	got := 0
	for {
		ev, err := st.Recv()
		if err != nil {
			synced(fmt.Errorf("agent %d: before its snapshot ended: %w", agent, err))
			return
		}
		if ev.Type != registrarv1.EndpointEvent_FULL_SNAPSHOT {
			continue // events before the snapshot ends cannot happen; ignore
		}
		got += len(ev.Endpoints)
		if !ev.SnapshotContinues {
			break
		}
	}
	ag.snapEPs.Add(int64(got))
	if got < want {
		ag.short.Add(1)
	}
	synced(nil)
	for {
		ev, err := st.Recv()
		if err != nil {
			if ctx.Err() == nil {
				ag.ended.Add(1)
				msg := status.Convert(err).Message()
				if status.Code(err) == codes.ResourceExhausted || ag.endedWhy.Load() == nil {
					ag.endedWhy.Store(&msg)
				}
			}
			return
		}
		switch ev.Type {
		case registrarv1.EndpointEvent_ENDPOINT_UPDATED, registrarv1.EndpointEvent_ENDPOINT_ADDED:
			ag.rc.record(path, ev.GetEndpoint().GetMetadata()[sentKey], time.Now())
		}
	}
}

func (ag *regAgents) stop() {
	ag.cancel()
	ag.wg.Wait()
}

// snapStats reads the figures of every process of the world and of the
// harness itself: etcd, A, B, load generator.
func (rw *regWorld) snapStats() [4]procStats {
	var out [4]procStats
	out[0], _ = rw.etcd.stats()
	out[1], _ = rw.regs[0].stats()
	out[2], _ = rw.regs[1].stats()
	out[3] = selfStats()
	return out
}

func fanoutStep(ctx context.Context, cfg FanoutConfig, b bins, w io.Writer) (FanoutStep, error) {
	st := FanoutStep{Label: cfg.Label, Services: cfg.Services, Endpoints: cfg.Endpoints, Streams: cfg.Streams, Conns: cfg.Conns,
		MaxDeps: cfg.MaxDeps, WriteBatchInterval: orDefault(cfg.WriteBatchInterval), ExtraFlags: cfg.ExtraFlags, DrainSec: cfg.Drain.Seconds(), SettleSec: cfg.Settle.Seconds()}
	wl := newFanWorkload(cfg.Services, cfg.Endpoints, cfg.Streams, cfg.MaxDeps)
	st.Subscriptions, st.MeanDeps, st.MedianDeps, _ = wl.depStats()
	rw, preload, err := newRegWorld(ctx, wl, b, cfg.Conns, cfg.WriteBatchInterval, cfg.ExtraFlags)
	if err != nil {
		return st, err
	}
	defer rw.close()
	st.PreloadSec = preload.Seconds()
	ag, snap, err := rw.startRegAgents(ctx, len(cfg.Phases), cfg.Connecting, cfg.SetupTimeout)
	if err != nil {
		return st, err
	}
	defer ag.stop()
	st.SnapshotSec, st.SnapshotEndpoints, st.SnapshotsShort = snap.Seconds(), ag.snapEPs.Load(), int(ag.short.Load())
	if st.EtcdWatchers, st.EtcdWatchStreams, err = rw.etcd.watches(); err != nil {
		return st, fmt.Errorf("etcd metrics: %w", err)
	}
	fmt.Fprintf(w, "    preload %.1fs; %d streams (mean %.1f deps, %d subscriptions) synced in %.1fs; etcd has %d watches on %d streams\n",
		st.PreloadSec, cfg.Streams, st.MeanDeps, st.Subscriptions, st.SnapshotSec, st.EtcdWatchers, st.EtcdWatchStreams)
	if err := settle(ctx, cfg.Settle); err != nil {
		return st, err
	}
	subsA := wl.subscribers(func(a int) bool { return a%2 == 0 })
	subsB := wl.subscribers(func(a int) bool { return a%2 == 1 })
	next := 0
	for i, load := range cfg.Phases {
		prof := startProfiles(ctx, cfg.Label, i, load.Duration, map[string]string{
			"etcd": rw.etcd.url, "registrar A": "http://" + rw.regs[0].httpAddr, "registrar B": "http://" + rw.regs[1].httpAddr})
		ph, k, err := rw.regPhase(ctx, ag, i, load, next, cfg.Drain, subsA, subsB)
		prof.stop(w)
		if err != nil {
			return st, err
		}
		next = k
		fmt.Fprintf(w, "    %d changes/s: same %s\n      cross %s\n      %.0f deliveries/s, %d missing, %d streams ended; CPU s: etcd %.1f, A %.1f, B %.1f, load generator %.1f%s\n",
			load.Rate, ph.Same, ph.Cross, ph.DeliveriesPS, ph.Missing, ph.StreamsEnded, ph.EtcdCPU, ph.RegACPU, ph.RegBCPU, ph.LoadGenCPU, satNote(ph.Saturated, ph.Why))
		st.Phases = append(st.Phases, ph)
	}
	if err := errors.Join(rw.etcd.check(), rw.regs[0].check(), rw.regs[1].check()); err != nil {
		return st, err
	}
	s := rw.snapStats()
	st.Etcd, st.RegistrarA, st.RegistrarB, st.LoadGen = figures(s[0]), figures(s[1]), figures(s[2]), figures(s[3])
	return st, nil
}

func satNote(sat bool, why string) string {
	if !sat {
		return ""
	}
	return "; SATURATED: " + why
}

// regPhase runs one churn phase through replica A and waits for the
// deliveries.
func (rw *regWorld) regPhase(ctx context.Context, ag *regAgents, phase int, load FanoutLoad, next int, drain time.Duration, subsA, subsB []int64) (FanoutPhase, int, error) {
	ph := FanoutPhase{Rate: load.Rate}
	endedBefore := ag.ended.Load()
	before := rw.snapStats()
	S := len(rw.wl.services)
	write := func(ctx context.Context, i int) error {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := rw.writer.RegisterEndpoint(cctx, &registrarv1.RegisterEndpointRequest{Endpoint: rw.wl.stamped(i, phase, time.Now())})
		return err
	}
	expected := func(i int) [2]int64 { return [2]int64{subsA[i%S], subsB[i%S]} }
	cr, k := runChurn(ctx, rw.wl, next, load.Rate, load.Duration, churnWriters, write, expected)
	after := rw.snapStats()
	ps := ag.rc.phases[phase]
	waitDeliveries(ctx, drain, func() bool {
		return ps.paths[0].count() >= cr.expectedN[0] && ps.paths[1].count() >= cr.expectedN[1]
	})
	ph.Seconds, ph.Changes, ph.Achieved, ph.WriteErrors, ph.WriteError, ph.Behind = cr.Seconds, cr.Issued, cr.Achieved, cr.Errors, cr.FirstErr, cr.Behind
	ph.Same, ph.Cross = ps.paths[0].latencies(), ps.paths[1].latencies()
	ph.Expected = cr.expectedN[0] + cr.expectedN[1]
	ph.Delivered = ps.paths[0].count() + ps.paths[1].count()
	ph.Missing = max(0, cr.expectedN[0]-ps.paths[0].count()) + max(0, cr.expectedN[1]-ps.paths[1].count())
	ph.DeliveriesPS = float64(ph.Delivered) / cr.Seconds
	ph.StreamsEnded = int(ag.ended.Load() - endedBefore)
	if p := ag.endedWhy.Load(); p != nil && ph.StreamsEnded > 0 {
		ph.EndedReason = *p
	}
	ph.EtcdCPU = after[0].CPUSec - before[0].CPUSec
	ph.RegACPU = after[1].CPUSec - before[1].CPUSec
	ph.RegBCPU = after[2].CPUSec - before[2].CPUSec
	ph.LoadGenCPU = after[3].CPUSec - before[3].CPUSec
	var why []string
	if ph.Cross.P99 > ms(FanoutGoalP99) {
		why = append(why, fmt.Sprintf("cross-replica p99 %.0f ms > %.0f ms", ph.Cross.P99, ms(FanoutGoalP99)))
	}
	if ph.StreamsEnded > 0 {
		why = append(why, fmt.Sprintf("%d streams cut off", ph.StreamsEnded))
	}
	if ph.Missing > 0 {
		why = append(why, fmt.Sprintf("%d deliveries missing", ph.Missing))
	}
	if ph.WriteErrors > 0 {
		why = append(why, fmt.Sprintf("%d writes failed", ph.WriteErrors))
	}
	if ph.Behind > 0 {
		why = append(why, fmt.Sprintf("the writer fell %d changes behind", ph.Behind))
	}
	if bad := ps.bad.Load(); bad > 0 {
		why = append(why, fmt.Sprintf("%d events without a send time", bad))
	}
	ph.Saturated = len(why) > 0
	ph.Why = joinWhy(why)
	if err := errors.Join(rw.etcd.check(), rw.regs[0].check(), rw.regs[1].check()); err != nil {
		return ph, k, err
	}
	return ph, k, nil
}

func joinWhy(why []string) string { return strings.Join(why, "; ") }

// waitDeliveries polls done until it holds or d passes.
func waitDeliveries(ctx context.Context, d time.Duration, done func() bool) {
	deadline := time.Now().Add(d)
	for !done() && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
}

// defaultSettle is the pause between setup and measurement.
const defaultSettle = 5 * time.Second

// settle waits d, or until ctx ends.
func settle(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
