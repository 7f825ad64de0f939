// Package etcdtest runs a real single-member etcd for tests, through the same
// embedetcd package the registrar uses, so tests exercise the production
// start path rather than a stand-in.
//
// Invariants:
//
//   - A Cluster keeps its data dir and its client and peer ports for its
//     whole life: Stop then Restart brings back the same data at the same
//     Endpoints, which is how a test makes "etcd unavailable, then back"
//     without its clients having to be rebuilt. While it is stopped its
//     ports stay reserved (bound, not listening: connections are refused),
//     so tests running in parallel cannot be given them meanwhile.
//   - Everything a Cluster or Client starts is stopped by t.Cleanup; a test
//     never has to close anything itself.
//   - Clients made here reconnect within about half a second once etcd is
//     reachable again, instead of gRPC's default backoff of up to two
//     minutes, so fault tests stay fast.
package etcdtest

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/aethermesh/aether/backend/etcd/embedetcd"
)

// startTimeout bounds one start of the member; a healthy one takes a few
// hundred milliseconds.
const startTimeout = 20 * time.Second

// startAttempts bounds retries of a start that lost its ports to another
// socket.
const startAttempts = 3

// Cluster is one embedded etcd member owned by a test.
type Cluster struct {
	cfg       embedetcd.Config
	endpoints []string

	mu       sync.Mutex
	srv      *embedetcd.Server // nil while stopped
	reserved []func()          // while stopped: releases the ports' reservations
}

// Start starts a member in t.TempDir() on free loopback ports and stops it
// when the test ends.
func Start(t testing.TB) *Cluster {
	t.Helper()
	c := &Cluster{
		cfg: embedetcd.Config{
			Dir:    t.TempDir(),
			Name:   "etcdtest",
			Logger: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
		},
	}
	for attempt := 1; ; attempt++ {
		// Ports are chosen here, not by embedetcd's port 0, because
		// Restart must come back on the very same ones. A port picked
		// here can still be taken before etcd binds it (every client
		// connection of every test process draws from the same ephemeral
		// range), so a lost race picks again.
		c.cfg.ClientAddr, c.cfg.PeerAddr = freePort(t), freePort(t)
		err := c.start()
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EADDRINUSE) || attempt == startAttempts {
			t.Fatalf("etcdtest: %v", err)
		}
	}
	c.endpoints = c.srv.Endpoints()
	t.Cleanup(func() {
		c.Stop()
		c.release()
	})
	return c
}

// Endpoints are the member's client URLs; they stay the same across
// Stop and Restart.
func (c *Cluster) Endpoints() []string { return append([]string(nil), c.endpoints...) }

// ClientAddr is the member's client host:port, e.g. for faultproxy.Start.
func (c *Cluster) ClientAddr() string { return c.cfg.ClientAddr }

// Client returns a client of the member that is closed when t ends.
func (c *Cluster) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	return NewClient(t, c.endpoints...)
}

// Stop stops the member, keeping its data dir and its ports. Clients stay
// open and see etcd as unavailable. Stopping a stopped member does
// nothing.
func (c *Cluster) Stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.srv == nil {
		return
	}
	c.srv.Close()
	c.srv = nil
	// Until Restart, a port free on this machine is one the kernel may
	// give the next socket that binds port 0, such as another test's
	// server. Reserving them keeps them this member's; a reservation that
	// fails leaves the port free, and Restart retries as before.
	for _, addr := range []string{c.cfg.ClientAddr, c.cfg.PeerAddr} {
		if release, err := reserve(addr); err == nil {
			c.reserved = append(c.reserved, release)
		}
	}
}

// release frees the ports a stopped member holds.
func (c *Cluster) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range c.reserved {
		r()
	}
	c.reserved = nil
}

// Restart starts the member again on the same data dir and ports. It
// stops the member first if it is running.
func (c *Cluster) Restart(t testing.TB) {
	t.Helper()
	c.Stop()
	c.release()
	for attempt := 1; ; attempt++ {
		err := c.start()
		if err == nil {
			return
		}
		// The ports are fixed now; if a client connection grabbed one
		// while etcd was down, it is released when that connection ends.
		if !errors.Is(err, syscall.EADDRINUSE) || attempt == startAttempts {
			t.Fatalf("etcdtest: restart: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (c *Cluster) start() error {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	srv, err := embedetcd.Start(ctx, c.cfg)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.srv = srv
	c.mu.Unlock()
	return nil
}

// NewClient returns a client for endpoints (host:port or URLs, e.g. a fault
// proxy's address) that is closed when t ends. It does not wait for a
// connection, so it works while etcd or the path to it is down.
func NewClient(t testing.TB, endpoints ...string) *clientv3.Client {
	t.Helper()
	eps := make([]string, len(endpoints))
	for i, ep := range endpoints {
		if !strings.Contains(ep, "://") {
			ep = "http://" + ep
		}
		eps[i] = ep
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   eps,
		DialTimeout: 2 * time.Second,
		// The client logs every retried call at warn; fault tests retry by
		// design, so its log would only bury the test's own output.
		Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 500 * time.Millisecond},
			MinConnectTimeout: time.Second,
		})},
	})
	if err != nil {
		t.Fatalf("etcdtest: client for %v: %v", eps, err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

func freePort(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("etcdtest: pick a free port: %v", err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// testWriter sends log lines to t.Log, so they show only for failing or
// verbose tests and are attributed to the right test.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
