package bench

import (
	"bufio"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/aethermesh/aether/internal/faultproxy"
)

// ScenarioEdgeConvergence: issue 16's "convergence time after a partition
// with N changes on each side, and sync bytes per change, against the
// change size" (the "Edge store: convergence after a partition" section),
// with etcdctl make-mirror catching up the same changes after the same cut
// alongside in the full run.
const ScenarioEdgeConvergence = "edge-convergence"

const (
	edgeConvBeginMark = "<!-- bench:edge-convergence:begin -->"
	edgeConvEndMark   = "<!-- bench:edge-convergence:end -->"
)

// convPrefix is the prefix of every key the scenario writes: keys are
// convPrefix and a 7-digit number, 12 bytes.
const convPrefix = "conv/"

func convKey(i int) string { return fmt.Sprintf("%s%07d", convPrefix, i) }

// EdgeConvergenceConfig sizes the scenario: every pair of Changes and
// ValueBytes is one run on a fresh cluster.
type EdgeConvergenceConfig struct {
	Changes    []int // written on each side while cut
	ValueBytes []int
	Writers    int // concurrent writers per side; 0: 16
	// Repeats is how many times each pair runs, each on fresh clusters;
	// 0: once. The figures are the run with the median convergence time.
	Repeats int
	// Poll is the pause between two rounds of HashKV on every replica
	// after the heal; 0: 5 ms.
	Poll time.Duration
	// Timeout is how long after the heal a run may take before it counts
	// as not converged; 0: 5 minutes.
	Timeout time.Duration
	// MakeMirror adds etcdctl make-mirror catching up each run's changes
	// of one side after the same cut.
	MakeMirror bool
	AetherBin  string

	// neverHeal leaves the cut in place after the writes: the broken input
	// the test feeds to prove a run that cannot converge is reported as
	// not converged, not as a time.
	neverHeal bool
}

func (c EdgeConvergenceConfig) writers() int { return cmp0(c.Writers, 16) }
func (c EdgeConvergenceConfig) repeats() int { return cmp0(c.Repeats, 1) }
func (c EdgeConvergenceConfig) poll() time.Duration {
	return time.Duration(cmp0(int(c.Poll), int(5*time.Millisecond)))
}
func (c EdgeConvergenceConfig) timeout() time.Duration {
	return time.Duration(cmp0(int(c.Timeout), int(5*time.Minute)))
}

func cmp0(v, def int) int {
	if v <= 0 {
		return def
	}
	return v
}

// ConvergenceRun is one run's figures.
type ConvergenceRun struct {
	Server     string `json:"server"`           // "aether edge" or "etcd make-mirror"
	Changes    int    `json:"changes_per_side"` // written on each writing side while cut
	Sides      int    `json:"writing_sides"`    // 2 (aether edge: A and B), 1 (make-mirror: the source)
	Receivers  int    `json:"receivers"`        // replicas each change must reach: 2 of 3, or the mirror's destination
	KeyBytes   int    `json:"key_bytes"`
	ValueBytes int    `json:"value_bytes"`
	// CutSec is how long the cut lasted: both sides' writes, and (aether
	// edge) B's writes reaching C, so that the heal starts the merge alone.
	CutSec float64 `json:"cut_s"`
	// ConvergeMs is from the heal until the poll that saw every replica
	// agree; null when they did not within TimeoutSec.
	ConvergeMs *float64 `json:"convergence_ms"`
	// Repeats is how many runs the figures are the median of, and
	// ConvergeMinMs and ConvergeMaxMs the fastest and slowest of them.
	Repeats       int     `json:"repeats"`
	ConvergeMinMs float64 `json:"convergence_min_ms,omitempty"`
	ConvergeMaxMs float64 `json:"convergence_max_ms,omitempty"`
	TimeoutSec    float64 `json:"timeout_s"`
	// PollMs and PollRoundMaxMs bound the convergence time's resolution:
	// agreement happened after the round before the one that saw it began.
	PollMs         float64 `json:"poll_interval_ms"`
	PollRoundMaxMs float64 `json:"poll_round_max_ms"`
	// NotConverged is what the last poll saw when the run did not converge.
	NotConverged string `json:"not_converged,omitempty"`
	// ChangesSent and PushBytes are the replicas' sync metrics summed over
	// every replica and peer, from before the cut until every replica had
	// acknowledged everything (aether_edge_sync_changes_sent_total and
	// aether_edge_sync_bytes_sent_total); 0 for make-mirror, which has none.
	ChangesSent int64 `json:"changes_sent"`
	PushBytes   int64 `json:"push_bytes"`
	// WireBytes is every byte the harness's link routers carried over the
	// same span, both directions: gRPC and HTTP/2 framing, acks, probes
	// and keepalives included.
	WireBytes      int64 `json:"wire_bytes"`
	MirrorRestarts int   `json:"mirror_restarts,omitempty"`
}

