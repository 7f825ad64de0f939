package bench

import (
	"context"
	"encoding/json"
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
	"google.golang.org/grpc/metadata"

	"github.com/aethermesh/aether/registry"
)

// The fanout comparison: the same workload, three ways for agents to learn
// of changes, each against a fresh etcd process.

// Compare modes.
const (
	ModeEtcdDirect = "etcd-direct" // (a) one etcd watch per dependency
	ModeGRPCProxy  = "grpc-proxy"  // (b) the same, through etcd's gRPC proxy
	ModeRegistrar  = "registrar"   // (c) one registrar stream per agent
)

// CompareConfig sizes the comparison.
type CompareConfig struct {
	Services  int
	Endpoints int
	Agents    []int // the ladder of agent counts, smallest first
	Conns     int   // connections (clients) the agents share
	MaxDeps   int
	Load      FanoutLoad
	// WriteBatchInterval is the registrars' --write-batch-interval.
	WriteBatchInterval time.Duration
	// Modes, if set, are the modes to run instead (ratios need the first
	// two to be etcd-direct and grpc-proxy).
	Modes        []string
	Connecting   int           // agents setting up at once (default 500)
	Drain        time.Duration // default 15 s
	SetupTimeout time.Duration // default 3 minutes
	Settle       time.Duration // pause between setup and churn, in every mode (default 5 s)
}

func (c CompareConfig) withDefaults() CompareConfig {
	if c.Connecting <= 0 {
		c.Connecting = 500
	}
	if c.Drain <= 0 {
		c.Drain = 15 * time.Second
	}
	if c.SetupTimeout <= 0 {
		c.SetupTimeout = 3 * time.Minute
	}
	if c.Settle <= 0 {
		c.Settle = defaultSettle
	}
	c.Conns = max(c.Conns, 2)
	return c
}

// CompareResult is the comparison: every load of the ladder in each mode,
// and the registrar's ratios at the largest load etcd-direct survived.
type CompareResult struct {
	Services           int           `json:"services"`
	Endpoints          int           `json:"endpoints"`
	Conns              int           `json:"conns"`
	MaxDeps            int           `json:"max_deps"`
	Rate               int           `json:"rate_per_s"`
	Seconds            float64       `json:"churn_s"`
	WriteBatchInterval string        `json:"write_batch_interval"`
	DrainSec           float64       `json:"drain_s"`
	SettleSec          float64       `json:"settle_s"`
	Loads              []CompareLoad `json:"loads"`
	// At is the index in Loads of the largest load etcd-direct survived
	// (-1: none), where the ratios are taken.
	At int `json:"ratios_at"`
	// Ratios of each registrar mode with etcd-direct and grpc-proxy there.
	Ratios []CompareRatios `json:"ratios,omitempty"`
}

// CompareRatios compare a registrar mode with another mode at one load:
// the other's figure over the registrar's, so above 1 means the registrar
// is better. Zero where either did not survive.
type CompareRatios struct {
	Registrar   string  `json:"registrar"`
	Versus      string  `json:"versus"`
	Agents      int     `json:"agents"`   // the load compared at
	Measured    bool    `json:"measured"` // both survived
	EtcdPeakRSS float64 `json:"etcd_peak_rss"`
	// EtcdGrowth compares etcd's peak RSS above its RSS after the preload.
	EtcdGrowth float64 `json:"etcd_rss_growth"`
	EtcdCPU    float64 `json:"etcd_cpu"`
	P99        float64 `json:"p99"` // the registrar's cross-replica p99
	TotalRSS   float64 `json:"total_peak_rss"`
}

// CompareLoad is one load of the ladder.
type CompareLoad struct {
	Agents        int           `json:"agents"`
	Subscriptions int           `json:"subscriptions"` // agents x their dependencies
	MeanDeps      float64       `json:"mean_deps"`
	Modes         []CompareMode `json:"modes"`
}

