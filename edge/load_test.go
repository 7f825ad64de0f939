package edge

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// TestLoadYCSBA is an opt-in smoke load (EDGE_LOAD=1): YCSB workload A's
// shape (50/50 read/update, uniform, 18-byte keys, 32-byte values) from 64
// clientv3 goroutines for a few seconds. The benchmark of record is
// go-ycsb's (bench edge scenario); this one exists to profile the shell.
func TestLoadYCSBA(t *testing.T) {
	if os.Getenv("EDGE_LOAD") == "" {
		t.Skip("set EDGE_LOAD=1 to run")
	}
	dir := ""
	if d := os.Getenv("EDGE_LOAD_DIR"); d != "" { // e.g. a tmpfs, as the benchmark of record uses
		var err error
		if dir, err = os.MkdirTemp(d, "edge-load"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
	}
	var c *clientv3.Client
	var s *Server
	if ep := os.Getenv("EDGE_LOAD_ENDPOINT"); ep != "" {
		// Another server (real etcd) under the same load, for comparison.
		var err error
		c, err = clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	} else {
		s = startServer(t, dir, nil)
		c = newClient(t, s)
	}
	ctx := testCtx(t)
	const keys = 1000
	threads := 64
	if n, err := strconv.Atoi(os.Getenv("EDGE_LOAD_THREADS")); err == nil && n > 0 {
		threads = n
	}
	key := func(i int) string { return fmt.Sprintf("user%014d", i) }
	val := string(make([]byte, 32))
	for i := range keys {
		if _, err := c.Put(ctx, key(i), val); err != nil {
			t.Fatal(err)
		}
	}
	var ru0 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	dur := 5 * time.Second
	deadline := time.Now().Add(dur)
	var mu sync.Mutex
	var lat []time.Duration
	var wg sync.WaitGroup
	for range threads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			for time.Now().Before(deadline) {
				k := key(rand.IntN(keys))
				st := time.Now()
				var err error
				if rand.IntN(2) == 0 {
					_, err = c.Get(ctx, k)
				} else {
					_, err = c.Put(ctx, k, val)
				}
				if err != nil {
					t.Error(err)
					return
				}
				mine = append(mine, time.Since(st))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	var ru1 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	cpu := time.Duration(ru1.Utime.Nano() + ru1.Stime.Nano() - ru0.Utime.Nano() - ru0.Stime.Nano())
	slices.Sort(lat)
	// CPU per operation (client and server together, they share the
	// process) is steadier than throughput on a shared machine.
	t.Logf("%d ops in %v: %.0f ops/s, p50 %v, p99 %v, cpu %v/op", len(lat), dur, float64(len(lat))/dur.Seconds(),
		lat[len(lat)/2], lat[len(lat)*99/100], cpu/time.Duration(len(lat)))
	if s == nil {
		return
	}
	mfs, _ := s.Registry().Gather()
	for _, mf := range mfs {
		if mf.GetName() == "aether_edge_commit_batch_changes" {
			h := mf.GetMetric()[0].GetHistogram()
			t.Logf("group commit: %d batches, %.1f changes per batch", h.GetSampleCount(), h.GetSampleSum()/float64(h.GetSampleCount()))
		}
	}
}
