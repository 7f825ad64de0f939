package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"
)

// etcdctlToolsDir is the tools module, relative to the repository root,
// that pins the real etcdctl (go.etcd.io/etcd/etcdctl/v3).
const etcdctlToolsDir = "tools/etcdctl"

var etcdctlBuild struct {
	mu   sync.Mutex
	path string
	err  error
	done bool
}

// etcdctlBinary builds the real etcdctl from the tools module into a
// temporary directory, once per process. $AETHER_ETCDCTL names a prebuilt
// binary to use instead.
func etcdctlBinary(ctx context.Context) (string, error) {
	etcdctlBuild.mu.Lock()
	defer etcdctlBuild.mu.Unlock()
	if etcdctlBuild.done {
		return etcdctlBuild.path, etcdctlBuild.err
	}
	if p := os.Getenv("AETHER_ETCDCTL"); p != "" {
		etcdctlBuild.path, etcdctlBuild.done = p, true
		return p, nil
	}
	path, err := buildEtcdctl(ctx)
	if ctx.Err() == nil { // an interrupted build may be retried
		etcdctlBuild.path, etcdctlBuild.err, etcdctlBuild.done = path, err, true
	}
	return path, err
}

func buildEtcdctl(ctx context.Context) (string, error) {
	dir, err := findToolsDir()
	if err != nil {
		return "", err
	}
	out, err := os.MkdirTemp("", "aether-bench-etcdctl-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(out, "etcdctl")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "go.etcd.io/etcd/etcdctl/v3")
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		os.RemoveAll(out)
		return "", fmt.Errorf("go build etcdctl in %s: %v: %s", dir, err, strings.TrimSpace(stderr.String()))
	}
	return bin, nil
}

// findToolsDir finds tools/etcdctl in the working directory or one of its
// parents, or else next to this source file (go run, go test).
func findToolsDir() (string, error) {
	var tried []string
	if wd, err := os.Getwd(); err == nil {
		for d := wd; ; d = filepath.Dir(d) {
			c := filepath.Join(d, etcdctlToolsDir)
			tried = append(tried, c)
			if _, err := os.Stat(filepath.Join(c, "go.mod")); err == nil {
				return c, nil
			}
			if filepath.Dir(d) == d {
				break
			}
		}
	}
	if _, file, _, ok := runtime.Caller(0); ok {
		c := filepath.Join(filepath.Dir(file), "..", etcdctlToolsDir)
		if _, err := os.Stat(filepath.Join(c, "go.mod")); err == nil {
			return c, nil
		}
		tried = append(tried, c)
	}
	return "", fmt.Errorf("the tools module %s (go.mod) is not in %s; run from the repository or set AETHER_ETCDCTL", etcdctlToolsDir, strings.Join(tried, ", "))
}

// makeMirror runs "etcdctl make-mirror" from src's prefix into dest (the
// same prefix there) as a supervisor would: when it exits, it is started
// again a second later (systemd's Restart=always with RestartSec=1s).
type makeMirror struct {
	bin       string
	src, dest string
	prefix    string

	cancel context.CancelFunc
	done   chan struct{}

	mu    sync.Mutex
	exits []mirrorExit
}

type mirrorExit struct {
	At  time.Time
	Err string
}

const makeMirrorRestartDelay = time.Second

func startMakeMirror(ctx context.Context, bin, src, dest, prefix string) *makeMirror {
	ctx, cancel := context.WithCancel(ctx)
	m := &makeMirror{bin: bin, src: src, dest: dest, prefix: prefix, cancel: cancel, done: make(chan struct{})}
	go m.supervise(ctx)
	return m
}

func (m *makeMirror) supervise(ctx context.Context) {
	defer close(m.done)
	for ctx.Err() == nil {
		cmd := exec.CommandContext(ctx, m.bin, "make-mirror",
			"--endpoints", m.src, "--prefix", m.prefix, "--max-txn-ops", "128", m.dest)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		if ctx.Err() != nil {
			return
		}
		msg := lastLine(out.String())
		if msg == "" && err != nil {
			msg = err.Error()
		}
		m.mu.Lock()
		m.exits = append(m.exits, mirrorExit{At: time.Now(), Err: msg})
		m.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-time.After(makeMirrorRestartDelay):
		}
	}
}

// exitsSince lists the exits after t.
func (m *makeMirror) exitsSince(t time.Time) []mirrorExit {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []mirrorExit
	for _, e := range m.exits {
		if e.At.After(t) {
			out = append(out, e)
		}
	}
	return out
}

func (m *makeMirror) stop() {
	m.cancel()
	<-m.done
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if l := strings.TrimSpace(lines[i]); l != "" {
			return l
		}
	}
	return ""
}