// CompareMode is one mode at one load.
type CompareMode struct {
	Mode string `json:"mode"`
	// Latency over every delivery; for the registrar, the cross-replica
	// ones (the agents on replica B) and, apart, the same-replica ones.
	Latency     Latencies  `json:"latency"`
	SameReplica *Latencies `json:"same_replica,omitempty"`
	Expected    int64      `json:"expected"`
	Delivered   int64      `json:"delivered"`
	Missing     int64      `json:"missing"`
	WatchErrors int        `json:"watch_errors"` // watches canceled or streams cut off
	ErrorText   string     `json:"error,omitempty"`
	SetupSec    float64    `json:"setup_s"` // every agent has its initial state and its watches
	Changes     int        `json:"changes"`
	Achieved    float64    `json:"achieved_per_s"`

	EtcdBaseRSSMB float64 `json:"etcd_base_rss_mb"` // after the preload, before agents
	EtcdPeakRSSMB float64 `json:"etcd_peak_rss_mb"`
	EtcdSetupCPU  float64 `json:"etcd_setup_cpu_s"`
	EtcdChurnCPU  float64 `json:"etcd_churn_cpu_s"`
	EtcdCPU       float64 `json:"etcd_cpu_s"` // total
	// The tier between agents and etcd: the proxy, or both registrars.
	TierPeakRSSMB float64 `json:"tier_peak_rss_mb,omitempty"`
	TierCPU       float64 `json:"tier_cpu_s,omitempty"`
	LoadGenCPU    float64 `json:"load_generator_cpu_s"`

	EtcdWatchers     int `json:"etcd_watchers"`
	EtcdWatchStreams int `json:"etcd_watch_streams"`

	Survived bool   `json:"survived"`
	Why      string `json:"why,omitempty"`
}

// Compare runs the ladder: at each load, each mode in a fresh world. Once
// etcd-direct fails a load, larger loads are not tried (for any mode); once
// another mode fails one, it is not tried at larger loads (it is reported
// as not surviving them).
func Compare(ctx context.Context, cfg CompareConfig, exe string, w io.Writer) (CompareResult, error) {
	cfg = cfg.withDefaults()
	res := CompareResult{Services: cfg.Services, Endpoints: cfg.Endpoints, Conns: cfg.Conns, MaxDeps: cfg.MaxDeps,
		Rate: cfg.Load.Rate, Seconds: cfg.Load.Duration.Seconds(), WriteBatchInterval: orDefault(cfg.WriteBatchInterval), DrainSec: cfg.Drain.Seconds(), SettleSec: cfg.Settle.Seconds(), At: -1}
	b, err := fanoutBins(ctx, exe, w)
	if err != nil {
		return res, err
	}
	failedAt := map[string]int{} // mode: the load it did not survive
	for _, n := range cfg.Agents {
		wl := newFanWorkload(cfg.Services, cfg.Endpoints, n, cfg.MaxDeps)
		load := CompareLoad{Agents: n}
		load.Subscriptions, load.MeanDeps, _, _ = wl.depStats()
		fmt.Fprintf(w, "  %d agents x %.1f deps on average = %d subscriptions, %d changes/s for %v:\n", n, load.MeanDeps, load.Subscriptions, cfg.Load.Rate, cfg.Load.Duration)
		modes := []string{ModeEtcdDirect, ModeGRPCProxy, ModeRegistrar}
		if len(cfg.Modes) > 0 {
			modes = cfg.Modes
		}
		for _, mode := range modes {
			var m CompareMode
			var err error
			if at, failed := failedAt[mode]; failed {
				m = CompareMode{Mode: mode, Why: fmt.Sprintf("not run: did not survive %d agents", at)}
				fmt.Fprintf(w, "    %-11s %s\n", mode, m.Why)
				load.Modes = append(load.Modes, m)
				continue
			}
			switch mode {
			case ModeRegistrar:
				m, err = compareRegistrar(ctx, cfg, wl, b, mode, nil)
			default:
				m, err = compareEtcd(ctx, cfg, wl, b, mode == ModeGRPCProxy)
			}
			if err != nil {
				if ctx.Err() != nil {
					return res, ctx.Err()
				}
				// A world that could not even be set up did not survive.
				m = CompareMode{Mode: mode, Why: err.Error()}
			}
			fmt.Fprintf(w, "    %-11s set up in %.1fs; %s\n", mode, m.SetupSec, m.Latency)
			if m.SameReplica != nil {
				fmt.Fprintf(w, "    %-11s (same replica: %s)\n", "", m.SameReplica)
			}
			fmt.Fprintf(w, "    %-11s etcd RSS %.0f → %.0f MB, CPU %.1f s; %d etcd watches%s\n", "", m.EtcdBaseRSSMB, m.EtcdPeakRSSMB, m.EtcdCPU, m.EtcdWatchers, survivalNote(m))
			if !m.Survived {
				failedAt[mode] = n
			}
			load.Modes = append(load.Modes, m)
		}
		res.Loads = append(res.Loads, load)
		if load.Modes[0].Mode == ModeEtcdDirect && !load.Modes[0].Survived {
			break
		}
		res.At = len(res.Loads) - 1
	}
	if res.At >= 0 && len(cfg.Modes) == 0 {
		// Against etcd-direct at the largest load it survived; against the
		// proxy at the largest load up to that one that the proxy survived.
		proxyAt := -1
		for i := res.At; i >= 0 && proxyAt < 0; i-- {
			if res.Loads[i].Modes[1].Survived {
				proxyAt = i
			}
		}
		at := res.Loads[res.At]
		for k := 2; k < len(at.Modes); k++ {
			res.Ratios = append(res.Ratios, ratios(at.Modes[0], at.Modes[k], at.Agents))
			if proxyAt >= 0 {
				l := res.Loads[proxyAt]
				res.Ratios = append(res.Ratios, ratios(l.Modes[1], l.Modes[k], l.Agents))
			} else {
				res.Ratios = append(res.Ratios, CompareRatios{Registrar: at.Modes[k].Mode, Versus: ModeGRPCProxy})
			}
		}
	}
	return res, nil
}

