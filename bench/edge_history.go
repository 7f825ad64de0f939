package bench

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// ScenarioEdgeHistory: disk and memory of edge replicas under a sustained
// write load with automatic compaction, with and without history GC, over
// minutes (the "Edge store: bounded history" section).
const ScenarioEdgeHistory = "edge-history"

const (
	edgeHistoryBeginMark = "<!-- bench:edge-history:begin -->"
	edgeHistoryEndMark   = "<!-- bench:edge-history:end -->"
)

// EdgeHistoryConfig sizes the scenario.
type EdgeHistoryConfig struct {
	Replicas int           // per cluster
	Duration time.Duration // of the load
	Samples  int           // evenly over Duration, plus one before the load
	Rate     int           // writes per second offered to each cluster, spread over its replicas
	Keys     int           // the key space the writes overwrite
	// DeleteEvery: one write in DeleteEvery is a delete (tombstones for
	// GC to collect); 0: none.
	DeleteEvery int
	ValueBytes  int
	// Retention is --auto-compaction-retention (periodic mode);
	// CheckpointChanges --checkpoint-changes. Both clusters get the same.
	Retention         time.Duration
	CheckpointChanges int
	AetherBin         string
}

// EdgeHistorySample is one replica's figures at one time.
type EdgeHistorySample struct {
	Second      float64 `json:"second"`       // since the load started (negative: before)
	DiskBytes   int64   `json:"disk_bytes"`   // allocated bytes of every file in the data dir
	DBBytes     int64   `json:"db_bytes"`     // of those, the bbolt file's (the rest: write-ahead log)
	RSSBytes    int64   `json:"rss_bytes"`    // VmRSS
	AnonBytes   int64   `json:"anon_bytes"`   // RssAnon: VmRSS less the mapped file (bbolt's mmap)
	DAGChanges  float64 `json:"dag_changes"`  // aether_edge_dag_changes: changes the sync log holds
	Checkpoints float64 `json:"checkpoints"`  // aether_edge_checkpoints_total
	Writes      int     `json:"writes_acked"` // by the cluster, so far
}

// EdgeHistoryRun is one cluster's run.
type EdgeHistoryRun struct {
	HistoryGC bool `json:"history_gc"`
	// Samples[i][r] is replica r at sample i.
	Samples  [][]EdgeHistorySample `json:"samples"`
	Writes   int                   `json:"writes"` // acknowledged
	Errors   int                   `json:"errors"`
	Achieved float64               `json:"achieved_per_sec"`
}

// EdgeHistoryResult is the scenario's figures.
type EdgeHistoryResult struct {
	Replicas          int              `json:"replicas"`
	Seconds           float64          `json:"seconds"`
	Rate              int              `json:"rate"`
	Keys              int              `json:"keys"`
	DeleteEvery       int              `json:"delete_every"`
	ValueBytes        int              `json:"value_bytes"`
	RetentionSec      float64          `json:"compaction_retention_sec"`
	CheckpointChanges int              `json:"checkpoint_changes"`
	Runs              []EdgeHistoryRun `json:"runs"`
	LoadAvgBefore     float64          `json:"loadavg_before"`
	LoadAvgAfter      float64          `json:"loadavg_after"`
}

func runEdgeHistory(ctx context.Context, o Options, r *Report, w io.Writer) error {
	cfg := EdgeHistoryConfig{Replicas: 3, Duration: 10 * time.Minute, Samples: 20, Rate: 300, Keys: 1000, DeleteEvery: 10, ValueBytes: 256,
		Retention: 30 * time.Second, CheckpointChanges: 10000, AetherBin: o.AetherBin}
	if o.Quick {
		cfg.Duration, cfg.Samples, cfg.Retention, cfg.CheckpointChanges = 30*time.Second, 10, 5*time.Second, 2000
	}
	fmt.Fprintf(w, "edge-history: two %d-replica clusters, %d writes/s each for %v, auto-compaction every %v, with and without --history-gc...\n",
		cfg.Replicas, cfg.Rate, cfg.Duration, cfg.Retention)
	res, err := EdgeHistory(ctx, cfg, w)
	if err != nil {
		return fmt.Errorf("edge-history: %w", err)
	}
	r.EdgeHistory = &res
	return nil
}

