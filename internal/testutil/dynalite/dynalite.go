// Package dynalite starts a dynalite (npm dynalite@4.0.0, a DynamoDB
// implementation on LevelDB) for a test: a real DynamoDB-compatible HTTP
// server on a free loopback port, in memory, stopped at the test's end.
//
// The binary is found as $AETHER_DYNALITE, then `dynalite` on PATH, then
// where .ci/run installs it ($HOME/.cache/aether-dynalite). A test that
// needs it and cannot find it fails, naming the install command: the
// DynamoDB backend's tests are the point, so they never skip silently.
package dynalite

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// InstallHint is the command that installs dynalite where Path looks.
const InstallHint = "npm install --prefix \"$HOME/.cache/aether-dynalite\" dynalite@4.0.0 (what .ci/run does), or set AETHER_DYNALITE to its binary"

// Path finds the dynalite binary.
func Path() (string, error) {
	if p := os.Getenv("AETHER_DYNALITE"); p != "" {
		return p, nil
	}
	if p, err := exec.LookPath("dynalite"); err == nil {
		return p, nil
	}
	home, _ := os.UserHomeDir()
	p := filepath.Join(home, ".cache", "aether-dynalite", "node_modules", ".bin", "dynalite")
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	return "", errors.New("dynalite not found")
}

// Server is a running dynalite.
type Server struct {
	Endpoint string // http://127.0.0.1:PORT
	cmd      *exec.Cmd
	out      *syncBuffer
	done     chan struct{}
	stopped  atomic.Bool
}

// Start runs a dynalite for t and stops it when t ends; args are more of
// its flags (e.g. "--maxItemSizeKb", "8").
func Start(t testing.TB, args ...string) *Server {
	t.Helper()
	bin, err := Path()
	if err != nil {
		t.Fatalf("%v: install it: %s", err, InstallHint)
	}
	var last error
	for range 5 {
		s, err := start(bin, args)
		if err == nil {
			t.Cleanup(func() {
				select {
				case <-s.done:
					if s.stopped.Load() {
						return // stopped by the test
					}
					// It died under the test: that is the failure to see.
					t.Errorf("dynalite exited during the test: %s", s.out.String())
				default:
					if t.Failed() {
						t.Logf("dynalite output: %s", s.out.String())
					}
				}
				s.stop()
			})
			return s
		}
		last = err // most likely the port was taken between probe and bind
	}
	t.Fatalf("starting dynalite (%s): %v", bin, last)
	return nil
}

func start(bin string, extra []string) (*Server, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	out := &syncBuffer{}
	args := append([]string{"--host", "127.0.0.1", "--port", strconv.Itoa(port),
		"--createTableMs", "0", "--deleteTableMs", "0", "--updateTableMs", "0"}, extra...)
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = out, out
	// Its own process group, so stopping it also stops node under npx or
	// a shell wrapper.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &Server{Endpoint: fmt.Sprintf("http://127.0.0.1:%d", port), cmd: cmd, out: out, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(s.done) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 200*time.Millisecond)
		if err == nil {
			c.Close()
			return s, nil
		}
		select {
		case <-s.done:
			return nil, fmt.Errorf("dynalite exited: %s", out.String())
		default:
		}
		if time.Now().After(deadline) {
			s.stop()
			return nil, fmt.Errorf("dynalite did not listen on %d within 20s: %s", port, out.String())
		}
		time.Sleep(20 * time.Millisecond) // polling the condition (the port accepting), with the deadline above
	}
}

func (s *Server) stop() {
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.done
}

// Stop kills the server now (a table outage); the test's end does
// nothing more.
func (s *Server) Stop() {
	s.stopped.Store(true)
	s.stop()
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