func survivalNote(m CompareMode) string {
	if m.Survived {
		return ""
	}
	return "; DID NOT SURVIVE: " + m.Why
}

func ratios(other, reg CompareMode, agents int) CompareRatios {
	r := CompareRatios{Registrar: reg.Mode, Versus: other.Mode, Agents: agents}
	if !other.Survived || !reg.Survived {
		return r
	}
	div := func(a, b float64) float64 {
		if b <= 0 {
			return 0
		}
		return a / b
	}
	return CompareRatios{
		Registrar: reg.Mode, Versus: other.Mode, Agents: agents, Measured: true,
		EtcdPeakRSS: div(other.EtcdPeakRSSMB, reg.EtcdPeakRSSMB),
		EtcdGrowth:  div(other.EtcdPeakRSSMB-other.EtcdBaseRSSMB, reg.EtcdPeakRSSMB-reg.EtcdBaseRSSMB),
		EtcdCPU:     div(other.EtcdCPU, reg.EtcdCPU),
		P99:         div(other.Latency.P99, reg.Latency.P99),
		TotalRSS:    div(other.EtcdPeakRSSMB+other.TierPeakRSSMB, reg.EtcdPeakRSSMB+reg.TierPeakRSSMB),
	}
}

// compareRegistrar is mode (c): the fanout scenario's world with one phase.
func compareRegistrar(ctx context.Context, cfg CompareConfig, wl *fanWorkload, b bins, mode string, extra []string) (CompareMode, error) {
	m := CompareMode{Mode: mode}
	rw, _, err := newRegWorld(ctx, wl, b, cfg.Conns, cfg.WriteBatchInterval, extra)
	if err != nil {
		return m, err
	}
	defer rw.close()
	base := rw.snapStats()
	m.EtcdBaseRSSMB = float64(rw.preloaded.RSSBytes) / (1 << 20)
	ag, setup, err := rw.startRegAgents(ctx, 1, cfg.Connecting, cfg.SetupTimeout)
	if err != nil {
		if ctx.Err() != nil {
			return m, err
		}
		s := rw.snapStats()
		m.EtcdPeakRSSMB, m.EtcdCPU = float64(s[0].PeakRSS)/(1<<20), s[0].CPUSec
		m.TierPeakRSSMB, m.TierCPU = float64(s[1].PeakRSS+s[2].PeakRSS)/(1<<20), s[1].CPUSec+s[2].CPUSec
		m.Why = "setup: " + err.Error()
		return m, nil
	}
	defer ag.stop()
	m.SetupSec = setup.Seconds()
	if m.EtcdWatchers, m.EtcdWatchStreams, err = rw.etcd.watches(); err != nil {
		return m, err
	}
	if err := settle(ctx, cfg.Settle); err != nil {
		return m, err
	}
	synced := rw.snapStats()
	subsA := wl.subscribers(func(a int) bool { return a%2 == 0 })
	subsB := wl.subscribers(func(a int) bool { return a%2 == 1 })
	ph, _, err := rw.regPhase(ctx, ag, 0, cfg.Load, 0, cfg.Drain, subsA, subsB)
	if err != nil {
		return m, err
	}
	end := rw.snapStats()
	m.Latency, m.SameReplica = ph.Cross, &ph.Same
	m.Expected, m.Delivered, m.Missing = ph.Expected, ph.Delivered, ph.Missing
	m.WatchErrors, m.ErrorText = ph.StreamsEnded, ph.EndedReason
	m.Changes, m.Achieved = ph.Changes, ph.Achieved
	m.EtcdPeakRSSMB = float64(end[0].PeakRSS) / (1 << 20)
	m.EtcdSetupCPU = synced[0].CPUSec - rw.preloaded.CPUSec // the registrars' initial listings and the agents
	m.EtcdChurnCPU = ph.EtcdCPU
	m.EtcdCPU = end[0].CPUSec
	m.TierPeakRSSMB = float64(end[1].PeakRSS+end[2].PeakRSS) / (1 << 20)
	m.TierCPU = end[1].CPUSec + end[2].CPUSec
	m.LoadGenCPU = end[3].CPUSec - base[3].CPUSec
	m.Survived, m.Why = survived(m, ph.WriteErrors, ph.WriteError, ph.Behind)
	return m, nil
}

