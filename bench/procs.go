package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Child processes of the harness (an etcd, an etcd gRPC proxy, registrars),
// run apart from the load generator so that each one's CPU time and memory
// can be read from /proc.

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat:
// 100 on every Linux architecture Go supports.
const clockTicks = 100

// proc is a child process.
type proc struct {
	name   string
	cmd    *exec.Cmd
	logs   *tailBuffer
	exited chan struct{}
	err    error // the exit status, once exited is closed
	dir    string
}

// procStats are a process's resource figures as /proc reports them.
type procStats struct {
	CPUSec   float64 // user plus system CPU time, since it started
	RSSBytes int64   // resident set now (VmRSS)
	PeakRSS  int64   // high-water mark of the resident set (VmHWM)
}

// startProc starts bin with args; dir, if set, is removed when it stops.
// Its output is kept (the end of it) for error messages. The environment
// is the harness's, minus AETHER_* and ETCD_* variables, which the aether
// CLI and etcd would take as flag values.
func startProc(name, dir, bin string, args ...string) (*proc, error) {
	p := &proc{name: name, logs: &tailBuffer{max: 64 << 10}, exited: make(chan struct{}), dir: dir}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AETHER_") && !strings.HasPrefix(kv, "ETCD_") {
			p.cmd.Env = append(p.cmd.Env, kv)
		}
	}
	dieWithHarness(p.cmd)
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// check reports an error with the end of the output if the process ended.
func (p *proc) check() error {
	select {
	case <-p.exited:
		return fmt.Errorf("%s exited (%v): %s", p.name, p.err, p.logs.last(2000))
	default:
		return nil
	}
}

// stats reads the process's CPU time and memory.
func (p *proc) stats() (procStats, error) {
	return pidStats(p.cmd.Process.Pid)
}

// pidStats reads /proc/<pid>/stat and /proc/<pid>/status.
func pidStats(pid int) (procStats, error) {
	var s procStats
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, err
	}
	// The command name (field 2) is in parentheses and may hold spaces;
	// the fields after it start with the state (field 3).
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return s, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return s, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64) // field 14
	stime, err2 := strconv.ParseInt(f[12], 10, 64) // field 15
	if err := errors.Join(err1, err2); err != nil {
		return s, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	s.CPUSec = float64(utime+stime) / clockTicks
	st, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, err
	}
	defer st.Close()
	sc := bufio.NewScanner(st)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		var kb int64
		if _, err := fmt.Sscanf(strings.TrimSpace(v), "%d kB", &kb); err != nil {
			continue
		}
		switch k {
		case "VmRSS":
			s.RSSBytes = kb << 10
		case "VmHWM":
			s.PeakRSS = kb << 10
		}
	}
	return s, sc.Err()
}

// selfStats are the harness's own figures (the load generator).
func selfStats() procStats {
	s, _ := pidStats(os.Getpid())
	return s
}

// stop ends the process: SIGTERM, then SIGKILL after grace. It removes the
// process's directory.
func (p *proc) stop(grace time.Duration) {
	if p == nil {
		return
	}
	select {
	case <-p.exited:
	default:
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(grace):
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	}
	if p.dir != "" {
		os.RemoveAll(p.dir)
	}
}

// waitUntil polls ready every 50 ms until it returns nil, the process
// exits, or timeout passes.
func (p *proc) waitUntil(ctx context.Context, timeout time.Duration, ready func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := ready()
		if err == nil {
			return nil
		}
		if e := p.check(); e != nil {
			return e
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %v (%v): %s", p.name, timeout, err, p.logs.last(2000))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// freePorts returns n distinct free loopback ports. Another program may
// take one before the child binds it; the callers retry then.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// startRetrying runs start up to three times while the failure looks like
// a port another program took between freePorts and the child's bind.
func startRetrying[T any](start func() (T, error)) (T, error) {
	var v T
	var err error
	for range 3 {
		if v, err = start(); err == nil || !strings.Contains(err.Error(), "address already in use") {
			return v, err
		}
	}
	return v, err
}

var httpClient = &http.Client{Timeout: 10 * time.Second}

// httpOK gets url and wants 200.
func httpOK(url string) error {
	resp, err := httpClient.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}

// scrape reads a Prometheus text endpoint and returns the named metrics,
// each summed over its label sets.
func scrape(url string, names ...string) (map[string]float64, error) {
	resp, err := httpClient.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest, ok := strings.Cut(line, " ")
		if i := strings.IndexByte(name, '{'); i >= 0 {
			name = line[:i]
			if j := strings.LastIndexByte(line, '}'); j > i {
				rest, ok = strings.TrimSpace(line[j+1:]), true
			}
		}
		if !ok || !want[name] {
			continue
		}
		fs := strings.Fields(rest)
		if len(fs) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fs[0], 64)
		if err != nil {
			continue
		}
		out[name] += v
	}
	return out, sc.Err()
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

// last returns up to n bytes of the end of the output.
func (t *tailBuffer) last(n int) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := strings.TrimSpace(string(t.b))
	if len(s) > n {
		s = "..." + s[len(s)-n:]
	}
	return s
}