// EdgeHistory starts two fresh clusters of cfg.Replicas `aether edge`
// processes, one with --history-gc and one without, loads both at once
// with the same open-loop write rate (so whatever else the machine runs
// weighs on both alike), and samples each replica's data dir size and
// resident memory cfg.Samples times.
func EdgeHistory(ctx context.Context, cfg EdgeHistoryConfig, w io.Writer) (EdgeHistoryResult, error) {
	res := EdgeHistoryResult{Replicas: cfg.Replicas, Seconds: cfg.Duration.Seconds(), Rate: cfg.Rate, Keys: cfg.Keys, DeleteEvery: cfg.DeleteEvery,
		ValueBytes: cfg.ValueBytes, RetentionSec: cfg.Retention.Seconds(), CheckpointChanges: cfg.CheckpointChanges}
	aether, err := aetherBinary(ctx, cfg.AetherBin)
	if err != nil {
		return res, err
	}
	var clusters []*historyCluster
	defer func() {
		for _, c := range clusters {
			c.stop()
		}
	}()
	for _, gc := range []bool{false, true} {
		extra := []string{"--auto-compaction-mode", "periodic", "--auto-compaction-retention", cfg.Retention.String(),
			"--checkpoint-changes", fmt.Sprint(cfg.CheckpointChanges)}
		if gc {
			extra = append(extra, "--history-gc")
		}
		c, err := startHistoryCluster(ctx, aether, cfg.Replicas, gc, extra)
		if err != nil {
			return res, fmt.Errorf("history GC %v: %w", gc, err)
		}
		clusters = append(clusters, c)
	}
	res.LoadAvgBefore = loadAvg()

	lctx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	var wg sync.WaitGroup
	for _, c := range clusters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.load(lctx, cfg)
		}()
	}
	start := time.Now()
	sample := func(at time.Duration) error {
		for _, c := range clusters {
			s, err := c.sample(at)
			if err != nil {
				return err
			}
			c.run.Samples = append(c.run.Samples, s)
		}
		return nil
	}
	err = sample(0)
	for i := 1; err == nil && i <= cfg.Samples; i++ {
		due := start.Add(cfg.Duration * time.Duration(i) / time.Duration(cfg.Samples))
		select {
		case <-ctx.Done():
			err = ctx.Err()
		case <-time.After(time.Until(due)):
			err = sample(time.Since(start))
		}
		if err == nil && len(clusters) == 2 {
			a, b := clusters[0].run.Samples[i], clusters[1].run.Samples[i]
			fmt.Fprintf(w, "  %4.0fs  without GC: disk %s (db %s), RSS %s (anon %s);  with GC: disk %s (db %s), RSS %s (anon %s)\n", time.Since(start).Seconds(),
				mib(maxOf(a, diskOf)), mib(maxOf(a, dbOf)), mib(maxOf(a, rssOf)), mib(maxOf(a, anonOf)),
				mib(maxOf(b, diskOf)), mib(maxOf(b, dbOf)), mib(maxOf(b, rssOf)), mib(maxOf(b, anonOf)))
		}
	}
	stopLoad()
	wg.Wait()
	elapsed := time.Since(start)
	for _, c := range clusters {
		c.run.Writes, c.run.Errors = c.writes, c.errors
		c.run.Achieved = float64(c.writes) / elapsed.Seconds()
		res.Runs = append(res.Runs, c.run)
	}
	res.LoadAvgAfter = loadAvg()
	return res, err
}

// historyCluster is one cluster of the scenario.
type historyCluster struct {
	procs   []*proc
	clients []string
	dirs    []string // data dirs
	dir     string
	run     EdgeHistoryRun

	mu             sync.Mutex
	writes, errors int
}

func (c *historyCluster) stop() {
	for _, p := range c.procs {
		p.stop(10 * time.Second)
	}
	os.RemoveAll(c.dir)
}