// survived: every delivery arrived within the drain, no watch or stream
// ended, and every write went through.
func survived(m CompareMode, writeErrs int, writeErr string, behind int) (bool, string) {
	var why []string
	if m.Missing > 0 {
		why = append(why, fmt.Sprintf("%d of %d deliveries missing", m.Missing, m.Expected))
	}
	if m.WatchErrors > 0 {
		why = append(why, fmt.Sprintf("%d watches ended (%s)", m.WatchErrors, m.ErrorText))
	}
	if writeErrs > 0 {
		why = append(why, fmt.Sprintf("%d writes failed (%s)", writeErrs, writeErr))
	}
	if behind > 0 {
		why = append(why, fmt.Sprintf("the writer fell %d changes behind", behind))
	}
	return len(why) == 0, strings.Join(why, "; ")
}

// etcdAgents are agents watching etcd (or the proxy) with clientv3: for
// each dependency a Get of the service's prefix, then a Watch of it from
// the next revision. Agent a uses client a%len(clients), with a watch
// stream of its own.
type etcdAgents struct {
	rc      *receipts
	errs    atomic.Int64
	errText atomic.Pointer[string]
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

func (ea *etcdAgents) stop() {
	ea.cancel()
	ea.wg.Wait()
}

func (ea *etcdAgents) fail(err error) {
	ea.errs.Add(1)
	msg := err.Error()
	ea.errText.CompareAndSwap(nil, &msg)
}

func startEtcdAgents(ctx context.Context, wl *fanWorkload, clients []*clientv3.Client, connecting int, timeout time.Duration) (*etcdAgents, time.Duration, error) {
	actx, cancel := context.WithCancel(ctx)
	ea := &etcdAgents{rc: newReceipts(1), cancel: cancel}
	sem := make(chan struct{}, connecting)
	ready := make(chan error, len(wl.agents))
	start := time.Now()
	for a, deps := range wl.agents {
		cli := clients[a%len(clients)]
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			ea.stop()
			return nil, 0, ctx.Err()
		}
		ea.wg.Add(1) // held by the setup, so its receivers' Adds are legal
		go func() {
			defer ea.wg.Done()
			err := ea.setup(actx, cli, wl, a, deps)
			<-sem
			ready <- err
		}()
	}
	deadline := time.After(timeout)
	for range wl.agents {
		select {
		case err := <-ready:
			if err != nil {
				ea.stop()
				return nil, 0, err
			}
		case <-deadline:
			ea.stop()
			return nil, 0, fmt.Errorf("agents not all set up after %v", timeout)
		case <-ctx.Done():
			ea.stop()
			return nil, 0, ctx.Err()
		}
	}
	return ea, time.Since(start), nil
}