// lastMatching returns the last line of the output that contains sub.
func (t *tailBuffer) lastMatching(sub string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	lines := strings.Split(string(t.b), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], sub) {
			return strings.TrimSpace(lines[i])
		}
	}
	return ""
}

// etcdProc is a real etcd server, a single member on loopback with its own
// data directory.
type etcdProc struct {
	*proc
	url string // client URL, which also serves /metrics
}

func startEtcdProc(ctx context.Context, bin string) (*etcdProc, error) {
	return startRetrying(func() (*etcdProc, error) {
		dir, err := os.MkdirTemp("", "aether-bench-etcd-")
		if err != nil {
			return nil, err
		}
		ports, err := freePorts(2)
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		client := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
		peer := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
		args := []string{"--name", "bench", "--data-dir", filepath.Join(dir, "data"),
			"--listen-client-urls", client, "--advertise-client-urls", client,
			"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
			"--initial-cluster", "bench=" + peer, "--log-level", "warn"}
		if profileDir() != "" {
			args = append(args, "--enable-pprof")
		}
		p, err := startProc("etcd", dir, bin, args...)
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		e := &etcdProc{proc: p, url: client}
		if err := p.waitUntil(ctx, 30*time.Second, func() error { return httpOK(client + "/health") }); err != nil {
			p.stop(5 * time.Second)
			return nil, err
		}
		return e, nil
	})
}

// watches reads etcd's count of watchers (one per Watch a client opened)
// and of watch streams (the gRPC streams that carry them).
func (e *etcdProc) watches() (watchers, streams int, err error) {
	m, err := scrape(e.url+"/metrics", "etcd_debugging_mvcc_watcher_total", "etcd_debugging_mvcc_watch_stream_total")
	if err != nil {
		return 0, 0, err
	}
	return int(m["etcd_debugging_mvcc_watcher_total"]), int(m["etcd_debugging_mvcc_watch_stream_total"]), nil
}

// startGRPCProxy runs "etcd grpc-proxy start" in front of etcdURL; agents
// reach etcd through its address (host:port), which also serves /metrics.
func startGRPCProxy(ctx context.Context, bin, etcdURL string) (*proc, string, error) {
	type res struct {
		p    *proc
		addr string
	}
	r, err := startRetrying(func() (res, error) {
		dir, err := os.MkdirTemp("", "aether-bench-grpcproxy-")
		if err != nil {
			return res{}, err
		}
		ports, err := freePorts(1)
		if err != nil {
			os.RemoveAll(dir)
			return res{}, err
		}
		addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
		p, err := startProc("etcd grpc-proxy", dir, bin, "grpc-proxy", "start",
			"--endpoints", strings.TrimPrefix(etcdURL, "http://"), "--listen-addr", addr,
			"--advertise-client-url", addr, "--data-dir", filepath.Join(dir, "data"))
		if err != nil {
			os.RemoveAll(dir)
			return res{}, err
		}
		if err := p.waitUntil(ctx, 30*time.Second, func() error { return httpOK("http://" + addr + "/metrics") }); err != nil {
			p.stop(5 * time.Second)
			return res{}, err
		}
		return res{p, addr}, nil
	})
	return r.p, r.addr, err
}

// registrarProc is "aether registrar" as a process of its own on an
// external etcd.
type registrarProc struct {
	*proc
	grpcAddr, httpAddr string
}

func startRegistrarProc(ctx context.Context, bin, name, etcdURL string, extra ...string) (*registrarProc, error) {
	return startRetrying(func() (*registrarProc, error) {
		ports, err := freePorts(2)
		if err != nil {
			return nil, err
		}
		r := &registrarProc{grpcAddr: fmt.Sprintf("127.0.0.1:%d", ports[0]), httpAddr: fmt.Sprintf("127.0.0.1:%d", ports[1])}
		args := append([]string{"registrar", "--etcd-endpoints", etcdURL,
			"--grpc-addr", r.grpcAddr, "--http-addr", r.httpAddr, "--log-level", "warn"}, extra...)
		if profileDir() != "" {
			args = append(args, "--enable-pprof")
		}
		if r.proc, err = startProc(name, "", bin, args...); err != nil {
			return nil, err
		}
		if err := r.waitUntil(ctx, 60*time.Second, func() error { return httpOK("http://" + r.httpAddr + "/readyz") }); err != nil {
			r.stop(10 * time.Second)
			return nil, err
		}
		return r, nil
	})
}