// Converged reports whether the run converged within its timeout.
func (r ConvergenceRun) Converged() bool { return r.ConvergeMs != nil }

func (r ConvergenceRun) written() int64 { return int64(r.Changes * r.Sides) }

// PushPerChange is the sync metrics' bytes per change sent.
func (r ConvergenceRun) PushPerChange() float64 {
	return float64(r.PushBytes) / float64(max(r.ChangesSent, 1))
}

// WirePerDelivery is the wire bytes per change written and receiver: what
// the links carried to bring one change to one replica that lacked it.
func (r ConvergenceRun) WirePerDelivery() float64 {
	return float64(r.WireBytes) / float64(max(r.written()*int64(max(r.Receivers, 1)), 1))
}

// SentPerWritten is changes sent per change written; each change must be
// sent at least Receivers times.
func (r ConvergenceRun) SentPerWritten() float64 {
	return float64(r.ChangesSent) / float64(max(r.written(), 1))
}

func (r ConvergenceRun) String() string {
	conv := fmt.Sprintf("NOT CONVERGED within %.0f s (%s)", r.TimeoutSec, r.NotConverged)
	if r.Converged() {
		conv = fmt.Sprintf("converged %.0f ms after the heal", *r.ConvergeMs)
	}
	s := fmt.Sprintf("%6d changes/side of %5d B, cut %.1f s: %s; wire %.0f B per change and receiver", r.Changes, r.ValueBytes, r.CutSec, conv, r.WirePerDelivery())
	if r.ChangesSent > 0 {
		s += fmt.Sprintf(", %.0f push B per change sent, %.2f sent per change written", r.PushPerChange(), r.SentPerWritten())
	}
	if r.MirrorRestarts > 0 {
		s += fmt.Sprintf(", %d make-mirror restarts", r.MirrorRestarts)
	}
	return s
}

// EdgeConvergenceResult is the scenario's figures.
type EdgeConvergenceResult struct {
	Writers       int              `json:"writers_per_side"`
	EtcdVersion   string           `json:"etcd_version,omitempty"`
	Runs          []ConvergenceRun `json:"runs"`
	LoadAvgBefore float64          `json:"loadavg_before"`
	LoadAvgAfter  float64          `json:"loadavg_after"`
}

func runEdgeConvergence(ctx context.Context, o Options, r *Report, w io.Writer) error {
	cfg := EdgeConvergenceConfig{Changes: []int{100, 1000, 10000}, ValueBytes: []int{100, 1024, 16384}, Repeats: 3, MakeMirror: true, AetherBin: o.AetherBin}
	if o.Quick {
		cfg.Changes, cfg.ValueBytes, cfg.Repeats, cfg.MakeMirror, cfg.Timeout = []int{100}, []int{100, 16384}, 1, false, 20*time.Second
	}
	fmt.Fprintf(w, "edge-convergence: 3 aether edge replicas, {A} cut from {B,C}, %v changes on each side of %v-byte values, heal, until every HashKV agrees...\n", cfg.Changes, cfg.ValueBytes)
	res, err := EdgeConvergence(ctx, cfg, w)
	if err != nil {
		return fmt.Errorf("edge-convergence: %w", err)
	}
	r.EdgeConvergence = &res
	return nil
}

// EdgeConvergence runs, for every size pair, a fresh 3-replica aether edge
// cluster through the cut, the writes and the heal, and then (MakeMirror)
// a fresh pair of etcds with make-mirror between them through the same.
func EdgeConvergence(ctx context.Context, cfg EdgeConvergenceConfig, w io.Writer) (EdgeConvergenceResult, error) {
	res := EdgeConvergenceResult{Writers: cfg.writers()}
	aether, err := aetherBinary(ctx, cfg.AetherBin)
	if err != nil {
		return res, err
	}
	var etcd, etcdctl string
	if cfg.MakeMirror {
		if etcd, err = etcdBinary(ctx); err != nil {
			return res, err
		}
		if etcdctl, err = etcdctlBinary(ctx); err != nil {
			return res, err
		}
		res.EtcdVersion = binaryVersion(ctx, etcd)
	}
	res.LoadAvgBefore = loadAvg()
	for _, n := range cfg.Changes {
		for _, size := range cfg.ValueBytes {
			run, err := medianRun(cfg.repeats(), func() (ConvergenceRun, error) { return convergenceEdgeOne(ctx, cfg, aether, n, size) })
			if err != nil {
				return res, fmt.Errorf("aether edge, %d changes of %d bytes: %w", n, size, err)
			}
			fmt.Fprintf(w, "  %-16s %s\n", run.Server, run)
			res.Runs = append(res.Runs, run)
			if !cfg.MakeMirror {
				continue
			}
			run, err = medianRun(cfg.repeats(), func() (ConvergenceRun, error) { return convergenceMirrorOne(ctx, cfg, etcd, etcdctl, n, size) })
			if err != nil {
				return res, fmt.Errorf("etcd make-mirror, %d changes of %d bytes: %w", n, size, err)
			}
			fmt.Fprintf(w, "  %-16s %s\n", run.Server, run)
			res.Runs = append(res.Runs, run)
		}
	}
	res.LoadAvgAfter = loadAvg()
	return res, nil
}