func (ea *etcdAgents) setup(ctx context.Context, cli *clientv3.Client, wl *fanWorkload, agent int, deps []int32) error {
	// An agent's watches share one gRPC watch stream of its own, as on an
	// agent's own client: clientv3 puts the watches of a client whose
	// contexts carry the same outgoing metadata on one stream.
	ctx = metadata.AppendToOutgoingContext(ctx, "aether-bench-agent", strconv.Itoa(agent))
	for _, s := range deps {
		prefix := registry.ServicePrefix(fanRegion, fanCluster, wl.services[s])
		gctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		resp, err := cli.Get(gctx, prefix, clientv3.WithPrefix())
		cancel()
		if err != nil {
			return fmt.Errorf("agent %d: get %s: %w", agent, prefix, err)
		}
		if len(resp.Kvs) != wl.perSvc[s] {
			return fmt.Errorf("agent %d: get %s: %d endpoints, want %d", agent, prefix, len(resp.Kvs), wl.perSvc[s])
		}
		wch := cli.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1), clientv3.WithCreatedNotify())
		// Wait for etcd to confirm the watch, so it is in place before
		// the churn starts.
		select {
		case first, ok := <-wch:
			if !ok || first.Err() != nil || !first.Created {
				return fmt.Errorf("agent %d: watch %s: not created (%v)", agent, prefix, first.Err())
			}
		case <-time.After(30 * time.Second):
			return fmt.Errorf("agent %d: watch %s: not created within 30s", agent, prefix)
		}
		ea.wg.Add(1)
		go ea.receive(ctx, wch)
	}
	return nil
}

func (ea *etcdAgents) receive(ctx context.Context, wch clientv3.WatchChan) {
	defer ea.wg.Done()
	for resp := range wch {
		now := time.Now()
		if err := resp.Err(); err != nil || resp.Canceled {
			if ctx.Err() == nil {
				if err == nil {
					err = errors.New("watch canceled")
				}
				ea.fail(err)
			}
			return
		}
		for _, ev := range resp.Events {
			if ev.Type != clientv3.EventTypePut {
				continue
			}
			ep, err := registry.DecodeEndpoint(string(ev.Kv.Key), ev.Kv.Value)
			if err != nil {
				ea.fail(err)
				continue
			}
			ea.rc.record(0, ep.GetMetadata()[sentKey], now)
		}
	}
	if ctx.Err() == nil {
		ea.fail(errors.New("watch channel closed"))
	}
}

// proxyError is the proxy's last logged error, if any, for a message.
func proxyError(p *proc) string {
	if p == nil {
		return ""
	}
	l := p.logs.lastMatching(`"level":"error"`)
	if l == "" {
		return ""
	}
	var e struct{ Caller, Msg string }
	if json.Unmarshal([]byte(l), &e) == nil && e.Msg != "" {
		l = e.Msg + " (" + e.Caller + ")"
	}
	return "; the proxy's last error: " + l
}

