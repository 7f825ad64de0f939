package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/aethermesh/aether/internal/faultproxy"
)

// ScenarioEdgePartition: seed 004's partition experiment. Three members
// over 10 ms links, a fixed-rate YCSB-A-shaped load at one of them, that
// member cut off from the other two for five seconds; aether edge and a
// real etcd under the same schedule (the "Edge store: serving through a
// partition" section).
const ScenarioEdgePartition = "edge-partition"

const (
	edgePartBeginMark = "<!-- bench:edge-partition:begin -->"
	edgePartEndMark   = "<!-- bench:edge-partition:end -->"
)

// EdgePartitionConfig sizes the scenario.
type EdgePartitionConfig struct {
	Members  int
	Latency  time.Duration // added each way on every member-to-member link
	Rate     int           // operations per second offered, half reads, half updates
	Records  int           // keys loaded before the load, and the keyspace it draws from
	Duration time.Duration // of the load
	CutAt    time.Duration // offset into the load at which the local member is cut off
	HealAt   time.Duration
	// Timeout is each request's client-side deadline: etcdctl's default
	// --command-timeout, so a request etcd cannot serve shows as what an
	// operator's client sees.
	Timeout   time.Duration
	AetherBin string
}

// PartitionSecond is one second of the load on one server, by completion
// time: what the client saw served in that second.
type PartitionSecond struct {
	Second  int     `json:"second"`
	Offered int     `json:"offered"` // issued in this second
	Served  int     `json:"served"`  // completed successfully in this second
	Errors  int     `json:"errors"`  // failed in this second
	P50     float64 `json:"p50_ms"`  // of the requests served in this second
	P99     float64 `json:"p99_ms"`
}

// PartitionPhase is the requests issued before, during or after the cut.
type PartitionPhase struct {
	Name   string `json:"name"`
	Issued int    `json:"issued"`
	Served int    `json:"served"`
	// ServedWhileCut counts requests of this phase that completed
	// successfully while the local member was cut off.
	ServedWhileCut int            `json:"served_while_cut"`
	Errors         map[string]int `json:"errors,omitempty"` // by kind
	P50            float64        `json:"p50_ms"`
	P99            float64        `json:"p99_ms"`
	Max            float64        `json:"max_ms"`
}

// PartitionRun is one server's run.
type PartitionRun struct {
	Server  string            `json:"server"`
	Local   string            `json:"local_member"`
	CutAt   float64           `json:"cut_at_s"` // when the cut was in place, from the load's start
	HealAt  float64           `json:"heal_at_s"`
	Seconds []PartitionSecond `json:"seconds"`
	Phases  []PartitionPhase  `json:"phases"`
	Late    int               `json:"completed_after_end"` // requests that returned after the load's end
	Check   PartitionCheck    `json:"check"`
}

// PartitionCheck is the harness's own proof that the cut was real in both
// directions, and how long each side took to see the other's writes once
// healed.
type PartitionCheck struct {
	FarWrites int `json:"far_writes"` // of farWriteCount puts at a far member while cut, acknowledged
	// NewLeaderMs is how long after the cut the far member named a leader
	// other than the local member (etcd); 0 where there is no leader.
	NewLeaderMs float64 `json:"far_new_leader_ms"`
	// NearWrite is what the local member answered to one put while cut:
	// "ok", or the error.
	NearWrite string `json:"near_write"`
	// LocalSawFarMs and FarSawNearMs are from the heal until the marker
	// written on the other side was readable (serializable, from that
	// member alone); -1: not measured (the write was refused).
	LocalSawFarMs float64 `json:"local_saw_far_ms"`
	FarSawNearMs  float64 `json:"far_saw_near_ms"`
}

// partitionSchedule cuts and heals at the configured offsets, and proves
// the cut: writes on each side while cut must be invisible on the other
// until the heal.
type partitionSchedule struct {
	cutAt, healAt time.Duration // when the cut and the heal were in place
	check         PartitionCheck
}

const (
	farWriteCount = 100
	farMarker     = "partition/far"
	nearMarker    = "partition/near"
)

