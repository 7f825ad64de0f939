// Package e2e runs the real aether binary as separate processes: a
// registrar on its embedded etcd, and the CLI against it, as a user would.
package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"github.com/aethermesh/aether/internal/testutil/logbuf"
	"github.com/aethermesh/aether/internal/testutil/wait"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var aetherBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "aether-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	aetherBin = filepath.Join(dir, "aether")
	build := exec.Command("go", "build", "-o", aetherBin, "../cmd/aether")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building aether:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

type registrarProc struct {
	cmd      *exec.Cmd
	grpcAddr string
	httpAddr string
	logs     *logbuf.Buffer
	exited   chan error
}

// startRegistrar runs "aether registrar" on an embedded etcd in dataDir and
// waits for /readyz.
func startRegistrar(t *testing.T, dataDir string, etcdAddr, peerAddr string) *registrarProc {
	t.Helper()
	p := &registrarProc{grpcAddr: freeAddr(t), httpAddr: freeAddr(t), logs: &logbuf.Buffer{}, exited: make(chan error, 1)}
	p.cmd = exec.Command(aetherBin, "registrar",
		"--data-dir", dataDir,
		"--embedded-etcd-addr", etcdAddr,
		"--embedded-etcd-peer-addr", peerAddr,
		"--grpc-addr", p.grpcAddr,
		"--http-addr", p.httpAddr,
		"--cluster-name", "east-1", "--region", "us-east", "--zone", "us-east-1a")
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	return p.launch(t)
}

// launch starts the prepared command and waits for /readyz.
func (p *registrarProc) launch(t *testing.T) *registrarProc {
	t.Helper()
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exited <- p.cmd.Wait() }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.exited
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + p.httpAddr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return p
			}
		}
		select {
		case err := <-p.exited:
			p.exited <- err
			t.Fatalf("registrar exited: %v\n%s", err, p.logs)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("registrar not ready after 30s\n%s", p.logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop sends SIGTERM and expects a clean exit.
func (p *registrarProc) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.exited:
		p.exited <- err // for Cleanup
		if err != nil {
			t.Fatalf("registrar exited with %v after SIGTERM\n%s", err, p.logs)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("registrar did not exit after SIGTERM\n%s", p.logs)
	}
}

func aether(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, aetherBin, args...).CombinedOutput()
	return string(out), err
}