// compareEtcd is modes (a) and (b): agents as clientv3 clients of etcd, or
// of a grpc-proxy in front of it; writes are etcd Puts of the v1 key.
func compareEtcd(ctx context.Context, cfg CompareConfig, wl *fanWorkload, b bins, proxied bool) (CompareMode, error) {
	m := CompareMode{Mode: ModeEtcdDirect}
	if proxied {
		m.Mode = ModeGRPCProxy
	}
	etcd, err := startEtcdProc(ctx, b.etcd)
	if err != nil {
		return m, err
	}
	defer etcd.stop(15 * time.Second)
	newClient := func(ep string) (*clientv3.Client, error) {
		return clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	}
	writer, err := newClient(etcd.url)
	if err != nil {
		return m, err
	}
	defer writer.Close()
	if err := wl.preload(ctx, writer); err != nil {
		return m, fmt.Errorf("preload: %w", err)
	}
	target := etcd.url
	var proxy *proc
	if proxied {
		var addr string
		if proxy, addr, err = startGRPCProxy(ctx, b.etcd, etcd.url); err != nil {
			return m, err
		}
		defer proxy.stop(15 * time.Second)
		target = addr
	}
	var clients []*clientv3.Client
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	for range cfg.Conns {
		c, err := newClient(target)
		if err != nil {
			return m, err
		}
		clients = append(clients, c)
	}
	stats := func() (e, t, self procStats) {
		e, _ = etcd.stats()
		if proxy != nil {
			t, _ = proxy.stats()
		}
		return e, t, selfStats()
	}
	eBase, _, selfBase := stats()
	m.EtcdBaseRSSMB = float64(eBase.RSSBytes) / (1 << 20)
	ea, setup, err := startEtcdAgents(ctx, wl, clients, cfg.Connecting, cfg.SetupTimeout)
	if err != nil {
		if ctx.Err() != nil {
			return m, err
		}
		e, t, _ := stats()
		m.EtcdPeakRSSMB, m.EtcdCPU = float64(e.PeakRSS)/(1<<20), e.CPUSec
		m.TierPeakRSSMB, m.TierCPU = float64(t.PeakRSS)/(1<<20), t.CPUSec
		m.Why = "setup: " + err.Error() + proxyError(proxy)
		return m, nil
	}
	defer ea.stop()
	m.SetupSec = setup.Seconds()
	if m.EtcdWatchers, m.EtcdWatchStreams, err = etcd.watches(); err != nil {
		return m, err
	}
	if err := settle(ctx, cfg.Settle); err != nil {
		return m, err
	}
	eSynced, _, _ := stats()
	m.EtcdSetupCPU = eSynced.CPUSec - eBase.CPUSec

	S := len(wl.services)
	subs := wl.subscribers(func(int) bool { return true })
	write := func(ctx context.Context, i int) error {
		ep := wl.stamped(i, 0, time.Now())
		key, err := registry.IDOf(ep).Key()
		if err != nil {
			return err
		}
		v, err := registry.EncodeEndpoint(ep)
		if err != nil {
			return err
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err = writer.Put(cctx, key, string(v))
		return err
	}
	expected := func(i int) [2]int64 { return [2]int64{subs[i%S], 0} }
	cr, _ := runChurn(ctx, wl, 0, cfg.Load.Rate, cfg.Load.Duration, churnWriters, write, expected)
	eChurn, _, _ := stats()
	m.EtcdChurnCPU = eChurn.CPUSec - eSynced.CPUSec
	h := &ea.rc.phases[0].paths[0]
	waitDeliveries(ctx, cfg.Drain, func() bool { return h.count() >= cr.expectedN[0] || ea.errs.Load() > 0 })
	if err := errors.Join(etcd.check(), func() error {
		if proxy != nil {
			return proxy.check()
		}
		return nil
	}()); err != nil {
		m.Why = err.Error()
		return m, nil
	}
	e, t, self := stats()
	m.Latency = h.latencies()
	m.Expected, m.Delivered = cr.expectedN[0], h.count()
	m.Missing = max(0, m.Expected-m.Delivered)
	m.WatchErrors = int(ea.errs.Load())
	if p := ea.errText.Load(); p != nil {
		m.ErrorText = *p + proxyError(proxy)
	}
	m.Changes, m.Achieved = cr.Issued, cr.Achieved
	m.EtcdPeakRSSMB, m.EtcdCPU = float64(e.PeakRSS)/(1<<20), e.CPUSec
	if proxy != nil {
		m.TierPeakRSSMB, m.TierCPU = float64(t.PeakRSS)/(1<<20), t.CPUSec
	}
	m.LoadGenCPU = self.CPUSec - selfBase.CPUSec
	m.Survived, m.Why = survived(m, cr.Errors, cr.FirstErr, cr.Behind)
	return m, nil
}
