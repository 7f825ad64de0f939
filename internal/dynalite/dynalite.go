// Package dynalite runs a dynalite (npm dynalite@4.0.0, a DynamoDB
// implementation on LevelDB) as a process on a free loopback port, in
// memory, behind a shield: a real DynamoDB-compatible HTTP server for the
// tests (through internal/testutil/dynalite) and for `aether bench`,
// which ships in the aether binary and so must not link test packages.
//
// The shield exists because dynalite 4.0.0 on Node 20 crashes the whole
// server when a client aborts a request before its answer is sent (its
// request handler rethrows the "aborted" error): every registrar that
// closes with a poll in flight, or a request that times out, would take
// the table down for every other client. The shield reads each request
// whole, forwards it on a context the client's cancellation does not
// reach, and drops the answer if the client has gone. So dynalite never
// sees an abort; a client sees exactly what it would see of DynamoDB.
package dynalite

import (
	"bytes"
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
	"sync"
	"syscall"
	"time"

	"github.com/aethermesh/aether/internal/tailbuf"
)

// InstallHint is the command that installs dynalite where Path looks.
const InstallHint = "npm install --prefix \"$HOME/.cache/aether-dynalite\" dynalite@4.0.0 (what .ci/run does), or set AETHER_DYNALITE to its binary"

// Path finds the dynalite binary: $AETHER_DYNALITE, then `dynalite` on
// PATH, then where .ci/run installs it ($HOME/.cache/aether-dynalite).
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
	return "", fmt.Errorf("dynalite not found: install it: %s", InstallHint)
}

// Server is a running dynalite and its shield.
type Server struct {
	Endpoint string // http://127.0.0.1:PORT, the shield's
	cmd      *exec.Cmd
	out      *tailbuf.Buffer
	done     chan struct{}
	shield   *http.Server
	client   *http.Client // the shield's, to dynalite
	shieldWG sync.WaitGroup
	stopOnce sync.Once
}

// Start runs dynalite (the binary Path finds) with extra flags args (e.g.
// "--maxItemSizeKb", "8"), retrying a few times if its port is taken
// between probe and bind.
func Start(args ...string) (*Server, error) {
	bin, err := Path()
	if err != nil {
		return nil, err
	}
	var last error
	for range 5 {
		s, err := start(bin, args)
		if err == nil {
			return s, nil
		}
		last = err
	}
	return nil, fmt.Errorf("starting dynalite (%s): %w", bin, last)
}

func start(bin string, extra []string) (*Server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	out := &tailbuf.Buffer{}
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
	s := &Server{cmd: cmd, out: out, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(s.done) }()
	target := fmt.Sprintf("127.0.0.1:%d", port)
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", target, 200*time.Millisecond)
		if err == nil {
			c.Close()
			break
		}
		select {
		case <-s.done:
			return nil, fmt.Errorf("dynalite exited: %s", out.String())
		default:
		}
		if time.Now().After(deadline) {
			s.kill()
			return nil, fmt.Errorf("dynalite did not listen on %d within 20s: %s", port, out.String())
		}
		time.Sleep(20 * time.Millisecond) // polling the condition (the port accepting), with the deadline above
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		s.kill()
		return nil, err
	}
	s.Endpoint = "http://" + l.Addr().String()
	s.client = &http.Client{}
	s.shield = &http.Server{Handler: &shield{target: "http://" + target, client: s.client}, ReadHeaderTimeout: 10 * time.Second}
	s.shieldWG.Add(1)
	go func() { defer s.shieldWG.Done(); _ = s.shield.Serve(l) }()
	return s, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Done is closed when the dynalite process has exited.
func (s *Server) Done() <-chan struct{} { return s.done }

// Output is what dynalite has printed.
func (s *Server) Output() string { return s.out.String() }

// Stop kills dynalite and closes the shield (a client then sees the
// connection refused, as of a server that is down). Safe to call twice.
func (s *Server) Stop() {
	s.stopOnce.Do(func() {
		s.kill()
		// With dynalite gone every forward in flight fails at once, so
		// Shutdown's wait for the handlers is short; Close is the bound.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if s.shield.Shutdown(ctx) != nil {
			_ = s.shield.Close()
		}
		s.shieldWG.Wait()
		s.client.CloseIdleConnections()
	})
}

func (s *Server) kill() {
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.done
}

// shield forwards whole requests to dynalite on a context of their own.
type shield struct {
	target string
	client *http.Client
}

// forwardTimeout bounds a forwarded request whose client has gone: long
// enough for any dynalite answer, short enough that a hung one does not
// hold the goroutine for ever.
const forwardTimeout = time.Minute

func (h *shield) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return // the client went before sending its request: nothing reaches dynalite
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), forwardTimeout)
	defer cancel()
	out, err := http.NewRequestWithContext(ctx, r.Method, h.target+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	out.Header = r.Header.Clone()
	out.Host = r.Host
	resp, err := h.client.Do(out)
	if err != nil {
		// dynalite is down (Stop raced with the request, or it died).
		http.Error(w, "dynalite unreachable: "+err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	if err != nil && !errors.Is(err, io.EOF) {
		http.Error(w, "dynalite answer cut: "+err.Error(), http.StatusBadGateway)
		return
	}
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(answer) // a client that has gone simply misses it
}
