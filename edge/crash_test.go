package edge_test

// Crash recovery with the real binary and a real process: `aether edge`
// under a clientv3 write load is killed with SIGKILL, restarted on the same
// data dir, and must show every acknowledged write at the revision it was
// acknowledged with, keep its HashKV across a restart without writes, and
// let a watcher resume from where it was cut off with exactly the events
// after it.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// buildAether builds cmd/aether once per test binary run.
var buildAether = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "aether-crash-bin-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "aether")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/aethermesh/aether/cmd/aether").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bin, nil
})

// edgeProc is one running `aether edge` process.
type edgeProc struct {
	cmd      *exec.Cmd
	url      string
	exited   chan struct{}
	stderrMu sync.Mutex
	stderr   strings.Builder
}

// startEdge starts `aether edge` on dataDir with ephemeral ports (and
// extra flags) and returns once it logged etcd's ready line, whose
// client-urls give the port it got.
func startEdge(t *testing.T, bin, dataDir string, extra ...string) *edgeProc {
	t.Helper()
	return startEdgeArgs(t, bin, append([]string{
		"--name", "crash",
		"--data-dir", dataDir,
		"--listen-client-urls", "http://127.0.0.1:0",
		"--advertise-client-urls", "http://127.0.0.1:0",
		"--listen-peer-urls", "http://127.0.0.1:0",
		"--initial-advertise-peer-urls", "http://127.0.0.1:0",
		"--initial-cluster", "crash=http://127.0.0.1:0",
	}, extra...))
}

// startEdgeArgs starts `aether edge` with exactly args (one must give it
// an ephemeral client URL or the ready line names the one it has).
func startEdgeArgs(t *testing.T, bin string, args []string) *edgeProc {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"edge"}, args...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &edgeProc{cmd: cmd, exited: make(chan struct{})}
	ready := make(chan string, 1)
	go func() {
		defer close(p.exited)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<16), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			p.stderrMu.Lock()
			p.stderr.WriteString(line + "\n")
			p.stderrMu.Unlock()
			if !strings.Contains(line, "ready to serve client requests") {
				continue
			}
			var m struct {
				URLs []string `json:"client-urls"`
			}
			if json.Unmarshal([]byte(line), &m) == nil && len(m.URLs) > 0 {
				ready <- m.URLs[0]
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		_ = cmd.Wait()
	}()
	t.Cleanup(func() { p.kill(t) })
	select {
	case p.url = <-ready:
		return p
	case <-p.exited:
		t.Fatalf("aether edge exited before it was ready:\n%s", p.logs())
	case <-time.After(30 * time.Second):
		t.Fatalf("aether edge not ready after 30s:\n%s", p.logs())
	}
	return nil
}

func (p *edgeProc) logs() string {
	p.stderrMu.Lock()
	defer p.stderrMu.Unlock()
	return p.stderr.String()
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *edgeProc) kill(t *testing.T) {
	t.Helper()
	select {
	case <-p.exited:
		return
	default:
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Logf("kill: %v", err)
	}
	<-p.exited
}

func newClient(t *testing.T, url string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{url},
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// ackedPut is a Put the server acknowledged, with the revision it returned.
type ackedPut struct {
	key, value string
	rev        int64
}

// aetherBinary is the built binary for a test that runs it (skipped
// with -short).
func aetherBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the aether binary and runs it")
	}
	bin, err := buildAether()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// seededRand is a random source whose seed the test logs, to repeat a run.
func seededRand(t *testing.T) *rand.Rand {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	return rand.New(rand.NewPCG(seed, 0))
}

