package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend/etcd/embedetcd"
	"github.com/aethermesh/aether/backend/etcd/replicator"
	"github.com/aethermesh/aether/internal/faultproxy"
	"github.com/aethermesh/aether/registry"
)

// Regions of the replication scenario.
const (
	replOrigin = "bench-a"
	replPeer   = "bench-b"
)

// ReplicationConfig sizes the replication scenario.
type ReplicationConfig struct {
	Changes int // burst size
	Writers int // concurrent burst writers (default 4)
	// Partition is how long the peer is blackholed while the origin takes
	// PartitionRate changes per second (0: no partition phase).
	Partition     time.Duration
	PartitionRate int
	// LeaseTTLs are the replicator runs, one per origin-lease TTL.
	LeaseTTLs []time.Duration
	// MakeMirror adds a run of the real "etcdctl make-mirror" (built from
	// tools/etcdctl) on the same workload.
	MakeMirror bool
	// BurstDeadline and HealDeadline bound the waits for convergence
	// (defaults 2 minutes and 45 s).
	BurstDeadline, HealDeadline time.Duration
}

// ReplicationResult is one run of the scenario: each mirror tool on the
// same workload, on the same machine, one after the other.
type ReplicationResult struct {
	Runs []ReplicationRun `json:"runs"`
	// MakeMirror says whether etcdctl make-mirror was measured, and if not,
	// why not.
	MakeMirror     string `json:"make_mirror"`
	EtcdctlVersion string `json:"etcdctl_version,omitempty"`
}

// ReplicationRun is one mirror tool's figures.
type ReplicationRun struct {
	Tool     string `json:"tool"`
	LeaseTTL string `json:"lease_ttl,omitempty"` // the replicator's origin lease on the peer

	BurstChanges int     `json:"burst_changes"`
	BurstPuts    int     `json:"burst_puts"`
	BurstDeletes int     `json:"burst_deletes"`
	BurstWriters int     `json:"burst_writers"`
	BurstWriteMs float64 `json:"burst_write_ms"`   // how long the writers took
	BurstRatePS  float64 `json:"burst_rate_per_s"` // changes committed per second
	AvgValueB    int     `json:"avg_value_bytes"`
	// Lag: time the peer's watcher first saw each change (or a later
	// change of its key) minus the time it committed in the origin.
	Lag        Latencies `json:"lag"`
	LagMissing int       `json:"lag_missing"` // changes the peer never showed
	// LagCoalesced: changes of keys created and deleted within one batch
	// of a last-event-per-key mirror, which the peer never shows (its state
	// is still right); not in Lag, not Missing.
	LagCoalesced int `json:"lag_coalesced,omitempty"`
	// BurstConvergedMs is from the burst's last commit until the peer's
	// copy equalled the origin's subtree; -1 if it never did.
	BurstConvergedMs float64 `json:"burst_converged_ms"`

	PartitionSec     float64 `json:"partition_s,omitempty"`
	PartitionChanges int     `json:"partition_changes,omitempty"`
	PartitionRate    int     `json:"partition_rate_per_s,omitempty"`
	KeysAtHeal       int     `json:"keys_at_heal,omitempty"`
	// HealConvergedMs is from the heal until the peer's copy equalled the
	// origin's subtree (keys and values); -1 if not within the deadline.
	HealConvergedMs float64 `json:"heal_converged_ms,omitempty"`
	// PeerEmptiedAfterMs: the peer dropped every key of the origin this
	// long into the partition (origin lease expired); 0 if it did not.
	PeerEmptiedAfterMs float64 `json:"peer_emptied_after_ms,omitempty"`
	// StaleKeys and OtherDiffs describe a peer that did not converge: keys
	// it holds that the origin deleted, and keys missing or different.
	StaleKeys  int `json:"stale_keys,omitempty"`
	OtherDiffs int `json:"other_diffs,omitempty"`
	// Exits lists make-mirror exits (it was restarted after each).
	Exits []string `json:"exits,omitempty"`
}

func (c ReplicationConfig) withDefaults() ReplicationConfig {
	if c.Writers <= 0 {
		c.Writers = 4
	}
	if c.PartitionRate <= 0 {
		c.PartitionRate = 200
	}
	if len(c.LeaseTTLs) == 0 {
		c.LeaseTTLs = []time.Duration{replicator.DefaultLeaseTTL}
	}
	if c.BurstDeadline <= 0 {
		c.BurstDeadline = 2 * time.Minute
	}
	if c.HealDeadline <= 0 {
		c.HealDeadline = 45 * time.Second
	}
	return c
}

// mirrorTool is what copies the origin's subtree to the peer in one run.
type mirrorTool struct {
	name       string
	leaseTTL   time.Duration // replicator
	makeMirror string        // etcdctl binary, for make-mirror
}