func (s *partitionSchedule) run(ctx context.Context, cfg EdgePartitionConfig, c *nsCluster, local int, start time.Time, near, far *clientv3.Client) error {
	oldLeader, err := leaderID(ctx, near)
	if err != nil {
		return err
	}
	// aether edge calls each replica its own leader: a leader only counts
	// if the far member follows it.
	if farLeader, err := leaderOf(ctx, far); err != nil {
		return err
	} else if farLeader != oldLeader {
		oldLeader = 0
	}
	if !sleepCtx(ctx, time.Until(start.Add(cfg.CutAt))) {
		return ctx.Err()
	}
	if err := c.cut(ctx, local); err != nil {
		return err
	}
	s.cutAt = time.Since(start)
	s.check.LocalSawFarMs, s.check.FarSawNearMs = -1, -1
	// The checks must not move the heal: each gets until just before it.
	checkBy := start.Add(cfg.HealAt - 100*time.Millisecond)
	cctx, cancel := context.WithDeadline(ctx, checkBy)
	defer cancel()
	// The near side: aether edge takes it; etcd's minority cannot.
	nearDone := make(chan struct{})
	go func() {
		defer close(nearDone)
		wctx, cancel := context.WithTimeout(cctx, time.Second)
		defer cancel()
		s.check.NearWrite = "ok"
		if _, err := near.Put(wctx, nearMarker, "v"); err != nil {
			s.check.NearWrite = errKind(err)
		}
	}()
	// The far side: etcd's majority once it has elected a leader of its
	// own (a proposal forwarded to the old one is lost and waits out its
	// deadline), any edge replica at once.
	farOK := false
	if d, err := untilNewLeader(cctx, far, oldLeader, time.Now()); err == nil {
		s.check.NewLeaderMs = ms(d)
		farOK = s.farWrites(cctx, far) == nil
	} else {
		s.check.NewLeaderMs = -1
	}
	<-nearDone
	if !sleepCtx(ctx, time.Until(checkBy)) {
		return ctx.Err()
	}
	// Just before the heal: neither side may see the other's write.
	if farOK {
		if has, err := hasKey(ctx, near, farMarker); err != nil || has {
			return fmt.Errorf("the cut is not real: the local member sees %s written at the far one while cut (%v)", farMarker, err)
		}
	}
	if s.check.NearWrite == "ok" {
		if has, err := hasKey(ctx, far, nearMarker); err != nil || has {
			return fmt.Errorf("the cut is not real: the far member sees %s written at the local one while cut (%v)", nearMarker, err)
		}
	}
	if !sleepCtx(ctx, time.Until(start.Add(cfg.HealAt))) {
		return ctx.Err()
	}
	if err := c.heal(ctx, local); err != nil {
		return err
	}
	s.healAt = time.Since(start)
	healed := time.Now()
	if farOK {
		d, err := untilKey(ctx, near, farMarker, healed)
		if err != nil {
			return fmt.Errorf("after the heal, the local member: %w", err)
		}
		s.check.LocalSawFarMs = ms(d)
	}
	if s.check.NearWrite == "ok" {
		d, err := untilKey(ctx, far, nearMarker, healed)
		if err != nil {
			return fmt.Errorf("after the heal, the far member: %w", err)
		}
		s.check.FarSawNearMs = ms(d)
	}
	return nil
}