func startHistoryCluster(ctx context.Context, bin string, n int, gc bool, extra []string) (*historyCluster, error) {
	return startRetrying(func() (*historyCluster, error) {
		dir, err := os.MkdirTemp("", "aether-bench-history-")
		if err != nil {
			return nil, err
		}
		c := &historyCluster{dir: dir, run: EdgeHistoryRun{HistoryGC: gc}}
		ports, err := freePorts(2 * n)
		if err != nil {
			c.stop()
			return nil, err
		}
		var initial []string
		for i := 0; i < n; i++ {
			c.clients = append(c.clients, fmt.Sprintf("http://127.0.0.1:%d", ports[2*i]))
			initial = append(initial, fmt.Sprintf("h%d=http://127.0.0.1:%d", i, ports[2*i+1]))
		}
		for i := 0; i < n; i++ {
			data := filepath.Join(dir, fmt.Sprintf("h%d", i))
			c.dirs = append(c.dirs, data)
			peer := fmt.Sprintf("http://127.0.0.1:%d", ports[2*i+1])
			args := append([]string{"edge",
				"--name", fmt.Sprintf("h%d", i), "--data-dir", data,
				"--listen-client-urls", c.clients[i], "--advertise-client-urls", c.clients[i],
				"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
				"--initial-cluster", strings.Join(initial, ","),
				"--initial-cluster-state", "new", "--log-level", "warn"}, extra...)
			p, err := startProc(fmt.Sprintf("aether edge h%d (history GC %v)", i, gc), "", bin, args...)
			if err != nil {
				c.stop()
				return nil, err
			}
			c.procs = append(c.procs, p)
		}
		for i, p := range c.procs {
			if err := p.waitUntil(ctx, 60*time.Second, func() error { return httpOK(c.clients[i] + "/health") }); err != nil {
				c.stop()
				return nil, err
			}
		}
		return c, nil
	})
}

// load offers cfg.Rate writes per second, open loop (a write is due every
// 1/Rate whether or not earlier ones returned, so a slow cluster shows as
// a shortfall, not as a politely slower client), round robin over the
// replicas, until ctx ends.
func (c *historyCluster) load(ctx context.Context, cfg EdgeHistoryConfig) {
	var clis []*clientv3.Client
	for _, u := range c.clients {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{u}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			c.mu.Lock()
			c.errors++
			c.mu.Unlock()
			return
		}
		defer cli.Close()
		clis = append(clis, cli)
	}
	const writers = 16
	ticks := make(chan int, writers)
	var wg sync.WaitGroup
	value := strings.Repeat("h", max(cfg.ValueBytes, 1))
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := range ticks {
				cli := clis[n%len(clis)]
				key := fmt.Sprintf("history/%06d", rand.IntN(max(cfg.Keys, 1)))
				cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				var err error
				if cfg.DeleteEvery > 0 && n%cfg.DeleteEvery == 0 {
					_, err = cli.Delete(cctx, key)
				} else {
					_, err = cli.Put(cctx, key, value)
				}
				cancel()
				c.mu.Lock()
				if err != nil {
					if ctx.Err() == nil { // not the end of the load
						c.errors++
					}
				} else {
					c.writes++
				}
				c.mu.Unlock()
			}
		}()
	}
	t := time.NewTicker(time.Second / time.Duration(max(cfg.Rate, 1)))
	defer t.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			close(ticks)
			wg.Wait()
			return
		case <-t.C:
		}
		select {
		case ticks <- n:
		default: // every writer busy: the offered load is not met
		}
	}
}

