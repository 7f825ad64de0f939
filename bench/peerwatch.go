package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	dynamostore "github.com/aethermesh/aether/backend/dynamodb"
	"github.com/aethermesh/aether/backend/etcd/embedetcd"
	"github.com/aethermesh/aether/disruption"
	"github.com/aethermesh/aether/internal/dynalite"
	"github.com/aethermesh/aether/internal/kubeapiserver"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/server"
)

// ScenarioPeerWatch: peer-watch on both backends (the "Peer-watch"
// section): cross-replica propagation on etcd and on DynamoDB (a local
// dynalite), each with and without peer-watch, at 100 changes/s and the
// default batch interval; and the disruption battery at full length on
// DynamoDB, poll-only and with peer-watch, and on etcd with peer-watch.
const ScenarioPeerWatch = "peer-watch"

const (
	peerBeginMark = "<!-- bench:peer-watch:begin -->"
	peerEndMark   = "<!-- bench:peer-watch:end -->"
)

// peerGoal is the goal for cross-replica propagation with
// peer-watch at the default batch interval.
const peerGoal = 50 * time.Millisecond

// CrossReplicaConfig is one cross-replica propagation run.
type CrossReplicaConfig struct {
	Backend   string // server.BackendEtcd, server.BackendDynamoDB or server.BackendKubernetes
	PeerWatch bool
	Changes   int           // registrations timed
	Rate      int           // registrations per second, open loop
	Endpoint  string        // DynamoDB: the server's URL
	Batch     time.Duration // --write-batch-interval; 0: the CLI's default for the backend and peer-watch
	KubeBin   string        // kubernetes: the directory holding kube-apiserver; empty: kubeapiserver.Dir()
}

// CrossReplicaResult is a cross-replica propagation run: from a
// RegisterEndpoint call on A to the event on a watcher of B.
type CrossReplicaResult struct {
	Backend       string    `json:"backend"`
	PeerWatch     bool      `json:"peer_watch"`
	SyncMode      string    `json:"sync_mode"`
	SyncInterval  string    `json:"sync_interval"`
	BatchInterval string    `json:"write_batch_interval"`
	RatePerSec    float64   `json:"rate_per_sec"`
	Cross         Latencies `json:"cross_replica"`
}

// PeerWatchResult is the peer-watch scenario.
type PeerWatchResult struct {
	Propagation []CrossReplicaResult `json:"propagation"`
	Battery     []disruption.Result  `json:"battery"`
	// Load is the machine's 1-minute load average at the start and the
	// end of the scenario: on a shared machine, what the tails depend on.
	Load [2]float64 `json:"load"`
}

// pair is two registrars, A and B, on one store (an embedded etcd, a
// fresh table at a DynamoDB endpoint, or a kube-apiserver on an embedded
// etcd).
type pair struct {
	dir  string
	etcd *embedetcd.Server
	kapi *kubeapiserver.Server // kubernetes: the API server, on etcd
	regs []*server.Server
}

func startPair(ctx context.Context, cfg CrossReplicaConfig) (_ *pair, err error) {
	p := &pair{}
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	quiet := slog.New(slog.DiscardHandler)
	if cfg.Batch == 0 {
		cfg.Batch = server.DefaultWriteBatchInterval(cfg.Backend, cfg.PeerWatch)
	}
	base := server.Config{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Options: registrar.Options{ClusterName: "c1", Region: "r1", PeerWatch: cfg.PeerWatch, WriteBatchInterval: cfg.Batch, Logger: quiet},
	}
	switch cfg.Backend {
	case server.BackendDynamoDB:
		dc := dynamostore.Config{Table: fmt.Sprintf("aether-bench-%d", time.Now().UnixNano()), Region: "us-east-1", Endpoint: cfg.Endpoint}
		cli, err := dynamostore.NewClient(ctx, dc)
		if err != nil {
			return nil, err
		}
		if err := dynamostore.CreateTable(ctx, cli, dc.Table, dynamostore.DefaultShards); err != nil {
			return nil, err
		}
		base.Backend, base.DynamoDBTable, base.DynamoDBRegion, base.DynamoDBEndpoint = server.BackendDynamoDB, dc.Table, dc.Region, dc.Endpoint
	case server.BackendKubernetes:
		if err := p.startKube(ctx, &base, cfg.KubeBin); err != nil {
			return nil, err
		}
	default:
		if p.dir, err = os.MkdirTemp("", "aether-bench-"); err != nil {
			return nil, err
		}
		p.etcd, err = embedetcd.Start(ctx, embedetcd.Config{Dir: filepath.Join(p.dir, "etcd"), ClientAddr: "127.0.0.1:0", PeerAddr: "127.0.0.1:0", Logger: quiet})
		if err != nil {
			return nil, err
		}
		base.EtcdEndpoints = p.etcd.Endpoints()
	}
	for i := range 2 {
		s, err := server.Start(ctx, base)
		if err != nil {
			return nil, fmt.Errorf("starting registrar %d: %w", i, err)
		}
		p.regs = append(p.regs, s)
	}
	return p, nil
}