// farWrites puts FarWrites keys at the far member, then its marker; the
// count is of those acknowledged.
func (s *partitionSchedule) farWrites(ctx context.Context, far *clientv3.Client) error {
	var (
		wg sync.WaitGroup
		mu sync.Mutex
		n  int
	)
	for i := range farWriteCount {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := far.Put(ctx, fmt.Sprintf("partition/far/%03d", i), "v"); err == nil {
				mu.Lock()
				n++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	s.check.FarWrites = n
	_, err := far.Put(ctx, farMarker, "v")
	return err
}

// hasKey reads key from the client's member alone (serializable: a
// member cut off from etcd's leader still answers from its own state).
func hasKey(ctx context.Context, cli *clientv3.Client, key string) (bool, error) {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	resp, err := cli.Get(rctx, key, clientv3.WithSerializable())
	if err != nil {
		return false, err
	}
	return len(resp.Kvs) > 0, nil
}

// untilKey polls the client's member every 10 ms until it holds key, and
// returns how long after since that was.
func untilKey(ctx context.Context, cli *clientv3.Client, key string, since time.Time) (time.Duration, error) {
	deadline := since.Add(30 * time.Second)
	for {
		has, err := hasKey(ctx, cli, key)
		if err == nil && has {
			return time.Since(since), nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("%s not readable 30 s after the heal (last error %v)", key, err)
		}
		if !sleepCtx(ctx, 10*time.Millisecond) {
			return 0, ctx.Err()
		}
	}
}

// EdgePartitionResult is the scenario's figures.
type EdgePartitionResult struct {
	Members       int            `json:"members"`
	LatencyMs     float64        `json:"link_latency_ms_each_way"`
	Rate          int            `json:"rate"`
	Records       int            `json:"records"`
	Seconds       float64        `json:"seconds"`
	CutAt         float64        `json:"cut_at_s"`
	HealAt        float64        `json:"heal_at_s"`
	TimeoutSec    float64        `json:"timeout_s"`
	EtcdVersion   string         `json:"etcd_version"`
	Runs          []PartitionRun `json:"runs"`
	LoadAvgBefore float64        `json:"loadavg_before"`
	LoadAvgAfter  float64        `json:"loadavg_after"`
}

func runEdgePartition(ctx context.Context, o Options, r *Report, w io.Writer) error {
	cfg := EdgePartitionConfig{Members: 3, Latency: 10 * time.Millisecond, Rate: 500, Records: 1000,
		Duration: 15 * time.Second, CutAt: 5 * time.Second, HealAt: 10 * time.Second, Timeout: 5 * time.Second, AetherBin: o.AetherBin}
	if o.Quick {
		cfg.Rate, cfg.Duration, cfg.CutAt, cfg.HealAt = 200, 7*time.Second, 2*time.Second, 5*time.Second
	}
	if err := netnsPreflight(); err != nil {
		if o.Quick {
			// CI's quick run of every scenario must not fail where the
			// harness cannot build namespaces; the full run must say so.
			fmt.Fprintf(w, "edge-partition: SKIPPED: %v\n", err)
			return nil
		}
		return fmt.Errorf("edge-partition: %w", err)
	}
	fmt.Fprintf(w, "edge-partition: %d ops/s (YCSB A) at one of %d members, %v each way on every link, cut %v-%v of %v, etcd and aether edge...\n",
		cfg.Rate, cfg.Members, cfg.Latency, cfg.CutAt, cfg.HealAt, cfg.Duration)
	res, err := EdgePartition(ctx, cfg, w)
	if err != nil {
		return fmt.Errorf("edge-partition: %w", err)
	}
	r.EdgePartition = &res
	return nil
}

// netnsPreflight says why this process cannot build network namespaces.
func netnsPreflight() error {
	if uid := os.Getuid(); uid != 0 {
		return fmt.Errorf("needs root to put each member in its own network namespace (ip netns) and cut its link; running as uid %d: run the benchmark as root", uid)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return fmt.Errorf("needs iproute2's ip to build network namespaces: %w (apt-get install iproute2)", err)
	}
	return nil
}

// EdgePartition runs etcd, then aether edge, under the same schedule.
func EdgePartition(ctx context.Context, cfg EdgePartitionConfig, w io.Writer) (EdgePartitionResult, error) {
	res := EdgePartitionResult{Members: cfg.Members, LatencyMs: ms(cfg.Latency), Rate: cfg.Rate, Records: cfg.Records,
		Seconds: cfg.Duration.Seconds(), CutAt: cfg.CutAt.Seconds(), HealAt: cfg.HealAt.Seconds(), TimeoutSec: cfg.Timeout.Seconds()}
	etcd, err := etcdBinary(ctx)
	if err != nil {
		return res, err
	}
	aether, err := aetherBinary(ctx, cfg.AetherBin)
	if err != nil {
		return res, err
	}
	res.EtcdVersion = binaryVersion(ctx, etcd)
	res.LoadAvgBefore = loadAvg()
	for _, srv := range []struct {
		name string
		bin  string
		pre  []string
	}{{"etcd", etcd, nil}, {"aether edge", aether, []string{"edge"}}} {
		run, err := edgePartitionOne(ctx, cfg, srv.name, srv.bin, srv.pre)
		if err != nil {
			return res, fmt.Errorf("%s: %w", srv.name, err)
		}
		for _, ph := range run.Phases {
			fmt.Fprintf(w, "  %-11s %-6s %s\n", srv.name, ph.Name, ph)
		}
		res.Runs = append(res.Runs, run)
	}
	res.LoadAvgAfter = loadAvg()
	return res, nil
}

func (p PartitionPhase) String() string {
	s := fmt.Sprintf("%5d issued, %5d served (%d while cut), p50 %.2f ms, p99 %.2f ms", p.Issued, p.Served, p.ServedWhileCut, p.P50, p.P99)
	if e := p.errorSummary(); e != "" {
		s += ", errors: " + e
	}
	return s
}

func (p PartitionPhase) errorSummary() string {
	var kinds []string
	for k := range p.Errors {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	var parts []string
	for _, k := range kinds {
		parts = append(parts, fmt.Sprintf("%d %s", p.Errors[k], k))
	}
	return strings.Join(parts, "; ")
}

// nsCluster is members each in its own network namespace. Each namespace
// has two links to the harness's namespace: a peer link on a bridge, which
// carries all member-to-member traffic (through the harness's latency
// proxies on the bridge address), and a client link of its own. Cutting a
// member is taking its bridge port down: nothing crosses in either
// direction, whichever side dialled, while its client link stays up.
type nsCluster struct {
	id      string
	net     int // second octet of the 10.x.0.0/16 the cluster uses
	members int
	procs   []*proc
	proxies []*faultproxy.Proxy
	clients []string
	dir     string
}

func (c *nsCluster) ns(i int) string       { return fmt.Sprintf("aether-bench-%s-m%d", c.id, i) }
func (c *nsCluster) bridge() string        { return "ab" + c.id + "br" }
func (c *nsCluster) peerLink(i int) string { return fmt.Sprintf("ab%sp%d", c.id, i) }
func (c *nsCluster) clientLink(i int) string {
	return fmt.Sprintf("ab%sc%d", c.id, i)
}
func (c *nsCluster) bridgeIP() string      { return fmt.Sprintf("10.%d.0.1", c.net) }
func (c *nsCluster) memberIP(i int) string { return fmt.Sprintf("10.%d.0.%d", c.net, 11+i) }

func ipCmd(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// freeNet picks a 10.x.0.0/16 no interface here uses.
func freeNet() (int, error) {
	out, err := exec.Command("ip", "-o", "addr").Output()
	if err != nil {
		return 0, fmt.Errorf("ip -o addr: %w", err)
	}
	for range 50 {
		n := 200 + rand.IntN(50)
		if !strings.Contains(string(out), fmt.Sprintf(" 10.%d.", n)) {
			return n, nil
		}
	}
	return 0, errors.New("no free 10.x.0.0/16 between 10.200 and 10.249")
}

func (c *nsCluster) setup(ctx context.Context) error {
	steps := [][]string{
		{"link", "add", c.bridge(), "type", "bridge"},
		{"addr", "add", c.bridgeIP() + "/24", "dev", c.bridge()},
		{"link", "set", c.bridge(), "up"},
	}
	for i := range c.members {
		ns := c.ns(i)
		steps = append(steps,
			[]string{"netns", "add", ns},
			[]string{"-n", ns, "link", "set", "lo", "up"},
			[]string{"link", "add", c.peerLink(i), "type", "veth", "peer", "name", "eth0", "netns", ns},
			[]string{"link", "set", c.peerLink(i), "master", c.bridge(), "up"},
			[]string{"-n", ns, "addr", "add", c.memberIP(i) + "/24", "dev", "eth0"},
			[]string{"-n", ns, "link", "set", "eth0", "up"},
			[]string{"link", "add", c.clientLink(i), "type", "veth", "peer", "name", "cl0", "netns", ns},
			[]string{"addr", "add", fmt.Sprintf("10.%d.%d.1/30", c.net, 1+i), "dev", c.clientLink(i)},
			[]string{"link", "set", c.clientLink(i), "up"},
			[]string{"-n", ns, "addr", "add", fmt.Sprintf("10.%d.%d.2/30", c.net, 1+i), "dev", "cl0"},
			[]string{"-n", ns, "link", "set", "cl0", "up"},
		)
	}
	for _, s := range steps {
		if err := ipCmd(ctx, s...); err != nil {
			return err
		}
	}
	return nil
}

// teardown removes what setup made; deleting a namespace deletes its veth
// ends, and so their peers.
func (c *nsCluster) teardown() {
	for _, p := range c.procs {
		p.stop(10 * time.Second)
	}
	for _, p := range c.proxies {
		_ = p.Close()
	}
	ctx := context.Background()
	for i := range c.members {
		_ = ipCmd(ctx, "netns", "del", c.ns(i))
	}
	_ = ipCmd(ctx, "link", "del", c.bridge())
	os.RemoveAll(c.dir)
}

// cut takes member i's bridge port down; heal brings it back.
func (c *nsCluster) cut(ctx context.Context, i int) error {
	return ipCmd(ctx, "link", "set", c.peerLink(i), "down")
}

func (c *nsCluster) heal(ctx context.Context, i int) error {
	return ipCmd(ctx, "link", "set", c.peerLink(i), "up")
}

func startNSCluster(ctx context.Context, name, bin string, pre []string, n int, latency time.Duration) (_ *nsCluster, err error) {
	dir, err := os.MkdirTemp("", "aether-bench-part-")
	if err != nil {
		return nil, err
	}
	net, err := freeNet()
	if err != nil {
		return nil, err
	}
	c := &nsCluster{id: fmt.Sprintf("%04x", rand.IntN(1<<16)), net: net, members: n, dir: dir}
	defer func() {
		if err != nil {
			c.teardown()
		}
	}()
	if err := c.setup(ctx); err != nil {
		return nil, err
	}
	var initial []string
	for i := range n {
		p, err := faultproxy.StartOn(c.bridgeIP()+":0", c.memberIP(i)+":2380")
		if err != nil {
			return nil, err
		}
		p.SetLatency(latency)
		c.proxies = append(c.proxies, p)
		initial = append(initial, fmt.Sprintf("m%d=http://%s", i, p.Addr()))
		c.clients = append(c.clients, fmt.Sprintf("http://10.%d.%d.2:2379", c.net, 1+i))
	}
	for i := range n {
		// Each member is known to the others at its proxy on the bridge,
		// so every byte between two members crosses one proxy and one
		// bridge port of each.
		args := append([]string{"netns", "exec", c.ns(i), bin}, pre...)
		args = append(args,
			"--name", fmt.Sprintf("m%d", i), "--data-dir", filepath.Join(dir, fmt.Sprintf("m%d", i)),
			"--listen-client-urls", c.clients[i], "--advertise-client-urls", c.clients[i],
			"--listen-peer-urls", "http://"+c.memberIP(i)+":2380",
			"--initial-advertise-peer-urls", "http://"+c.proxies[i].Addr(),
			"--initial-cluster", strings.Join(initial, ","),
			"--initial-cluster-state", "new", "--log-level", "warn")
		p, err := startProc(fmt.Sprintf("%s m%d", name, i), "", "ip", args...)
		if err != nil {
			return nil, err
		}
		c.procs = append(c.procs, p)
	}
	for i, p := range c.procs {
		if err := p.waitUntil(ctx, 60*time.Second, func() error { return httpOK(c.clients[i] + "/health") }); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// partOp is one request's outcome, in offsets from the load's start.
type partOp struct {
	start, end time.Duration
	err        string // empty: served
}

func edgePartitionOne(ctx context.Context, cfg EdgePartitionConfig, name, bin string, pre []string) (PartitionRun, error) {
	run := PartitionRun{Server: name}
	c, err := startNSCluster(ctx, name, bin, pre, cfg.Members, cfg.Latency)
	if err != nil {
		return run, err
	}
	defer c.teardown()
	// The client's local member: etcd's leader, as in seed 004 (its best
	// case until the cut); any aether edge replica.
	target, err := scaleTarget(ctx, c.clients)
	if err != nil {
		return run, err
	}
	local := slices.Index(c.clients, target)
	run.Local = fmt.Sprintf("m%d", local)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{target}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return run, err
	}
	defer cli.Close()
	if err := loadRecords(ctx, cli, cfg.Records); err != nil {
		return run, err
	}

	var (
		mu  sync.Mutex
		ops []partOp
		wg  sync.WaitGroup
	)
	value := strings.Repeat("v", 32)
	far := (local + 1) % len(c.clients)
	farCli, err := clientv3.New(clientv3.Config{Endpoints: []string{c.clients[far]}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return run, err
	}
	defer farCli.Close()
	// The load starts on a quiet cluster: aether edge replicates the
	// loaded records after acknowledging them.
	if _, err := untilKey(ctx, farCli, ycsbKey(cfg.Records-1), time.Now()); err != nil {
		return run, fmt.Errorf("the far member after loading: %w", err)
	}
	start := time.Now()
	cutErr := make(chan error, 1)
	var sched partitionSchedule
	go func() {
		defer close(cutErr)
		if err := sched.run(ctx, cfg, c, local, start, cli, farCli); err != nil {
			cutErr <- err
		}
	}()
	// Open loop: one request due every 1/Rate, each in its own goroutine,
	// so requests a partitioned member holds pile up as they would at a
	// real site instead of slowing the client down.
	interval := time.Second / time.Duration(max(cfg.Rate, 1))
	// Request k is due at start+k*interval; one the harness issues late
	// (a starved CPU) goes out at once, so the offered rate holds.
	for k := 0; ; k++ {
		due := start.Add(time.Duration(k) * interval)
		if due.Sub(start) >= cfg.Duration || !sleepCtx(ctx, time.Until(due)) {
			break
		}
		wg.Add(1)
		go func(read bool, key string) {
			defer wg.Done()
			rctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
			defer cancel()
			s := time.Now()
			var err error
			if read {
				_, err = cli.Get(rctx, key)
			} else {
				_, err = cli.Put(rctx, key, value)
			}
			op := partOp{start: s.Sub(start), end: time.Since(start)}
			if err != nil {
				op.err = errKind(err)
			}
			mu.Lock()
			ops = append(ops, op)
			mu.Unlock()
		}(rand.IntN(2) == 0, ycsbKey(rand.IntN(cfg.Records)))
	}
	wg.Wait()
	if err := <-cutErr; err != nil {
		return run, err
	}
	for _, p := range c.procs {
		if err := p.check(); err != nil {
			return run, err
		}
	}
	if ctx.Err() != nil {
		return run, ctx.Err()
	}
	run.CutAt, run.HealAt = sched.cutAt.Seconds(), sched.healAt.Seconds()
	run.Check = sched.check
	run.Seconds, run.Phases, run.Late = partitionFigures(ops, cfg.Duration, sched.cutAt, sched.healAt)
	return run, nil
}

// loadRecords puts every key once, a few at a time, before the load.
func loadRecords(ctx context.Context, cli *clientv3.Client, n int) error {
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	keys := make(chan int)
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range keys {
				cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				_, err := cli.Put(cctx, ycsbKey(k), strings.Repeat("v", 32))
				cancel()
				if err != nil {
					select {
					case errs <- fmt.Errorf("loading %s: %w", ycsbKey(k), err):
					default:
					}
				}
			}
		}()
	}
	for k := range n {
		keys <- k
	}
	close(keys)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

// sleepCtx waits d or until ctx ends, and reports whether d passed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// errKind names a failed request's error as the client saw it.
func errKind(err error) string {
	if errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded {
		return "client deadline exceeded"
	}
	st := status.Convert(err)
	msg := st.Message()
	if len(msg) > 60 {
		msg = msg[:60] + "..."
	}
	return fmt.Sprintf("%s: %s", st.Code(), msg)
}

// partitionFigures bins the operations per second of completion and per
// phase of issue.
func partitionFigures(ops []partOp, dur, cutAt, healAt time.Duration) ([]PartitionSecond, []PartitionPhase, int) {
	secs := make([]PartitionSecond, int(dur.Round(time.Second)/time.Second))
	lats := make([][]time.Duration, len(secs))
	for i := range secs {
		secs[i].Second = i
	}
	phases := []PartitionPhase{{Name: "before"}, {Name: "cut"}, {Name: "healed"}}
	plats := make([][]time.Duration, len(phases))
	late := 0
	for _, op := range ops {
		if s := int(op.start / time.Second); s < len(secs) {
			secs[s].Offered++
		}
		if s := int(op.end / time.Second); s < len(secs) {
			if op.err == "" {
				secs[s].Served++
				lats[s] = append(lats[s], op.end-op.start)
			} else {
				secs[s].Errors++
			}
		} else {
			late++
		}
		p := &phases[0]
		pi := 0
		switch {
		case op.start >= healAt:
			pi = 2
		case op.start >= cutAt:
			pi = 1
		}
		p = &phases[pi]
		p.Issued++
		if op.err != "" {
			if p.Errors == nil {
				p.Errors = map[string]int{}
			}
			p.Errors[op.err]++
			continue
		}
		p.Served++
		if op.end >= cutAt && op.end < healAt {
			p.ServedWhileCut++
		}
		plats[pi] = append(plats[pi], op.end-op.start)
	}
	for i := range secs {
		secs[i].P50, secs[i].P99, _ = quantiles(lats[i])
	}
	for i := range phases {
		phases[i].P50, phases[i].P99, phases[i].Max = quantiles(plats[i])
	}
	return secs, phases, late
}

func quantiles(ds []time.Duration) (p50, p99, mx float64) {
	if len(ds) == 0 {
		return 0, 0, 0
	}
	slices.Sort(ds)
	return ms(ds[len(ds)/2]), ms(ds[min(len(ds)-1, len(ds)*99/100)]), ms(ds[len(ds)-1])
}

func (r Report) edgePartitionMarkdown(b *strings.Builder) {
	e := r.EdgePartition
	fmt.Fprintf(b, "### Edge store: serving through a partition (last run %s)\n\n", r.Date)
	fmt.Fprintf(b, "- Machine: %s\n- Command: `%s`\n- etcd: %s, etcd's own main built from `tools/etcd`; aether edge: this binary\n\n", r.Machine, r.Command, e.EtcdVersion)
	fmt.Fprintf(b, "Seed 004's partition experiment. %d members, each a process in its own network namespace (`ip netns`) with two veth links to the harness: a client link of its own, and a port on a bridge that carries all member-to-member traffic, through a fault proxy per member on the bridge address that delays each byte %.0f ms each way (no netem in this kernel), so a round trip between two members costs %.0f ms more. "+
		"The load is YCSB workload A's shape from this harness's own Go client (clientv3, not go-ycsb, which cannot report per second or keep running through errors): %d operations per second, open loop (each request in its own goroutine, due every 1/%d s whatever earlier ones do), half linearizable `Get`s and half `Put`s of 32-byte values, uniform over %d 18-byte keys loaded beforehand, each with a %.0f s client deadline (etcdctl's default), all at one member: etcd's leader, as in the seed, and any aether edge replica. "+
		"At %.0f s that member's bridge port is taken down (`ip link set ... down`), which cuts it from the other two in both directions whichever side dialled, while its client link stays up; at %.0f s it comes back up; the load runs %.0f s.\n\n",
		e.Members, e.LatencyMs, 2*e.LatencyMs, e.Rate, e.Rate, e.Records, e.TimeoutSec, e.CutAt, e.HealAt, e.Seconds)
	if e.LoadAvgBefore > 0 {
		fmt.Fprintf(b, "The machine's 1-minute load average was %.2f before and %.2f after (%d cores).\n\n", e.LoadAvgBefore, e.LoadAvgAfter, runtime.NumCPU())
	}
	b.WriteString("**Per second**, by when requests returned: *served* succeeded in that second, *errors* failed in it (timeouts included), latency is of the served ones. *Offered* is requests issued in that second.\n\n")
	b.WriteString("| s | offered |")
	for _, run := range e.Runs {
		fmt.Fprintf(b, " %s served | errors | p50 | p99 |", run.Server)
	}
	b.WriteString("\n|---|---|")
	for range e.Runs {
		b.WriteString("---|---|---|---|")
	}
	b.WriteString("\n")
	if len(e.Runs) > 0 {
		for i := range e.Runs[0].Seconds {
			mark := ""
			if float64(i) >= e.CutAt && float64(i) < e.HealAt {
				mark = " (cut)"
			}
			fmt.Fprintf(b, "| %d%s | %d |", i, mark, e.Runs[0].Seconds[i].Offered)
			for _, run := range e.Runs {
				if i >= len(run.Seconds) {
					b.WriteString(" | | | |")
					continue
				}
				s := run.Seconds[i]
				fmt.Fprintf(b, " %d | %d | %.2f ms | %.2f ms |", s.Served, s.Errors, s.P50, s.P99)
			}
			b.WriteString("\n")
		}
	}
	b.WriteString("\n**Per phase**, by when requests were issued: before the cut, while cut, after the heal (*served while cut*: of those served, how many returned while the member was cut off).\n\n")
	b.WriteString("| server | local member | phase | issued | served | served while cut | p50 | p99 | max | errors |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, run := range e.Runs {
		for _, p := range run.Phases {
			errs := p.errorSummary()
			if errs == "" {
				errs = "none"
			}
			fmt.Fprintf(b, "| %s | %s | %s | %d | %d | %d | %.2f ms | %.2f ms | %.2f ms | %s |\n", run.Server, run.Local, p.Name, p.Issued, p.Served, p.ServedWhileCut, p.P50, p.P99, p.Max, errs)
		}
	}
	fmt.Fprintf(b, "\n**The cut, checked.** While cut, the harness puts one marker at the local member (1 s deadline) and, at one of the two far members, once that side has a leader (etcd: a proposal forwarded to the cut-off leader is lost and waits out its deadline), %d keys and then a marker, all by 0.1 s before the heal, which no check delays; then it reads each marker, serializable, from the member on the other side, and stops the run if either is visible (the cut would not be real). After the heal it polls each side every 10 ms until the other side's marker is readable there.\n\n", farWriteCount)
	b.WriteString("| server | cut in place | healed | far side's new leader | far puts acknowledged | put at the local member while cut | local member has the far marker | far member has the local marker | requests returned after the load ended |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, run := range e.Runs {
		ch := run.Check
		leader := "none needed"
		switch {
		case ch.NewLeaderMs < 0:
			leader = "none before the heal"
		case ch.NewLeaderMs > 0:
			leader = fmt.Sprintf("%.0f ms after the cut", ch.NewLeaderMs)
		}
		localSaw := "n/a (no far marker)"
		if ch.LocalSawFarMs >= 0 {
			localSaw = fmt.Sprintf("%.0f ms after the heal", ch.LocalSawFarMs)
		}
		farSaw := "n/a (refused)"
		if ch.FarSawNearMs >= 0 {
			farSaw = fmt.Sprintf("%.0f ms after the heal", ch.FarSawNearMs)
		}
		fmt.Fprintf(b, "| %s | %.2f s | %.2f s | %s | %d | %s | %s | %s | %d |\n", run.Server, run.CutAt, run.HealAt, leader, ch.FarWrites, ch.NearWrite, localSaw, farSaw, run.Late)
	}
	edge, etcd := e.run("aether edge"), e.run("etcd")
	if edge != nil && len(edge.Phases) == 3 {
		before, cut := edge.Phases[0], edge.Phases[1]
		// A request issued in the cut's last moment may return just after
		// the heal: served, not refused, so it counts as served.
		met := cut.Issued > 0 && cut.Served == cut.Issued && before.P99 > 0 && cut.P99 <= 2*before.P99
		verdict := "**not met**"
		if met {
			verdict = "met"
		}
		fmt.Fprintf(b, "\n**Goal** (issue 16): aether edge serves 100%% of local requests during the partition at unchanged latency (every request issued while cut served, p99 within 2× of before the cut): %s (%d of %d served, %d of them while cut; p50 %.2f ms against %.2f ms before, p99 %.2f ms against %.2f ms).\n",
			verdict, cut.Served, cut.Issued, cut.ServedWhileCut, cut.P50, before.P50, cut.P99, before.P99)
	}
	if etcd != nil && len(etcd.Phases) == 3 {
		cut := etcd.Phases[1]
		// Requests issued before the cut may still commit in its first
		// moments; the minority's answer to its own site is what counts.
		served := cut.ServedWhileCut
		verdict := "**not met**"
		if served == 0 {
			verdict = "met"
		}
		fmt.Fprintf(b, "\n**Goal** (issue 16): etcd's minority side serves none while cut: %s (%d of the requests issued while cut served while cut; of the %d issued while cut, %d were served after the heal and the rest failed: %s).\n",
			verdict, served, cut.Issued, cut.Served-cut.ServedWhileCut, orNone(cut.errorSummary()))
	}
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func (e *EdgePartitionResult) run(server string) *PartitionRun {
	for i := range e.Runs {
		if e.Runs[i].Server == server {
			return &e.Runs[i]
		}
	}
	return nil
}

func notStats(log string) string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if !strings.Contains(l, "request stats") && !strings.Contains(l, "took too long") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// leaderID is the member id of the client's member if it is the leader,
// else 0 (aether edge has no leader).
func leaderID(ctx context.Context, cli *clientv3.Client) (uint64, error) {
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	st, err := cli.Status(sctx, cli.Endpoints()[0])
	if err != nil {
		return 0, fmt.Errorf("status of %s: %w", cli.Endpoints()[0], err)
	}
	if st.Leader != 0 && st.Leader == st.Header.MemberId {
		return st.Leader, nil
	}
	return 0, nil
}

// leaderOf is the leader the client's member names.
func leaderOf(ctx context.Context, cli *clientv3.Client) (uint64, error) {
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	st, err := cli.Status(sctx, cli.Endpoints()[0])
	if err != nil {
		return 0, fmt.Errorf("status of %s: %w", cli.Endpoints()[0], err)
	}
	return st.Leader, nil
}

// untilNewLeader waits until the far member names a leader other than
// old; at once if old is 0 (there was none to replace).
func untilNewLeader(ctx context.Context, far *clientv3.Client, old uint64, since time.Time) (time.Duration, error) {
	if old == 0 {
		return 0, nil
	}
	deadline := since.Add(30 * time.Second)
	for {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := far.Status(sctx, far.Endpoints()[0])
		cancel()
		if err == nil && st.Leader != 0 && st.Leader != old {
			return time.Since(since), nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("no new leader 30 s after the cut (last: %v)", err)
		}
		if !sleepCtx(ctx, 10*time.Millisecond) {
			return 0, ctx.Err()
		}
	}
}