// sample reads every replica's figures.
func (c *historyCluster) sample(at time.Duration) ([]EdgeHistorySample, error) {
	c.mu.Lock()
	writes := c.writes
	c.mu.Unlock()
	out := make([]EdgeHistorySample, len(c.procs))
	for i, p := range c.procs {
		if err := p.check(); err != nil {
			return nil, err
		}
		st, err := p.stats()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.name, err)
		}
		disk, err := dirBytes(c.dirs[i])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.name, err)
		}
		db, err := dirBytes(filepath.Join(c.dirs[i], "edge.db"))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.name, err)
		}
		anon, err := rssAnon(p.cmd.Process.Pid)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.name, err)
		}
		m, err := scrape(c.clients[i]+"/metrics", "aether_edge_dag_changes", "aether_edge_checkpoints_total")
		if err != nil {
			return nil, fmt.Errorf("%s: metrics: %w", p.name, err)
		}
		out[i] = EdgeHistorySample{Second: at.Seconds(), DiskBytes: disk, DBBytes: db, RSSBytes: st.RSSBytes, AnonBytes: anon,
			DAGChanges: m["aether_edge_dag_changes"], Checkpoints: m["aether_edge_checkpoints_total"], Writes: writes}
	}
	return out, nil
}

// rssAnon is RssAnon from /proc/<pid>/status: the resident memory that is
// the process's own (heap, stacks), without the pages of files it maps.
func rssAnon(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "RssAnon:"); ok {
			var kb int64
			if _, err := fmt.Sscanf(strings.TrimSpace(v), "%d kB", &kb); err != nil {
				return 0, fmt.Errorf("/proc/%d/status: %q: %w", pid, line, err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no RssAnon", pid)
}

// dirBytes is the disk space the files under dir (or the file dir) take: allocated blocks,
// as du counts them, not their apparent length (bbolt grows its file in
// 16 MiB steps of which only the pages written are allocated).
func dirBytes(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil // a WAL segment removed under the walk
			}
			return err
		}
		if d.IsDir() {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			if os.IsNotExist(err) {
				return nil
			}
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			n += st.Blocks * 512
		} else {
			n += fi.Size()
		}
		return nil
	})
	return n, err
}

func diskOf(s EdgeHistorySample) float64 { return float64(s.DiskBytes) }
func dbOf(s EdgeHistorySample) float64   { return float64(s.DBBytes) }
func rssOf(s EdgeHistorySample) float64  { return float64(s.RSSBytes) }
func anonOf(s EdgeHistorySample) float64 { return float64(s.AnonBytes) }
func dagOf(s EdgeHistorySample) float64  { return s.DAGChanges }

// maxOf is the largest of f over one sample's replicas.
func maxOf(ss []EdgeHistorySample, f func(EdgeHistorySample) float64) float64 {
	var m float64
	for _, s := range ss {
		m = max(m, f(s))
	}
	return m
}

func mib(b float64) string { return fmt.Sprintf("%.1f MiB", b/(1<<20)) }

// growth is how much f's largest replica value grew per minute over the
// second half of the run: what the run settles to, after the first
// checkpoints and compactions.
func (r EdgeHistoryRun) growth(f func(EdgeHistorySample) float64) float64 {
	n := len(r.Samples)
	if n < 3 {
		return 0
	}
	a, b := r.Samples[n/2], r.Samples[n-1]
	dt := b[0].Second - a[0].Second
	if dt <= 0 {
		return 0
	}
	return (maxOf(b, f) - maxOf(a, f)) / dt * 60
}