func mustAether(t *testing.T, args ...string) string {
	t.Helper()
	out, err := aether(t, args...)
	if err != nil {
		t.Fatalf("aether %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func TestQuickstartRegisterListWatchDeregister(t *testing.T) {
	dir := t.TempDir()
	etcdAddr, peerAddr := freeAddr(t), freeAddr(t)
	p := startRegistrar(t, dir, etcdAddr, peerAddr)
	reg := "--registrar=" + p.grpcAddr

	// A watcher process, JSON lines, running across the whole scenario.
	wctx, wcancel := context.WithCancel(context.Background())
	defer wcancel()
	watchCmd := exec.CommandContext(wctx, aetherBin, "watch", reg, "--service", "web", "-o", "json")
	stdout, err := watchCmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := watchCmd.Start(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var lines []map[string]any
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var m map[string]any
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				t.Errorf("watch printed a non-JSON line %q: %v", sc.Text(), err)
				continue
			}
			mu.Lock()
			lines = append(lines, m)
			mu.Unlock()
		}
	}()
	seen := func(typ, ip string) bool {
		mu.Lock()
		defer mu.Unlock()
		for _, l := range lines {
			if l["type"] == typ {
				if e, ok := l["endpoint"].(map[string]any); ok && e["ip"] == ip {
					return true
				}
				if typ == "FULL_SNAPSHOT" {
					return true
				}
			}
		}
		return false
	}
	waitFor(t, "watch snapshot", func() bool { return seen("FULL_SNAPSHOT", "") })

	out := mustAether(t, "register", reg, "--service", "web", "--ip", "10.0.0.1", "--port", "8080", "--node", "node-a")
	if !strings.Contains(out, "registered web 10.0.0.1") {
		t.Fatalf("register printed %q", out)
	}
	mustAether(t, "register", reg, "--service", "web", "--ip", "10.0.0.2", "--port", "http=8080", "--port", "admin=9090", "--protocol", "h2c", "--node", "node-b")
	mustAether(t, "register", reg, "--service", "db", "--ip", "10.0.0.3", "--port", "5432", "--protocol", "tcp")
	waitFor(t, "watch sees both web endpoints", func() bool { return seen("ENDPOINT_ADDED", "10.0.0.1") && seen("ENDPOINT_ADDED", "10.0.0.2") })
	if seen("ENDPOINT_ADDED", "10.0.0.3") {
		t.Fatal("a watch of web received a db event")
	}

	table := mustAether(t, "list", reg)
	for _, want := range []string{"SERVICE", "web", "db", "10.0.0.2", "admin:9090", "east-1", "us-east"} {
		if !strings.Contains(table, want) {
			t.Fatalf("list table lacks %q:\n%s", want, table)
		}
	}
	var listed struct {
		Version   string           `json:"version"`
		Endpoints []map[string]any `json:"endpoints"`
	}
	if err := json.Unmarshal([]byte(mustAether(t, "list", reg, "--service", "web", "-o", "json")), &listed); err != nil {
		t.Fatal(err)
	}
	if len(listed.Endpoints) != 2 || listed.Version == "" {
		t.Fatalf("list -o json = %+v", listed)
	}

	mustAether(t, "deregister", reg, "--service", "web", "--ip", "10.0.0.1")
	waitFor(t, "watch sees removal", func() bool { return seen("ENDPOINT_REMOVED", "10.0.0.1") })

	// Errors name the problem and the fix, and exit non-zero.
	out, err = aether(t, "deregister", reg, "--service", "web", "--ip", "10.0.0.1")
	if err == nil || !strings.Contains(out, "not registered") {
		t.Fatalf("deregistering twice: err=%v out=%q", err, out)
	}
	out, err = aether(t, "register", reg, "--service", "web", "--ip", "10.0.0.9", "--port", "0")
	if err == nil || !strings.Contains(out, "--port 0") {
		t.Fatalf("port 0: err=%v out=%q", err, out)
	}
	out, err = aether(t, "list", "--registrar=127.0.0.1:1", "--timeout=2s")
	if err == nil || !strings.Contains(out, "cannot reach registrar") {
		t.Fatalf("unreachable registrar: err=%v out=%q", err, out)
	}

	// SIGTERM flushes and exits 0; a restart on the same data dir serves
	// the same endpoints.
	wcancel()
	p.stop(t)
	p2 := startRegistrar(t, dir, etcdAddr, peerAddr)
	out = mustAether(t, "list", "--registrar="+p2.grpcAddr, "-o", "json")
	if err := json.Unmarshal([]byte(out), &listed); err != nil {
		t.Fatal(err)
	}
	if len(listed.Endpoints) != 2 {
		t.Fatalf("after restart, %d endpoints listed, want 2:\n%s", len(listed.Endpoints), out)
	}
}

func TestRegistrarFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"registrar", "--write-batch-size", "-1"}, "--write-batch-size"},
		{[]string{"registrar", "--region", "a/b"}, "--region"},
		{[]string{"registrar", "--sync-interval", "soon"}, "--sync-interval"},
	} {
		out, err := aether(t, tc.args...)
		if err == nil || !strings.Contains(out, tc.want) {
			t.Errorf("aether %v: err=%v, output %q does not name %s", tc.args, err, out, tc.want)
		}
	}
	// A busy port is reported with the flag to change.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	out, err := aether(t, "registrar", "--data-dir", t.TempDir(), "--grpc-addr", l.Addr().String(), "--http-addr", "127.0.0.1:0")
	if err == nil || !strings.Contains(out, "--grpc-addr") {
		t.Fatalf("busy grpc port: err=%v out=%q", err, out)
	}
}

// waitFor is wait.For with the one deadline these tests' waits share.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	wait.For(t, what, 15*time.Second, cond)
}