// Replication measures mirror lag and convergence for the replicator (once
// per lease TTL) and, if asked, etcdctl make-mirror, each against a fresh
// pair of embedded etcds with the same workload.
func Replication(ctx context.Context, cfg ReplicationConfig, w io.Writer) (ReplicationResult, error) {
	cfg = cfg.withDefaults()
	var res ReplicationResult
	var tools []mirrorTool
	for _, ttl := range cfg.LeaseTTLs {
		tools = append(tools, mirrorTool{name: "aether replicator", leaseTTL: ttl})
	}
	if cfg.MakeMirror {
		fmt.Fprintf(w, "  building etcdctl from %s...\n", etcdctlToolsDir)
		bin, err := etcdctlBinary(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return res, ctx.Err()
			}
			res.MakeMirror = "not measured: " + err.Error()
			fmt.Fprintf(w, "  make-mirror %s\n", res.MakeMirror)
		} else {
			res.MakeMirror = "measured"
			if out, err := exec.CommandContext(ctx, bin, "version").Output(); err == nil {
				res.EtcdctlVersion = strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
			}
			tools = append(tools, mirrorTool{name: "etcdctl make-mirror", makeMirror: bin})
		}
	} else {
		res.MakeMirror = "not measured: --quick does not build etcdctl; run the full benchmark"
	}
	for _, tool := range tools {
		label := tool.name
		if tool.leaseTTL > 0 {
			label += fmt.Sprintf(" (lease %v)", tool.leaseTTL)
		}
		fmt.Fprintf(w, "  %s: burst of %d changes, %d writers", label, cfg.Changes, cfg.Writers)
		if cfg.Partition > 0 {
			fmt.Fprintf(w, "; then %v partition at %d changes/s", cfg.Partition, cfg.PartitionRate)
		}
		fmt.Fprintln(w, "...")
		run, err := replicationRun(ctx, cfg, tool)
		if err != nil {
			return res, fmt.Errorf("%s: %w", label, err)
		}
		fmt.Fprintf(w, "    burst: %.0f changes/s written; lag %s; converged %s after the last commit\n",
			run.BurstRatePS, run.Lag, fmtConverged(run.BurstConvergedMs))
		if cfg.Partition > 0 {
			fmt.Fprintf(w, "    partition: %d changes during %v; converged %s after heal", run.PartitionChanges, cfg.Partition, fmtConverged(run.HealConvergedMs))
			if run.PeerEmptiedAfterMs > 0 {
				fmt.Fprintf(w, " (peer dropped the origin's keys %.1fs into the partition)", run.PeerEmptiedAfterMs/1000)
			}
			if run.HealConvergedMs < 0 {
				fmt.Fprintf(w, " (%d stale keys, %d missing or different)", run.StaleKeys, run.OtherDiffs)
			}
			fmt.Fprintln(w)
		}
		for _, e := range run.Exits {
			fmt.Fprintf(w, "    exited: %s\n", e)
		}
		res.Runs = append(res.Runs, run)
	}
	return res, nil
}

func fmtConverged(ms float64) string {
	if ms < 0 {
		return "never (within the deadline)"
	}
	return fmt.Sprintf("%.0f ms", ms)
}

// replWorld is one run's pair of regions: two embedded etcds, the peer
// reachable through a fault proxy.
type replWorld struct {
	dir         string
	a, b        *embedetcd.Server
	aCli, bCli  *clientv3.Client // writes and reads of the harness
	aWatch      *clientv3.Client
	bWatch      *clientv3.Client
	replLocal   *clientv3.Client // the replicator's local client
	proxy       *faultproxy.Proxy
	cancelWatch context.CancelFunc
	aTrk, bTrk  *tracker
}