// medianRun runs one up to repeats times and returns the run with the
// median convergence time, with the range; a run that does not converge
// ends the repeats and is the figure, so no median hides it.
func medianRun(repeats int, one func() (ConvergenceRun, error)) (ConvergenceRun, error) {
	var runs []ConvergenceRun
	for range repeats {
		r, err := one()
		if err != nil {
			return r, err
		}
		runs = append(runs, r)
		if !r.Converged() {
			r.Repeats = len(runs)
			return r, nil
		}
	}
	slices.SortFunc(runs, func(a, b ConvergenceRun) int { return cmp.Compare(*a.ConvergeMs, *b.ConvergeMs) })
	med := runs[len(runs)/2]
	med.Repeats, med.ConvergeMinMs, med.ConvergeMaxMs = len(runs), *runs[0].ConvergeMs, *runs[len(runs)-1].ConvergeMs
	return med, nil
}

// convValues returns the value of each side's i-th change: random bytes
// (nothing on the way compresses, but the benchmark should not depend on
// that) with the side and the change's number in front, so no two changes
// carry the same value.
func convValues(size int, side byte, seed uint64) func(i int) string {
	base := make([]byte, size)
	rng := rand.New(rand.NewPCG(seed, uint64(side)))
	for i := range base {
		base[i] = byte(rng.UintN(256))
	}
	return func(i int) string {
		v := append([]byte(nil), base...)
		tag := fmt.Sprintf("%c%d/", side, i)
		copy(v, tag)
		return string(v)
	}
}