func (p *pair) close() {
	for _, s := range p.regs {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_ = s.Close(ctx)
		cancel()
	}
	if p.kapi != nil { // before its etcd
		p.kapi.Stop()
	}
	if p.etcd != nil {
		p.etcd.Close()
	}
	if p.dir != "" {
		os.RemoveAll(p.dir)
	}
}

// peersConnected waits until B receives A's peer stream.
func peersConnected(ctx context.Context, s *server.Server) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		for _, ps := range s.Registrar().Peers() {
			if ps.Connected {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("B's peer-watch stream from A did not connect: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond): // polling the condition, with the deadline above
		}
	}
}

// CrossReplica registers cfg.Changes endpoints through A at cfg.Rate per
// second (open loop: a ticker, not a pause after each call) and times each
// from just before its RegisterEndpoint call until B's watcher has it.
func CrossReplica(ctx context.Context, cfg CrossReplicaConfig) (CrossReplicaResult, error) {
	p, err := startPair(ctx, cfg)
	if err != nil {
		return CrossReplicaResult{}, err
	}
	defer p.close()
	return p.crossReplica(ctx, cfg)
}

// crossReplica is CrossReplica's measurement on a running pair (which may
// already hold other services' endpoints: the kubernetes scenario loads
// it first).
func (p *pair) crossReplica(ctx context.Context, cfg CrossReplicaConfig) (CrossReplicaResult, error) {
	a, b := p.regs[0], p.regs[1]
	if cfg.PeerWatch {
		if err := peersConnected(ctx, b); err != nil {
			return CrossReplicaResult{}, err
		}
	}
	ca, err := dialRegistrar(a.GRPCAddr())
	if err != nil {
		return CrossReplicaResult{}, err
	}
	defer ca.Close()
	cb, err := dialRegistrar(b.GRPCAddr())
	if err != nil {
		return CrossReplicaResult{}, err
	}
	defer cb.Close()

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := registrarv1.NewRegistrarClient(cb).WatchEndpoints(wctx, &registrarv1.WatchEndpointsRequest{Services: []string{"bench"}})
	if err != nil {
		return CrossReplicaResult{}, err
	}
	if _, err := st.Recv(); err != nil { // the (empty) snapshot
		return CrossReplicaResult{}, err
	}
	var mu sync.Mutex
	sent := make(map[string]time.Time, cfg.Changes)
	var lat []time.Duration
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			ev, err := st.Recv()
			if err != nil {
				return
			}
			now := time.Now()
			if ev.Type != registrarv1.EndpointEvent_ENDPOINT_ADDED {
				continue
			}
			mu.Lock()
			if t0, ok := sent[ev.Endpoint.Ip]; ok {
				lat = append(lat, now.Sub(t0))
				delete(sent, ev.Endpoint.Ip)
			}
			mu.Unlock()
		}
	}()
	reg := registrarv1.NewRegistrarClient(ca)
	tick := time.NewTicker(time.Second / time.Duration(cfg.Rate))
	defer tick.Stop()
	start := time.Now()
	for i := range cfg.Changes {
		select {
		case <-ctx.Done():
			return CrossReplicaResult{}, ctx.Err()
		case <-tick.C:
		}
		ip := benchIP(i)
		mu.Lock()
		sent[ip] = time.Now()
		mu.Unlock()
		if _, err := reg.RegisterEndpoint(ctx, &registrarv1.RegisterEndpointRequest{Endpoint: &registryv1.ServiceEndpoint{
			Service: "bench", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: ip,
			Ports: []*registryv1.Port{{Name: "http", Port: 8080}},
		}}); err != nil {
			return CrossReplicaResult{}, fmt.Errorf("register %s: %w", ip, err)
		}
	}
	elapsed := time.Since(start)
	deadline := time.Now().Add(60 * time.Second)
	for {
		mu.Lock()
		n := len(lat)
		mu.Unlock()
		if n == cfg.Changes {
			break
		}
		if time.Now().After(deadline) {
			mu.Lock()
			var missing []string
			for ip := range sent {
				missing = append(missing, ip)
			}
			mu.Unlock()
			sort.Strings(missing)
			return CrossReplicaResult{}, fmt.Errorf("B's watcher saw %d of %d registrations within a minute; missing %v", n, cfg.Changes, missing[:min(len(missing), 10)])
		}
		time.Sleep(10 * time.Millisecond) // polling the condition, with the deadline above
	}
	cancel()
	wg.Wait()
	o := b.Registrar().Options()
	return CrossReplicaResult{
		Backend: cfg.Backend, PeerWatch: cfg.PeerWatch, SyncMode: o.SyncMode, SyncInterval: o.SyncInterval.String(),
		BatchInterval: a.Registrar().Options().WriteBatchInterval.String(),
		RatePerSec:    float64(cfg.Changes) / elapsed.Seconds(),
		Cross:         summarize(lat),
	}, nil
}