func TestCrashRecoveryKill9(t *testing.T) {
	bin := aetherBinary(t)
	dataDir := filepath.Join(t.TempDir(), "crash.etcd")
	p1 := startEdge(t, bin, dataDir)
	c1 := newClient(t, p1.url)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// A watcher from revision 1 records what it saw before the crash.
	var (
		seenMu sync.Mutex
		seen   []*clientv3.Event
	)
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		for resp := range c1.Watch(wctx, "k/", clientv3.WithPrefix(), clientv3.WithRev(1)) {
			seenMu.Lock()
			seen = append(seen, resp.Events...)
			seenMu.Unlock()
		}
	}()

	// Writers overwrite a small key space, so recovery must get versions
	// and create revisions right, not just the latest values.
	const killAfter = 3000
	acked := loadUntilKilled(ctx, t, p1, c1, 0, killAfter)
	wcancel()
	<-watchDone
	c1.Close()
	t.Logf("acknowledged %d puts before the kill; the watcher saw %d events", len(acked), len(seen))

	p2 := startEdge(t, bin, dataDir)
	c2 := newClient(t, p2.url)

	// Every acknowledged put, at its own revision.
	var maxRev int64
	for _, a := range acked {
		resp, err := c2.Get(ctx, a.key, clientv3.WithRev(a.rev))
		if err != nil {
			t.Fatalf("get %s at %d: %v", a.key, a.rev, err)
		}
		if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != a.value || resp.Kvs[0].ModRevision != a.rev {
			t.Fatalf("after restart %s at revision %d = %v, want %q modified at %d", a.key, a.rev, resp.Kvs, a.value, a.rev)
		}
		maxRev = max(maxRev, a.rev)
	}
	head, err := c2.Get(ctx, "k/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if head.Header.Revision < maxRev {
		t.Fatalf("recovered revision %d is before the acknowledged revision %d", head.Header.Revision, maxRev)
	}

	// The history is exactly one put per revision 2..head (revision 1 is
	// the empty store): a watch from revision 2 sees all of it, and every
	// event the watcher saw before the crash is in it unchanged.
	history := watchUntil(t, ctx, c2, 2, head.Header.Revision)
	for i, ev := range history {
		if want := int64(i + 2); ev.Kv.ModRevision != want || ev.Type != mvccpb.PUT {
			t.Fatalf("history event %d: %v at revision %d, want a put at %d", i, ev.Type, ev.Kv.ModRevision, want)
		}
	}
	for _, ev := range seen {
		h := history[ev.Kv.ModRevision-2]
		if string(h.Kv.Key) != string(ev.Kv.Key) || string(h.Kv.Value) != string(ev.Kv.Value) || h.Kv.Version != ev.Kv.Version || h.Kv.CreateRevision != ev.Kv.CreateRevision {
			t.Fatalf("the watcher saw %v before the crash; after it the history has %v", ev.Kv, h.Kv)
		}
	}

	// The cut-off watcher resumes after the last revision it saw and gets
	// exactly the events after it: no gap, no repeat.
	var last int64 = 1
	if len(seen) > 0 {
		last = seen[len(seen)-1].Kv.ModRevision
	}
	resumed := watchUntil(t, ctx, c2, last+1, head.Header.Revision)
	if want := int(head.Header.Revision - last); len(resumed) != want {
		t.Fatalf("resumed watch from %d got %d events, want %d", last+1, len(resumed), want)
	}
	for i, ev := range resumed {
		if ev.Kv.ModRevision != last+1+int64(i) {
			t.Fatalf("resumed event %d at revision %d, want %d", i, ev.Kv.ModRevision, last+1+int64(i))
		}
	}

	// No writes: HashKV and the data survive another kill and restart.
	hash1, err := c2.HashKV(ctx, p2.url, 0)
	if err != nil {
		t.Fatal(err)
	}
	c2.Close()
	p2.kill(t)
	p3 := startEdge(t, bin, dataDir)
	c3 := newClient(t, p3.url)
	hash2, err := c3.HashKV(ctx, p3.url, 0)
	if err != nil {
		t.Fatal(err)
	}
	if hash1.Hash != hash2.Hash || hash1.Header.Revision != hash2.Header.Revision || hash1.CompactRevision != hash2.CompactRevision {
		t.Fatalf("HashKV before restart %d at %d (compacted %d), after %d at %d (compacted %d)",
			hash1.Hash, hash1.Header.Revision, hash1.CompactRevision, hash2.Hash, hash2.Header.Revision, hash2.CompactRevision)
	}
	mid := (maxRev + 2) / 2
	h1mid, err := c3.HashKV(ctx, p3.url, mid)
	if err != nil {
		t.Fatal(err)
	}
	again, err := c3.Get(ctx, "k/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(again.Kvs) != len(head.Kvs) {
		t.Fatalf("%d keys before the restart, %d after", len(head.Kvs), len(again.Kvs))
	}
	for i := range head.Kvs {
		a, b := head.Kvs[i], again.Kvs[i]
		if string(a.Key) != string(b.Key) || string(a.Value) != string(b.Value) || a.ModRevision != b.ModRevision || a.CreateRevision != b.CreateRevision || a.Version != b.Version {
			t.Fatalf("key %s: %v before the restart, %v after", a.Key, a, b)
		}
	}
	// The hash at a past revision must be a function of that revision's
	// state: it differs from the head's (the load overwrote keys since).
	if h1mid.Hash == hash2.Hash {
		t.Errorf("HashKV at revision %d equals the head's: the hash does not depend on the revision", mid)
	}
	t.Logf("recovered revision %d; HashKV %d", head.Header.Revision, hash2.Hash)
}

// watchUntil watches "k/" from rev and returns the events up to and
// including revision until.
func watchUntil(t *testing.T, ctx context.Context, c *clientv3.Client, rev, until int64) []*clientv3.Event {
	t.Helper()
	if rev > until {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var out []*clientv3.Event
	for resp := range c.Watch(wctx, "k/", clientv3.WithPrefix(), clientv3.WithRev(rev)) {
		if err := resp.Err(); err != nil {
			t.Fatalf("watch from %d: %v", rev, err)
		}
		out = append(out, resp.Events...)
		if len(out) > 0 && out[len(out)-1].Kv.ModRevision >= until {
			return out
		}
	}
	t.Fatalf("watch from %d ended at %d events, before revision %d", rev, len(out), until)
	return nil
}