// writeSide puts keys 0..n-1 at the client's member, writers at a time.
func writeSide(ctx context.Context, cli *clientv3.Client, n, writers int, value func(int) string) error {
	var (
		wg   sync.WaitGroup
		next atomic.Int64
		mu   sync.Mutex
		errs []error
	)
	for range min(writers, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				_, err := cli.Put(pctx, convKey(i), value(i))
				cancel()
				if err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("put %s at %s: %w", convKey(i), cli.Endpoints()[0], err))
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// convCluster is three aether edge replicas on loopback whose member-to-
// member links can be cut one directed link at a time, without root.
// Member j's peer URL is a link router: it finds which member dialled each
// connection it accepts (every member dials from 127.0.0.1, so only the
// dialling socket's owner, from /proc, tells them apart) and splices the
// connection to the fault proxy of that directed link, links[i][j], which
// forwards to j's real peer port. Blackholing links[i][j] and links[j][i]
// then parts i and j in both directions whichever side dialled, while
// every replica agrees on the initial cluster (member ids derive from it).
type convCluster struct {
	procs   []*proc
	routers []*linkRouter
	links   [][]*faultproxy.Proxy
	wire    atomic.Int64 // bytes every router carried, both directions
	clients []string
	dir     string
}

func (c *convCluster) stop() {
	for _, p := range c.procs {
		p.stop(10 * time.Second)
	}
	for _, r := range c.routers {
		r.Close()
	}
	for _, row := range c.links {
		for _, p := range row {
			if p != nil {
				_ = p.Close()
			}
		}
	}
	os.RemoveAll(c.dir)
}

// cut blackholes every link between member i and the others; heal
// resumes them.
func (c *convCluster) cut(i int) {
	for j := range c.links {
		if j != i {
			c.links[i][j].Blackhole()
			c.links[j][i].Blackhole()
		}
	}
}

func (c *convCluster) heal(i int) {
	for j := range c.links {
		if j != i {
			c.links[i][j].Heal()
			c.links[j][i].Heal()
		}
	}
}

func (c *convCluster) pids() []int {
	out := make([]int, len(c.procs))
	for i, p := range c.procs {
		out[i] = p.cmd.Process.Pid
	}
	return out
}

func startConvCluster(ctx context.Context, bin string, n int) (*convCluster, error) {
	return startRetrying(func() (_ *convCluster, err error) {
		dir, err := os.MkdirTemp("", "aether-bench-conv-")
		if err != nil {
			return nil, err
		}
		c := &convCluster{dir: dir}
		defer func() {
			if err != nil {
				c.stop()
			}
		}()
		ports, err := freePorts(2 * n)
		if err != nil {
			return nil, err
		}
		peer := func(j int) string { return fmt.Sprintf("127.0.0.1:%d", ports[2*j+1]) }
		c.links = make([][]*faultproxy.Proxy, n)
		for i := range n {
			c.links[i] = make([]*faultproxy.Proxy, n)
			for j := range n {
				if i == j {
					continue
				}
				if c.links[i][j], err = faultproxy.Start(peer(j)); err != nil {
					return nil, err
				}
			}
		}
		var initial []string
		for j := range n {
			r, err := listenLinkRouter()
			if err != nil {
				return nil, err
			}
			c.routers = append(c.routers, r)
			c.clients = append(c.clients, fmt.Sprintf("http://127.0.0.1:%d", ports[2*j]))
			initial = append(initial, fmt.Sprintf("m%d=http://%s", j, r.Addr()))
		}
		for j := range n {
			args := []string{"edge",
				"--name", fmt.Sprintf("m%d", j), "--data-dir", filepath.Join(dir, fmt.Sprintf("m%d", j)),
				"--listen-client-urls", c.clients[j], "--advertise-client-urls", c.clients[j],
				"--listen-peer-urls", "http://" + peer(j),
				"--initial-advertise-peer-urls", "http://" + c.routers[j].Addr(),
				"--initial-cluster", strings.Join(initial, ","),
				"--initial-cluster-state", "new", "--log-level", "warn"}
			p, err := startProc(fmt.Sprintf("aether edge m%d", j), "", bin, args...)
			if err != nil {
				return nil, err
			}
			c.procs = append(c.procs, p)
		}
		// The routers accept only now that every member's pid is known;
		// the members' first dials wait in the listen backlog meanwhile.
		pids := c.pids()
		for j, r := range c.routers {
			r.serve(func(conn net.Conn) (string, error) {
				i, err := socketOwner(conn, pids)
				if err != nil {
					return "", err
				}
				if i == j {
					return "", fmt.Errorf("member m%d dialled its own peer URL", j)
				}
				return c.links[i][j].Addr(), nil
			}, &c.wire)
		}
		for i, p := range c.procs {
			if err := p.waitUntil(ctx, 60*time.Second, func() error { return httpOK(c.clients[i] + "/health") }); err != nil {
				return nil, err
			}
		}
		return c, nil
	})
}

func convergenceEdgeOne(ctx context.Context, cfg EdgeConvergenceConfig, bin string, n, size int) (ConvergenceRun, error) {
	run := ConvergenceRun{Server: "aether edge", Changes: n, Sides: 2, Receivers: 2, KeyBytes: len(convKey(0)), ValueBytes: size,
		TimeoutSec: cfg.timeout().Seconds(), PollMs: ms(cfg.poll())}
	c, err := startConvCluster(ctx, bin, 3)
	if err != nil {
		return run, err
	}
	defer c.stop()
	clis := make([]*clientv3.Client, len(c.clients))
	for i, u := range c.clients {
		if clis[i], err = clientv3.New(clientv3.Config{Endpoints: []string{u}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}); err != nil {
			return run, err
		}
		defer clis[i].Close()
	}
	before, err := edgeSyncTotals(c.clients)
	if err != nil {
		return run, err
	}
	wire0 := c.wire.Load()

	cutAt := time.Now()
	c.cut(0)
	seed := rand.Uint64()
	errs := make(chan error, 2)
	for side, cli := range map[byte]*clientv3.Client{'a': clis[0], 'b': clis[1]} {
		go func() { errs <- writeSide(ctx, cli, n, cfg.writers(), convValues(size, side, seed)) }()
	}
	if err := errors.Join(<-errs, <-errs); err != nil {
		return run, err
	}
	// B's writes reach C while cut, so what the heal starts is the merge
	// of the two sides alone.
	if _, _, last, ok, err := untilSameHash(ctx, clis[1:], c.clients[1:], cfg.poll(), 5*time.Minute); err != nil {
		return run, fmt.Errorf("B and C while cut: %w", err)
	} else if !ok {
		return run, fmt.Errorf("B and C did not agree 5 minutes after the writes while cut: %s", last)
	}
	// The cut is real: A holds none of B's writes.
	hs, err := hashes(ctx, clis[:2], c.clients[:2])
	if err != nil {
		return run, err
	}
	if hs[0] == hs[1] {
		return run, errors.New("the cut is not real: A and B agree after writing different values while cut")
	}
	if !cfg.neverHeal {
		c.heal(0)
	}
	healed := time.Now()
	run.CutSec = healed.Sub(cutAt).Seconds()
	d, round, last, ok, err := untilSameHash(ctx, clis, c.clients, cfg.poll(), cfg.timeout())
	if err != nil {
		return run, err
	}
	run.PollRoundMaxMs = ms(round)
	if ok {
		v := ms(d)
		run.ConvergeMs = &v
		// Agreement on a hash is agreement on the key space; that key
		// space must hold every key once.
		for i, cli := range clis {
			if got, err := countKeys(ctx, cli); err != nil || got != int64(n) {
				return run, fmt.Errorf("m%d agrees on the hash but holds %d keys, want %d (%v)", i, got, n, err)
			}
		}
		// Count what it took until every replica acknowledged everything,
		// not only what had been sent when the hashes first agreed:
		// duplicates still in flight then are a cost of the merge too.
		if err := untilSynced(ctx, c.clients, 2*time.Minute); err != nil {
			return run, err
		}
	} else {
		run.NotConverged = last
	}
	after, err := edgeSyncTotals(c.clients)
	if err != nil {
		return run, err
	}
	run.ChangesSent = int64(after.changesSent - before.changesSent)
	run.PushBytes = int64(after.bytesSent - before.bytesSent)
	run.WireBytes = c.wire.Load() - wire0
	for _, p := range c.procs {
		if err := p.check(); err != nil {
			return run, err
		}
	}
	return run, ctx.Err()
}

// hashes is HashKV at the current revision of each client's member, asked
// of all at once so that a round reads them as nearly together as it can.
func hashes(ctx context.Context, clis []*clientv3.Client, eps []string) ([]uint32, error) {
	out := make([]uint32, len(clis))
	errs := make([]error, len(clis))
	var wg sync.WaitGroup
	for i, cli := range clis {
		wg.Add(1)
		go func() {
			defer wg.Done()
			hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			resp, err := cli.HashKV(hctx, strings.TrimPrefix(eps[i], "http://"), 0)
			if err != nil {
				errs[i] = fmt.Errorf("HashKV of %s: %w", eps[i], err)
				return
			}
			out[i] = resp.Hash
		}()
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// untilSameHash polls HashKV on every member until one round sees them all
// agree (ok), or timeout passes (not ok, with the last round's hashes). d
// is from the call until the end of the round that saw agreement; round is
// the longest round. The pause between rounds is poll, or the last round's
// length if longer: hashing a large key space is work for the replicas
// (CRC over every value), and back-to-back rounds would slow the merge
// being timed; this way polling takes at most half their time.
func untilSameHash(ctx context.Context, clis []*clientv3.Client, eps []string, poll, timeout time.Duration) (d, round time.Duration, last string, ok bool, err error) {
	start := time.Now()
	for {
		rs := time.Now()
		hs, err := hashes(ctx, clis, eps)
		if err != nil {
			return 0, round, last, false, err
		}
		round = max(round, time.Since(rs))
		same := true
		var parts []string
		for i, h := range hs {
			same = same && h == hs[0]
			parts = append(parts, fmt.Sprintf("%s %08x", eps[i], h))
		}
		last = "HashKV " + strings.Join(parts, ", ")
		if same {
			return time.Since(start), round, last, true, nil
		}
		if time.Since(start) > timeout {
			return 0, round, last, false, nil
		}
		if !sleepCtx(ctx, max(poll, time.Since(rs))) {
			return 0, round, last, false, ctx.Err()
		}
	}
}

func countKeys(ctx context.Context, cli *clientv3.Client) (int64, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := cli.Get(cctx, convPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly(), clientv3.WithSerializable())
	if err != nil {
		return 0, err
	}
	return resp.Count, nil
}

// syncTotals are the sync metrics of every replica summed over its peers.
type syncTotals struct {
	changesSent, bytesSent, lag float64
}

// edgeSyncTotals scrapes every replica's /metrics.
func edgeSyncTotals(clients []string) (syncTotals, error) {
	var t syncTotals
	for _, u := range clients {
		one, err := scrapeSync(u + "/metrics")
		if err != nil {
			return t, err
		}
		t.changesSent += one.changesSent
		t.bytesSent += one.bytesSent
		t.lag += one.lag
	}
	return t, nil
}

func scrapeSync(url string) (syncTotals, error) {
	var t syncTotals
	resp, err := httpClient.Get(url)
	if err != nil {
		return t, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	seen := 0
	for sc.Scan() {
		line := sc.Text()
		name, rest, ok := strings.Cut(line, "{")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		var dst *float64
		switch name {
		case "aether_edge_sync_changes_sent_total":
			dst = &t.changesSent
		case "aether_edge_sync_bytes_sent_total":
			dst = &t.bytesSent
		case "aether_edge_sync_lag_changes":
			dst = &t.lag
		default:
			continue
		}
		i := strings.LastIndexByte(rest, ' ')
		v, err := strconv.ParseFloat(rest[i+1:], 64)
		if i < 0 || err != nil {
			return t, fmt.Errorf("%s: unreadable sample %q", url, line)
		}
		*dst += v
		seen++
	}
	if err := sc.Err(); err != nil {
		return t, fmt.Errorf("%s: %w", url, err)
	}
	if seen == 0 {
		return t, fmt.Errorf("%s: no aether_edge_sync series", url)
	}
	return t, nil
}

// untilSynced waits until no replica lacks an ack for anything from any
// peer (every aether_edge_sync_lag_changes is 0): from then on a sender
// has nothing left to send.
func untilSynced(ctx context.Context, clients []string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		t, err := edgeSyncTotals(clients)
		if err != nil {
			return err
		}
		if t.lag == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sync lag still %.0f changes %v after the replicas agreed", t.lag, timeout)
		}
		if !sleepCtx(ctx, 10*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// convergenceMirrorOne is the etcd comparison: etcd has no partition
// merge, so the fitting peer is the repository's replication tool for it,
// etcdctl make-mirror (as in the replication scenario: supervised, its
// link to the destination through a fault proxy), catching up one side's
// n changes after the same cut. Converged is the destination holding all
// of them (each key is written once, so the count says it).
func convergenceMirrorOne(ctx context.Context, cfg EdgeConvergenceConfig, etcd, etcdctl string, n, size int) (ConvergenceRun, error) {
	run := ConvergenceRun{Server: "etcd make-mirror", Changes: n, Sides: 1, Receivers: 1, KeyBytes: len(convKey(0)), ValueBytes: size,
		TimeoutSec: cfg.timeout().Seconds(), PollMs: ms(cfg.poll())}
	src, srcURL, err := startEtcdLike(ctx, "etcd source", etcd, nil)
	if err != nil {
		return run, err
	}
	defer src.stop(10 * time.Second)
	dst, dstURL, err := startEtcdLike(ctx, "etcd destination", etcd, nil)
	if err != nil {
		return run, err
	}
	defer dst.stop(10 * time.Second)
	link, err := faultproxy.Start(strings.TrimPrefix(dstURL, "http://"))
	if err != nil {
		return run, err
	}
	defer link.Close()
	r, err := listenLinkRouter()
	if err != nil {
		return run, err
	}
	var wire atomic.Int64
	r.serve(func(net.Conn) (string, error) { return link.Addr(), nil }, &wire)
	defer r.Close()
	srcCli, err := clientv3.New(clientv3.Config{Endpoints: []string{srcURL}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return run, err
	}
	defer srcCli.Close()
	dstCli, err := clientv3.New(clientv3.Config{Endpoints: []string{dstURL}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return run, err
	}
	defer dstCli.Close()
	m := startMakeMirror(ctx, etcdctl, srcURL, "http://"+r.Addr(), convPrefix)
	defer m.stop()
	// The mirror is watching once a marker put at the source reaches the
	// destination.
	marker := convPrefix + "marker"
	if _, err := srcCli.Put(ctx, marker, "v"); err != nil {
		return run, err
	}
	if _, err := untilKey(ctx, dstCli, marker, time.Now()); err != nil {
		return run, fmt.Errorf("make-mirror before the cut: %w", err)
	}
	wire0 := wire.Load()
	cutAt := time.Now()
	link.Blackhole()
	if err := writeSide(ctx, srcCli, n, cfg.writers(), convValues(size, 'a', rand.Uint64())); err != nil {
		return run, err
	}
	if !cfg.neverHeal {
		link.Heal()
	}
	healed := time.Now()
	run.CutSec = healed.Sub(cutAt).Seconds()
	want := int64(n + 1) // and the marker
	var got int64
	for {
		rs := time.Now()
		got, err = countKeys(ctx, dstCli)
		if err != nil {
			return run, fmt.Errorf("the destination: %w", err)
		}
		run.PollRoundMaxMs = max(run.PollRoundMaxMs, ms(time.Since(rs)))
		if got == want {
			v := ms(time.Since(healed))
			run.ConvergeMs = &v
			break
		}
		if time.Since(healed) > cfg.timeout() {
			run.NotConverged = fmt.Sprintf("the destination holds %d of %d keys", got, want)
			break
		}
		if !sleepCtx(ctx, cfg.poll()) {
			return run, ctx.Err()
		}
	}
	run.WireBytes = wire.Load() - wire0
	run.MirrorRestarts = len(m.exitsSince(cutAt))
	for _, p := range []*proc{src, dst} {
		if err := p.check(); err != nil {
			return run, err
		}
	}
	return run, ctx.Err()
}

// linkRouter listens for connections and splices each to the address its
// route picks, counting the bytes both ways.
type linkRouter struct {
	ln net.Listener

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

func listenLinkRouter() (*linkRouter, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("link router: %w", err)
	}
	return &linkRouter{ln: ln, conns: map[net.Conn]struct{}{}}, nil
}

func (r *linkRouter) Addr() string { return r.ln.Addr().String() }

// serve starts accepting; a connection route refuses is closed.
func (r *linkRouter) serve(route func(net.Conn) (string, error), wire *atomic.Int64) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			c, err := r.ln.Accept()
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				// Anything else on loopback is transient (EMFILE).
				time.Sleep(10 * time.Millisecond)
				continue
			}
			if !r.track(c) {
				return
			}
			r.wg.Add(1)
			go func() {
				defer r.wg.Done()
				defer r.untrack(c)
				addr, err := route(c)
				if err != nil {
					return
				}
				d, err := net.DialTimeout("tcp", addr, 5*time.Second)
				if err != nil || !r.track(d) {
					return
				}
				defer r.untrack(d)
				var pumps sync.WaitGroup
				pump := func(dst, src net.Conn) {
					defer pumps.Done()
					// Counted as it goes: the sync streams live on after
					// the figures are read.
					_, err := io.Copy(countingWriter{dst, wire}, src)
					if err == nil {
						// A clean half-close is passed on, as the fault
						// proxy does; anything else ends both sides.
						if tc, ok := dst.(*net.TCPConn); ok {
							_ = tc.CloseWrite()
							return
						}
					}
					c.Close()
					d.Close()
				}
				pumps.Add(2)
				go pump(d, c)
				go pump(c, d)
				pumps.Wait()
			}()
		}
	}()
}

type countingWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c countingWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n.Add(int64(n))
	return n, err
}

func (r *linkRouter) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		c.Close()
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *linkRouter) untrack(c net.Conn) {
	c.Close()
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
}

// Close stops accepting, closes every connection and waits for every
// goroutine the router started.
func (r *linkRouter) Close() {
	r.mu.Lock()
	r.closed = true
	for c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.ln.Close()
	r.wg.Wait()
}

// socketOwner is the index in pids of the process that holds the dialling
// end of c, an accepted loopback TCP connection: the /proc/net/tcp entry
// from c's remote address to its local one names the socket's inode, and
// the owner has a descriptor linking to "socket:[inode]".
func socketOwner(c net.Conn, pids []int) (int, error) {
	from, ok1 := c.RemoteAddr().(*net.TCPAddr)
	to, ok2 := c.LocalAddr().(*net.TCPAddr)
	if !ok1 || !ok2 || from.IP.To4() == nil || to.IP.To4() == nil {
		return -1, fmt.Errorf("socket owner: %v to %v is not TCP over IPv4", c.RemoteAddr(), c.LocalAddr())
	}
	inode, err := tcpInode(from, to)
	if err != nil {
		return -1, err
	}
	want := "socket:[" + inode + "]"
	for i, pid := range pids {
		dir := fmt.Sprintf("/proc/%d/fd", pid)
		fds, err := os.ReadDir(dir)
		if err != nil {
			continue // exited: not the owner
		}
		for _, fd := range fds {
			if l, err := os.Readlink(filepath.Join(dir, fd.Name())); err == nil && l == want {
				return i, nil
			}
		}
	}
	return -1, fmt.Errorf("socket owner: no member process holds the socket dialling from %v", from)
}

// tcpInode finds the inode of the IPv4 socket from -> to in /proc/net/tcp.
// Addresses there are the 4 bytes of the address in memory printed as a
// native-endian word, then the port: "0100007F:1F90" on x86.
func tcpInode(from, to *net.TCPAddr) (string, error) {
	hex := func(a *net.TCPAddr) string {
		return fmt.Sprintf("%08X:%04X", binary.NativeEndian.Uint32(a.IP.To4()), a.Port)
	}
	local, remote := hex(from), hex(to)
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		return "", fmt.Errorf("socket owner (needs Linux /proc): %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) >= 10 && fs[1] == local && fs[2] == remote {
			return fs[9], nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("/proc/net/tcp: %w", err)
	}
	return "", fmt.Errorf("socket owner: no socket %v -> %v in /proc/net/tcp", from, to)
}

func (r Report) edgeConvergenceMarkdown(b *strings.Builder) {
	e := r.EdgeConvergence
	fmt.Fprintf(b, "### Edge store: convergence after a partition (last run %s)\n\n", r.Date)
	fmt.Fprintf(b, "- Machine: %s\n- Command: `%s`\n", r.Machine, r.Command)
	if e.EtcdVersion != "" {
		fmt.Fprintf(b, "- etcd: %s, etcd's own main and etcdctl built from `tools/etcd`; aether edge: this binary\n", e.EtcdVersion)
	}
	b.WriteString("\n")
	fmt.Fprintf(b, "Issue 16's convergence benchmark. Each run is a fresh cluster of 3 aether edge replicas A, B, C, processes on this machine, data in the system temporary directory. "+
		"Every member-to-member link is a fault proxy of its own (`internal/faultproxy`, user space, no root): a member's peer URL is a router of the harness that tells which member dialled each connection (the dialling socket's owner, from `/proc`) and splices it to that directed link's proxy, counting the bytes. "+
		"A is cut from {B, C} (the four links between them blackholed: nothing forwarded either way, nothing closed, as in a partition); then N puts go to A and N to B at once, %d writers each, the same N keys (`%s` and 7 digits, 12 bytes) on both sides with different random values, so every key conflicts; B's reach C while cut; the harness checks A and B disagree (the cut is real), and heals. "+
		"*Convergence* is from the heal until a round of HashKV (the etcd Maintenance API; aether edge's hashes the key space without revisions) on all three replicas finds them equal, then checked: each holds N keys. A round asks all three at once; the pause between rounds is %.0f ms, or the last round's length if longer (hashing is CRC over every value: back-to-back rounds would slow the merge being timed), so the figure is late by at most a pause plus a round (*poll round max*). "+
		"*Sync* figures span from before the cut until every replica has acknowledged everything (every `aether_edge_sync_lag_changes` 0): *changes sent* and *push bytes* from the replicas' `aether_edge_sync_changes_sent_total` and `aether_edge_sync_bytes_sent_total` (every replica, every peer; each of the 2N changes must be sent at least twice, to the two replicas that lack it), *wire bytes* all the routers carried both ways (gRPC, HTTP/2, acks, probes) per change written and replica that lacked it. "+
		"A cut longer than the peers' gRPC keepalive (a ping after 10 s, 5 s for its answer) ends their streams; after the heal each replica reconnects (backoff up to 1 s) and starts again from the peer's vector, and what a sender had handed to a stream that died counts as pushed without crossing: push bytes can then exceed wire bytes.\n\n",
		e.Writers, convPrefix, e.pollMs())
	if e.EtcdVersion != "" {
		b.WriteString("The etcd peer: etcd has no partition merge, so the comparison is the repository's replication tool for etcd, `etcdctl make-mirror` (as in the replication scenario: supervised, restarted a second after it exits), from a source etcd into a destination etcd through a fault proxy and router like the above, catching up the same N puts on one side after the same cut: *convergence* is until the destination holds all N keys (polled like the hashes), *wire bytes* are of the mirror's link to the destination. It moves N changes to one receiver where the edge merges 2N, each to two receivers.\n\n")
	}
	if r := e.repeats(); r > 1 {
		fmt.Fprintf(b, "Each row ran %d times, each time on fresh processes; its figures are those of the run with the median convergence time, the fastest and slowest in brackets (a run that does not converge stops the repeats and is the row).\n\n", r)
	}
	if e.LoadAvgBefore > 0 {
		fmt.Fprintf(b, "The machine's 1-minute load average was %.2f before and %.2f after (%d cores).\n\n", e.LoadAvgBefore, e.LoadAvgAfter, runtime.NumCPU())
	}
	b.WriteString("| server | N per side | value | cut lasted | convergence after the heal | poll round max | changes sent per change written | push bytes per change sent | of it beyond key + value | wire bytes per change and receiver |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, run := range e.Runs {
		conv := fmt.Sprintf("**not converged** within %.0f s", run.TimeoutSec)
		if run.Converged() {
			conv = fmt.Sprintf("%.0f ms", *run.ConvergeMs)
			if run.Repeats > 1 {
				conv += fmt.Sprintf(" (%.0f–%.0f)", run.ConvergeMinMs, run.ConvergeMaxMs)
			}
		}
		sent, push, over := "n/a", "n/a", "n/a"
		if run.ChangesSent > 0 {
			sent = fmt.Sprintf("%.2f", run.SentPerWritten())
			push = fmt.Sprintf("%.0f B", run.PushPerChange())
			over = fmt.Sprintf("%.0f B", run.PushPerChange()-float64(run.KeyBytes+run.ValueBytes))
		}
		fmt.Fprintf(b, "| %s | %d | %s | %.1f s | %s | %.1f ms | %s | %s | %s | %.0f B |\n",
			run.Server, run.Changes, sizeName(run.ValueBytes), run.CutSec, conv, run.PollRoundMaxMs, sent, push, over, run.WirePerDelivery())
	}
	if e.EtcdVersion != "" {
		restarts := 0
		for _, run := range e.Runs {
			restarts += run.MirrorRestarts
		}
		if restarts == 0 {
			b.WriteString("\nmake-mirror did not exit in any run.\n")
		} else {
			fmt.Fprintf(b, "\nmake-mirror exited and was restarted %d times over the runs (each restart copies the prefix again before watching).\n", restarts)
		}
	}
	var notConv []string
	for _, run := range e.Runs {
		if !run.Converged() {
			notConv = append(notConv, fmt.Sprintf("%s, N %d of %s: %s", run.Server, run.Changes, sizeName(run.ValueBytes), run.NotConverged))
		}
	}
	if len(notConv) > 0 {
		b.WriteString("\nNot converged (the last poll):\n\n")
		for _, s := range notConv {
			fmt.Fprintf(b, "- %s\n", s)
		}
	}
}

func (e *EdgeConvergenceResult) pollMs() float64 {
	for _, r := range e.Runs {
		return r.PollMs
	}
	return 0
}

func (e *EdgeConvergenceResult) repeats() int {
	n := 0
	for _, r := range e.Runs {
		n = max(n, r.Repeats)
	}
	return n
}

func sizeName(n int) string {
	if n >= 1024 && n%1024 == 0 {
		return fmt.Sprintf("%d KiB", n/1024)
	}
	return fmt.Sprintf("%d B", n)
}