// peerWatchPreflight checks, before any scenario runs, what the
// peer-watch scenario needs beyond this binary, so that a run of every
// scenario does not fail at its end: dynalite. (Credentials it does not
// need: for a loopback endpoint the registrars' client signs with
// placeholder ones when the AWS SDK's chain has none.)
func peerWatchPreflight() error {
	if _, err := dynalite.Path(); err != nil {
		return fmt.Errorf("scenario %s: %w", ScenarioPeerWatch, err)
	}
	return nil
}

// localDynamo starts a dynalite for the scenario.
func localDynamo() (*dynalite.Server, error) {
	if err := peerWatchPreflight(); err != nil {
		return nil, err
	}
	return dynalite.Start()
}

// peerWatchBattery is the battery's full length as the disruption
// scenario runs it, or its quick form.
func peerWatchBattery(quick bool) disruption.Config { return disruptionConfig(quick) }

// PeerWatch runs the scenario: propagation on both backends with and
// without peer-watch, then the battery runs.
func PeerWatch(ctx context.Context, quick bool, w io.Writer) (out PeerWatchResult, err error) {
	out.Load[0] = loadAvg()
	defer func() { out.Load[1] = loadAvg() }()
	dl, err := localDynamo()
	if err != nil {
		return out, err
	}
	defer dl.Stop()
	changes := 3000 // 30 s at 100/s
	if quick {
		changes = 300
	}
	for _, run := range []struct {
		backend string
		pw      bool
		batch   time.Duration // 0: the default for the backend and peer-watch
	}{
		{server.BackendEtcd, false, 100 * time.Millisecond}, // the default before peer-watch, for comparison
		{server.BackendEtcd, false, 0},
		{server.BackendEtcd, true, 0},
		{server.BackendDynamoDB, false, 0},
		{server.BackendDynamoDB, true, 0},
	} {
		cfg := CrossReplicaConfig{Backend: run.backend, PeerWatch: run.pw, Changes: changes, Rate: 100, Batch: run.batch}
		if run.backend == server.BackendDynamoDB {
			cfg.Endpoint = dl.Endpoint
		}
		fmt.Fprintf(w, "peer-watch: cross-replica propagation on %s, peer-watch %v, %d registrations at 100/s...\n", run.backend, run.pw, changes)
		res, err := CrossReplica(ctx, cfg)
		if err != nil {
			return out, fmt.Errorf("propagation on %s (peer-watch %v): %w", run.backend, run.pw, err)
		}
		fmt.Fprintf(w, "  --write-batch-interval %s: %s\n", res.BatchInterval, res.Cross)
		out.Propagation = append(out.Propagation, res)
	}
	for _, run := range []struct {
		backend, mode string
		pw            bool
	}{
		{disruption.BackendDynamoDB, registrar.SyncPoll, false},
		{disruption.BackendDynamoDB, registrar.SyncPoll, true},
		{disruption.BackendEtcd, registrar.SyncWatch, true},
	} {
		c := peerWatchBattery(quick)
		c.Backend, c.SyncMode, c.PeerWatch = run.backend, run.mode, run.pw
		if run.backend == disruption.BackendDynamoDB {
			c.DynamoDBEndpoint = dl.Endpoint
		}
		c.Progress = indent{w}
		fmt.Fprintf(w, "peer-watch: disruption battery, %s...\n", c.Mode())
		res, err := disruption.Run(ctx, c)
		if err != nil {
			return out, fmt.Errorf("battery %s: %w", c.Mode(), err)
		}
		out.Battery = append(out.Battery, res)
	}
	return out, nil
}

func runPeerWatch(ctx context.Context, o Options, r *Report, w io.Writer) error {
	res, err := PeerWatch(ctx, o.Quick, w)
	if err != nil {
		return fmt.Errorf("peer-watch: %w", err)
	}
	r.PeerWatch = &res
	return nil
}

