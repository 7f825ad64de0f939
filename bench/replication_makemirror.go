package bench

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"sync"
	"time"
)

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
