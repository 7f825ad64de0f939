package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
)

// goBinary is a program the harness runs as a process of its own, built
// from this repository's source once per process (or named, prebuilt, by an
// environment variable).
type goBinary struct {
	name string // file name, and in messages
	env  string // names a prebuilt binary to use instead
	dir  string // module directory, relative to the repository root
	pkg  string // what "go build" builds, run in dir
}

var (
	// etcdctlBin is the real etcdctl, pinned by the tools module
	// tools/etcdctl (go.etcd.io/etcd/etcdctl/v3).
	etcdctlBin = goBinary{name: "etcdctl", env: "AETHER_ETCDCTL", dir: "tools/etcdctl", pkg: "go.etcd.io/etcd/etcdctl/v3"}
	// etcdBin is the real etcd server (and "etcd grpc-proxy"), etcd's own
	// main built from the tools module tools/etcd (go.etcd.io/etcd/server/v3).
	etcdBin = goBinary{name: "etcd", env: "AETHER_ETCD", dir: "tools/etcd", pkg: "."}
	// aetherBin is this repository's CLI, for registrars run as processes.
	aetherBin = goBinary{name: "aether", env: "AETHER_BIN", dir: ".", pkg: "./cmd/aether"}
)

// etcdctlToolsDir is where etcdctl is built from, for messages.
var etcdctlToolsDir = etcdctlBin.dir

type buildResult struct {
	path string
	err  error
	dir  string // the temporary directory it was built in
}

var builds struct {
	mu   sync.Mutex
	done map[string]buildResult
}

// path returns the binary: the one $env names, or else one built into a
// temporary directory, once per process (an interrupted build is retried
// on the next call).
func (b goBinary) path(ctx context.Context) (string, error) {
	builds.mu.Lock()
	defer builds.mu.Unlock()
	if r, ok := builds.done[b.name]; ok {
		return r.path, r.err
	}
	if p := os.Getenv(b.env); p != "" {
		return p, nil
	}
	path, err := b.build(ctx)
	if ctx.Err() == nil {
		if builds.done == nil {
			builds.done = map[string]buildResult{}
		}
		builds.done[b.name] = buildResult{path: path, err: err, dir: filepath.Dir(path)}
	}
	return path, err
}

// removeBuilds deletes the binaries built so far; the next path builds
// again.
func removeBuilds() {
	builds.mu.Lock()
	defer builds.mu.Unlock()
	for _, r := range builds.done {
		if r.err == nil {
			os.RemoveAll(r.dir)
		}
	}
	builds.done = nil
}

// built reports whether path would return at once: a prebuilt binary is
// named, or a build already ended.
func (b goBinary) built() bool {
	builds.mu.Lock()
	defer builds.mu.Unlock()
	_, ok := builds.done[b.name]
	return ok || os.Getenv(b.env) != ""
}

func (b goBinary) build(ctx context.Context) (string, error) {
	root, err := repoRoot()
	if err != nil {
		return "", fmt.Errorf("%v; or set %s to a prebuilt %s", err, b.env, b.name)
	}
	dir := filepath.Join(root, b.dir)
	out, err := os.MkdirTemp("", "aether-bench-build-"+b.name+"-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(out, b.name)
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, b.pkg)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		os.RemoveAll(out)
		return "", fmt.Errorf("go build %s in %s: %v: %s", b.pkg, dir, err, strings.TrimSpace(stderr.String()))
	}
	return bin, nil
}

// etcdctlBinary is the real etcdctl (see etcdctlBin).
func etcdctlBinary(ctx context.Context) (string, error) { return etcdctlBin.path(ctx) }

// etcdBinary is the real etcd (see etcdBin).
func etcdBinary(ctx context.Context) (string, error) { return etcdBin.path(ctx) }

// aetherBinary is the aether CLI: $AETHER_BIN, else exe (the running
// program, when it is the CLI), else one built from ./cmd/aether.
func aetherBinary(ctx context.Context, exe string) (string, error) {
	if os.Getenv(aetherBin.env) == "" && exe != "" {
		return exe, nil
	}
	return aetherBin.path(ctx)
}

// mainModule is the module path of the repository root's go.mod.
const mainModule = "github.com/aethermesh/aether"

// repoRoot finds the repository: the working directory or one of its
// parents holding the main module's go.mod, or else the parent of this
// source file's directory (go run, go test).
func repoRoot() (string, error) {
	var tried []string
	isRoot := func(d string) bool {
		tried = append(tried, d)
		f, err := os.Open(filepath.Join(d, "go.mod"))
		if err != nil {
			return false
		}
		defer f.Close()
		s := bufio.NewScanner(f)
		for s.Scan() {
			if mod, ok := strings.CutPrefix(strings.TrimSpace(s.Text()), "module "); ok {
				return strings.TrimSpace(mod) == mainModule
			}
		}
		return false
	}
	if wd, err := os.Getwd(); err == nil {
		for d := wd; ; d = filepath.Dir(d) {
			if isRoot(d) {
				return d, nil
			}
			if filepath.Dir(d) == d {
				break
			}
		}
	}
	if _, file, _, ok := runtime.Caller(0); ok {
		if d := filepath.Join(filepath.Dir(file), ".."); isRoot(d) {
			return d, nil
		}
	}
	return "", fmt.Errorf("the repository (go.mod of %s) is not in %s; run from the repository", mainModule, strings.Join(tried, ", "))
}