func (r Report) peerWatchMarkdown(b *strings.Builder) {
	pw := r.PeerWatch
	fmt.Fprintf(b, "### Peer-watch (last run %s)\n\n", r.Date)
	fmt.Fprintf(b, "- Machine: %s\n- Command: `%s`\n", r.Machine, r.Command)
	if pw.Load[0] > 0 {
		fmt.Fprintf(b, "- Load average (1 min) at start / end: %.1f / %.1f (a shared machine: the tails move with it)\n", pw.Load[0], pw.Load[1])
	}
	b.WriteString("\n**Cross-replica propagation.** Two registrar replicas, A and B, of one cluster on one store: an embedded etcd, or a fresh DynamoDB table on a local dynalite (npm 4.0.0, in memory; no network latency, so AWS adds its single-digit milliseconds per request to the DynamoDB rows without peer-watch). Registrations through A at 100/s (open loop; *rate* is what was achieved, a call that overruns its tick on a loaded machine skipping the next), each timed from just before its RegisterEndpoint call to the event on a watcher of B. Without peer-watch B learns of a write from the backend: on etcd after A's write-behind flush and etcd's watch, on DynamoDB at its next poll of the table (`--sync-interval`). With peer-watch A streams its acknowledged writes to B at once. Every run at the CLI's default `--write-batch-interval` for its backend and peer-watch (100 ms, or 10 ms on etcd without peer-watch), and once on etcd without peer-watch at 100 ms, the default before peer-watch.\n\n")
	b.WriteString("| backend | sync | peer-watch | --write-batch-interval | rate | n | p50 | p99 | max | goal (p99 ≤ 50 ms with peer-watch) |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, p := range pw.Propagation {
		goal := "—"
		if p.PeerWatch {
			goal = "met"
			if p.Cross.P99 > ms(peerGoal) {
				goal = "**missed**"
			}
		}
		on := "off"
		if p.PeerWatch {
			on = "on"
		}
		fmt.Fprintf(b, "| %s | %s (every %s) | %s | %s | %.0f/s | %d | %.2f ms | %.2f ms | %.2f ms | %s |\n",
			p.Backend, p.SyncMode, p.SyncInterval, on, p.BatchInterval, p.RatePerSec, p.Cross.N, p.Cross.P50, p.Cross.P99, p.Cross.Max, goal)
	}
	if len(pw.Battery) == 0 {
		return
	}
	c := pw.Battery[0].Config
	fmt.Fprintf(b, "\n**Disruption battery with peer-watch.** The battery of the \"Disruption battery\" section (same phases and sizes: %d clients × %d resolvers at %d/s, %d pods per service, drain period %v), on DynamoDB poll-only and with peer-watch, and on etcd (watch sync) with peer-watch.\n\n",
		c.Clients, c.ResolversPerClient, c.ResolveRate, c.EndpointsPerService, c.DrainPeriod)
	b.WriteString("| run | --sync-interval | resolutions | drops (in-window) | drain reached every client: p50 / max | battery |\n|---|---|---|---|---|---|\n")
	for _, run := range pw.Battery {
		drops := fmt.Sprintf("**%d**", run.Drops)
		if run.Drops > 0 {
			drops += fmt.Sprintf(" (dead picks %d, none found %d) — %s", run.DeadPicks, run.NoneFound, run.Where())
		}
		fmt.Fprintf(b, "| %s | %v | %d | %s | %s / %s | %.0f s |\n", run.Config.Mode(), run.Config.SyncInterval, run.Resolutions, drops,
			roundDur(run.DrainPropagation.P50), roundDur(run.DrainPropagation.Max), run.Duration.Seconds())
	}
	b.WriteString("\n**Reading.** ")
	for _, p := range pw.Propagation {
		if p.PeerWatch {
			verdict := "meets"
			if p.Cross.P99 > ms(peerGoal) {
				verdict = "misses"
			}
			fmt.Fprintf(b, "On %s with peer-watch, cross-replica p99 is %.1f ms at the default batch interval: it %s the goal of %v. ", p.Backend, p.Cross.P99, verdict, peerGoal)
		}
	}
	for _, run := range pw.Battery {
		fmt.Fprintf(b, "%s: %d drops, the slowest drain at every client after %s. ", run.Config.Mode(), run.Drops, roundDur(run.DrainPropagation.Max))
	}
	b.WriteString("Without peer-watch a replica on DynamoDB learns of another's drain only at its next poll, after up to `--sync-interval`, so its clients hand out the drained pod for the rest of that time; with it, the drain arrives over the peer stream within milliseconds, and the poll only confirms it. These runs are why `--peer-watch` is on by default (docs/operations.md, \"Peer-watch and the batch interval\").\n")
}

// dialRegistrar is a plaintext connection to a registrar.
func dialRegistrar(addr string) (*grpc.ClientConn, error) {
	return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
}