func newReplWorld(ctx context.Context) (_ *replWorld, err error) {
	dir, err := os.MkdirTemp("", "aether-bench-repl-")
	if err != nil {
		return nil, err
	}
	e := &replWorld{dir: dir}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	quiet := slog.New(slog.DiscardHandler)
	for _, s := range []struct {
		name string
		dst  **embedetcd.Server
	}{{replOrigin, &e.a}, {replPeer, &e.b}} {
		*s.dst, err = embedetcd.Start(ctx, embedetcd.Config{
			Dir: filepath.Join(dir, s.name), Name: s.name, ClientAddr: "127.0.0.1:0", PeerAddr: "127.0.0.1:0", Logger: quiet,
		})
		if err != nil {
			return nil, fmt.Errorf("etcd %s: %w", s.name, err)
		}
	}
	for _, c := range []struct {
		dst **clientv3.Client
		srv *embedetcd.Server
	}{{&e.aCli, e.a}, {&e.aWatch, e.a}, {&e.replLocal, e.a}, {&e.bCli, e.b}, {&e.bWatch, e.b}} {
		*c.dst, err = clientv3.New(clientv3.Config{Endpoints: c.srv.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return nil, err
		}
	}
	u, err := url.Parse(e.b.Endpoints()[0])
	if err != nil {
		return nil, err
	}
	if e.proxy, err = faultproxy.Start(u.Host); err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(ctx)
	e.cancelWatch = cancel
	prefix := registry.RegionPrefix(replOrigin)
	if e.aTrk, err = track(wctx, e.aWatch, prefix); err != nil {
		return nil, err
	}
	if e.bTrk, err = track(wctx, e.bWatch, prefix); err != nil {
		return nil, err
	}
	return e, nil
}

func (e *replWorld) close() {
	if e.cancelWatch != nil {
		e.cancelWatch()
	}
	if e.proxy != nil {
		_ = e.proxy.Close()
	}
	for _, c := range []*clientv3.Client{e.aCli, e.aWatch, e.replLocal, e.bCli, e.bWatch} {
		if c != nil {
			c.Close()
		}
	}
	for _, s := range []*embedetcd.Server{e.a, e.b} {
		if s != nil {
			s.Close()
		}
	}
	os.RemoveAll(e.dir)
}

// startTool starts the mirror from a to b (through the proxy) and returns a
// function that stops it.
func (e *replWorld) startTool(ctx context.Context, tool mirrorTool) (func(), *makeMirror, error) {
	if tool.makeMirror != "" {
		m := startMakeMirror(ctx, tool.makeMirror, e.a.Endpoints()[0], "http://"+e.proxy.Addr(), registry.RegionPrefix(replOrigin))
		return m.stop, m, nil
	}
	r, err := replicator.New(replicator.Config{
		Region:   replOrigin,
		Local:    e.replLocal,
		Peers:    []replicator.Peer{{Region: replPeer, Endpoints: []string{e.proxy.Addr()}}},
		LeaseTTL: tool.leaseTTL,
		Identity: "aether-bench",
	})
	if err != nil {
		return nil, nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	return func() {
		cancel()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
		}
	}, nil, nil
}

// waitConverged waits until t's state equals its target or d passes; it
// returns when it converged (zero if not) and the keys still differing.
func waitConverged(ctx context.Context, t *tracker, d time.Duration) (time.Time, int, error) {
	deadline := time.Now().Add(d)
	for {
		at, diff, err := t.converged()
		if err != nil {
			return at, diff, fmt.Errorf("peer watch: %w", err)
		}
		if !at.IsZero() || time.Now().After(deadline) {
			return at, diff, nil
		}
		select {
		case <-ctx.Done():
			return at, diff, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func replicationRun(ctx context.Context, cfg ReplicationConfig, tool mirrorTool) (ReplicationRun, error) {
	run := ReplicationRun{Tool: tool.name, BurstChanges: cfg.Changes, BurstWriters: cfg.Writers}
	if tool.leaseTTL > 0 {
		run.LeaseTTL = tool.leaseTTL.String()
	}
	e, err := newReplWorld(ctx)
	if err != nil {
		return run, err
	}
	defer e.close()
	prefix := registry.RegionPrefix(replOrigin)

	// A marker the mirror must copy before the burst starts: the tool is
	// then past its initial sync and watching.
	marker := &registryv1.ServiceEndpoint{Service: "bench-ready", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: "10.255.255.254",
		Cluster: "prod-1", Region: replOrigin, State: registryv1.State_STATE_SERVING}
	mkey, err := registry.IDOf(marker).Key()
	if err != nil {
		return run, err
	}
	mval, _ := registry.EncodeEndpoint(marker)
	if _, err := e.aCli.Put(ctx, mkey, string(mval)); err != nil {
		return run, err
	}
	e.bTrk.setTarget(map[string]string{mkey: string(mval)})

	stop, mm, err := e.startTool(ctx, tool)
	if err != nil {
		return run, err
	}
	defer stop()
	started := time.Now()
	if at, _, err := waitConverged(ctx, e.bTrk, 30*time.Second); err != nil || at.IsZero() {
		msg := "the mirror did not copy a marker key within 30s"
		if mm != nil {
			for _, x := range mm.exitsSince(started) {
				msg += "; make-mirror exited: " + x.Err
			}
		}
		return run, errors.Join(errors.New(msg), err)
	}

	// Burst.
	wl := newWorkload(replOrigin)
	states := make([]*writerState, cfg.Writers)
	for i := range states {
		states[i] = &writerState{id: i}
	}
	e.aTrk.record(true)
	e.bTrk.record(true)
	burstStart := time.Now()
	changes, err := wl.burst(ctx, e.aCli, cfg.Changes, cfg.Writers, states)
	if err != nil {
		return run, fmt.Errorf("burst: %w", err)
	}
	burstEnd := time.Now()
	aFinal, err := readState(ctx, e.aCli, prefix)
	if err != nil {
		return run, err
	}
	e.bTrk.setTarget(aFinal)
	convAt, _, err := waitConverged(ctx, e.bTrk, cfg.BurstDeadline)
	if err != nil {
		return run, err
	}
	ls := computeLags(changes, e.aTrk.observations(), e.bTrk.observations())
	e.aTrk.record(false)
	e.bTrk.record(false)
	var valBytes int
	for _, c := range changes {
		if c.Del {
			run.BurstDeletes++
		} else {
			run.BurstPuts++
			valBytes += len(c.Val)
		}
	}
	if run.BurstPuts > 0 {
		run.AvgValueB = valBytes / run.BurstPuts
	}
	run.BurstWriteMs = ms(burstEnd.Sub(burstStart))
	run.BurstRatePS = float64(len(changes)) / burstEnd.Sub(burstStart).Seconds()
	run.Lag = summarize(ls.Lags)
	run.LagMissing = ls.Missing
	run.LagCoalesced = ls.Coalesced
	run.BurstConvergedMs = -1
	if !convAt.IsZero() {
		run.BurstConvergedMs = ms(max(convAt.Sub(ls.LastCommit), 0))
		if err := checkEqual(ctx, e, prefix); err != nil {
			return run, fmt.Errorf("after the burst: %w", err)
		}
	}
	if mm != nil {
		for _, x := range mm.exitsSince(started) {
			run.Exits = append(run.Exits, fmt.Sprintf("during the burst, %.1fs after start: %s", x.At.Sub(started).Seconds(), x.Err))
		}
	}
	if cfg.Partition <= 0 {
		return run, nil
	}

	// Partition: the peer is blackholed while the origin keeps changing.
	run.PartitionSec, run.PartitionRate = cfg.Partition.Seconds(), cfg.PartitionRate
	e.bTrk.resetEmptied()
	e.proxy.Blackhole()
	cutAt := time.Now()
	pchanges, err := wl.steady(ctx, e.aCli, cfg.PartitionRate, cfg.Partition, states[0])
	if err != nil {
		e.proxy.Heal()
		return run, fmt.Errorf("writes during the partition: %w", err)
	}
	run.PartitionChanges = len(pchanges)
	if aFinal, err = readState(ctx, e.aCli, prefix); err != nil {
		e.proxy.Heal()
		return run, err
	}
	run.KeysAtHeal = len(aFinal)
	e.bTrk.setTarget(aFinal)
	// Writes end with the partition, so the wait for the blackhole to end
	// is the only part of it that may be longer than asked.
	if d := cfg.Partition - time.Since(cutAt); d > 0 {
		time.Sleep(d)
	}
	e.proxy.Heal()
	healAt := time.Now()
	run.PartitionSec = healAt.Sub(cutAt).Seconds()
	if t := e.bTrk.emptied(); !t.IsZero() && t.Before(healAt) {
		run.PeerEmptiedAfterMs = ms(t.Sub(cutAt))
	}
	convAt, _, err = waitConverged(ctx, e.bTrk, cfg.HealDeadline)
	if err != nil {
		return run, err
	}
	if convAt.IsZero() {
		run.HealConvergedMs = -1
		bState, err := readState(ctx, e.bCli, prefix)
		if err != nil {
			return run, err
		}
		run.StaleKeys, run.OtherDiffs = compareStates(aFinal, bState)
	} else {
		run.HealConvergedMs = ms(max(convAt.Sub(healAt), 0))
		if err := checkEqual(ctx, e, prefix); err != nil {
			return run, fmt.Errorf("after the partition: %w", err)
		}
	}
	if mm != nil {
		for _, x := range mm.exitsSince(cutAt) {
			when := fmt.Sprintf("%.1fs into the partition", x.At.Sub(cutAt).Seconds())
			if x.At.After(healAt) {
				when = fmt.Sprintf("%.1fs after heal", x.At.Sub(healAt).Seconds())
			}
			run.Exits = append(run.Exits, when+": "+x.Err)
		}
	}
	return run, nil
}

// checkEqual confirms with a read of both etcds what the peer watcher
// concluded: the peer's copy of the subtree equals the origin's.
func checkEqual(ctx context.Context, e *replWorld, prefix string) error {
	a, err := readState(ctx, e.aCli, prefix)
	if err != nil {
		return err
	}
	b, err := readState(ctx, e.bCli, prefix)
	if err != nil {
		return err
	}
	if n := diffCount(a, b); n != 0 {
		return fmt.Errorf("the peer watcher saw convergence but %d keys differ between the origin (%d keys) and the peer (%d keys)", n, len(a), len(b))
	}
	return nil
}