func (r Report) edgeHistoryMarkdown(b *strings.Builder) {
	e := r.EdgeHistory
	fmt.Fprintf(b, "### Edge store: bounded history, disk and memory under sustained writes (last run %s)\n\n", r.Date)
	fmt.Fprintf(b, "- Machine: %s\n- Command: `%s`\n- aether edge: this binary\n\n", r.Machine, r.Command)
	fmt.Fprintf(b, "Two fresh clusters of %d `aether edge` replicas run at once, each replica a process on this machine with its data in the system temporary directory; they differ only in `--history-gc`. Both get `--auto-compaction-mode periodic --auto-compaction-retention %s --checkpoint-changes %d`, and the same open-loop load for %.0f s: %d writes per second per cluster (a write is due every 1/%d s whether or not earlier ones returned), round robin over its replicas, over %d keys, %d-byte values, one write in %d a delete. Each replica applies every write of its cluster (its own and its peers'). Sampled %d times: the data dir's allocated bytes (as du counts them), the process's resident memory, and `aether_edge_dag_changes` (changes the sync log holds); the table shows the largest of the %d replicas at each time.\n\n",
		e.Replicas, time.Duration(e.RetentionSec*float64(time.Second)), e.CheckpointChanges, e.Seconds, e.Rate, e.Rate, e.Keys, e.ValueBytes, e.DeleteEvery, len(firstRun(e).Samples), e.Replicas)
	if e.LoadAvgBefore > 0 {
		fmt.Fprintf(b, "The machine's 1-minute load average was %.2f before and %.2f after (%d cores).\n\n", e.LoadAvgBefore, e.LoadAvgAfter, runtime.NumCPU())
	}
	var without, with *EdgeHistoryRun
	for i := range e.Runs {
		if e.Runs[i].HistoryGC {
			with = &e.Runs[i]
		} else {
			without = &e.Runs[i]
		}
	}
	if without == nil || with == nil {
		b.WriteString("(incomplete run: one of the clusters has no figures)\n")
		return
	}
	b.WriteString("Disk is the data dir, with the bbolt file's part in parentheses (the rest is the write-ahead log, whose segment is removed once it reaches 16 MiB and bbolt holds it: up to 16 MiB of it is history bbolt already has). RSS is VmRSS, with RssAnon (the heap, without the bbolt file's mapped pages) in parentheses.\n\n")
	b.WriteString("| time | disk, no GC | disk, GC | RSS, no GC | RSS, GC | sync log changes, no GC | sync log changes, GC | writes acked (no GC / GC) |\n|---|---|---|---|---|---|---|---|\n")
	n := min(len(without.Samples), len(with.Samples))
	for _, i := range tableRows(n, 11) {
		a, g := without.Samples[i], with.Samples[i]
		fmt.Fprintf(b, "| %.0f s | %s (%s) | %s (%s) | %s (%s) | %s (%s) | %.0f | %.0f | %d / %d |\n", a[0].Second,
			mib(maxOf(a, diskOf)), mib(maxOf(a, dbOf)), mib(maxOf(g, diskOf)), mib(maxOf(g, dbOf)),
			mib(maxOf(a, rssOf)), mib(maxOf(a, anonOf)), mib(maxOf(g, rssOf)), mib(maxOf(g, anonOf)),
			maxOf(a, dagOf), maxOf(g, dagOf), a[0].Writes, g[0].Writes)
	}
	ckpt := func(run *EdgeHistoryRun) float64 {
		return maxOf(run.Samples[len(run.Samples)-1], func(s EdgeHistorySample) float64 { return s.Checkpoints })
	}
	fmt.Fprintf(b, "\nAchieved: %.0f writes/s without GC (%d errors), %.0f writes/s with GC (%d errors); checkpoints per replica by the end: %.0f without GC, %.0f with.\n",
		without.Achieved, without.Errors, with.Achieved, with.Errors, ckpt(without), ckpt(with))
	fmt.Fprintf(b, "\nOver the second half of the run, per minute: disk %+.1f MiB without GC, %+.1f MiB with (bbolt file %+.1f, %+.1f); RSS %+.1f MiB without GC, %+.1f MiB with (RssAnon %+.1f, %+.1f).\n",
		without.growth(diskOf)/(1<<20), with.growth(diskOf)/(1<<20), without.growth(dbOf)/(1<<20), with.growth(dbOf)/(1<<20),
		without.growth(rssOf)/(1<<20), with.growth(rssOf)/(1<<20), without.growth(anonOf)/(1<<20), with.growth(anonOf)/(1<<20))
}

func firstRun(e *EdgeHistoryResult) EdgeHistoryRun {
	if len(e.Runs) == 0 {
		return EdgeHistoryRun{}
	}
	return e.Runs[0]
}

// tableRows picks at most max of n sample indexes, evenly, always the
// first and the last.
func tableRows(n, most int) []int {
	if n <= most {
		out := make([]int, n)
		for i := range out {
			out[i] = i
		}
		return out
	}
	out := make([]int, 0, most)
	for k := 0; k < most; k++ {
		out = append(out, k*(n-1)/(most-1))
	}
	return out
}
