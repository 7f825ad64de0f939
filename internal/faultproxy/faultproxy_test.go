package faultproxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// echoServer echoes every line back; it stands in for any TCP service.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = io.Copy(c, c)
				_ = c.Close()
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

func startProxy(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := Start(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("close proxy: %v", err)
		}
	})
	return p
}

func dial(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, bufio.NewReader(c)
}

// roundTrip sends a line and reads the echo within timeout.
func roundTrip(c net.Conn, r *bufio.Reader, msg string, timeout time.Duration) (string, error) {
	_ = c.SetDeadline(time.Now().Add(timeout))
	defer func() { _ = c.SetDeadline(time.Time{}) }()
	if _, err := io.WriteString(c, msg+"\n"); err != nil {
		return "", err
	}
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	return line[:len(line)-1], nil
}

func mustEcho(t *testing.T, c net.Conn, r *bufio.Reader, msg string) {
	t.Helper()
	got, err := roundTrip(c, r, msg, 2*time.Second)
	if err != nil {
		t.Fatalf("round trip %q: %v", msg, err)
	}
	if got != msg {
		t.Fatalf("echo = %q, want %q", got, msg)
	}
}

// expectReset dials addr and expects the connection to be reset or closed,
// not to time out. The reset may already fail the dial: the kernel completes
// the handshake before the proxy accepts and resets.
func expectReset(t *testing.T, addr, what string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		if isTimeout(err) {
			t.Fatalf("%s: dial timed out, want a reset", what)
		}
		return
	}
	defer c.Close()
	if _, err := roundTrip(c, bufio.NewReader(c), "x", 2*time.Second); err == nil || isTimeout(err) {
		t.Fatalf("%s: err = %v, want a reset/EOF", what, err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestForwards(t *testing.T) {
	p := startProxy(t, echoServer(t))
	c, r := dial(t, p.Addr())
	mustEcho(t, c, r, "hello")
	mustEcho(t, c, r, "again")
}

func TestCutResetsOpenAndNewConnectionsUntilHeal(t *testing.T) {
	p := startProxy(t, echoServer(t))
	c, r := dial(t, p.Addr())
	mustEcho(t, c, r, "before")

	p.Cut()
	if _, err := roundTrip(c, r, "during", 2*time.Second); err == nil || isTimeout(err) {
		t.Fatalf("open connection after Cut: err = %v, want a reset/EOF, not success or timeout", err)
	}
	expectReset(t, p.Addr(), "new connection during Cut")

	p.Heal()
	if _, err := roundTrip(c, r, "still-cut", 2*time.Second); err == nil {
		t.Fatal("a connection that was cut works again after Heal")
	}
	c3, r3 := dial(t, p.Addr())
	mustEcho(t, c3, r3, "after")
}

func TestBlackholeHoldsTrafficAndHealDeliversIt(t *testing.T) {
	p := startProxy(t, echoServer(t))
	c, r := dial(t, p.Addr())
	mustEcho(t, c, r, "before")

	p.Blackhole()
	if _, err := roundTrip(c, r, "held", 200*time.Millisecond); !isTimeout(err) {
		t.Fatalf("open connection during Blackhole: err = %v, want a timeout", err)
	}
	c2, r2 := dial(t, p.Addr())
	if _, err := roundTrip(c2, r2, "held-new", 200*time.Millisecond); !isTimeout(err) {
		t.Fatalf("new connection during Blackhole: err = %v, want a timeout", err)
	}

	p.Heal()
	// What was written during the partition arrives once it heals, and
	// the connections carry on.
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if line, err := r.ReadString('\n'); err != nil || line != "held\n" {
		t.Fatalf("held data after Heal = %q, %v; want \"held\\n\"", line, err)
	}
	mustEcho(t, c, r, "after")
	_ = c2.SetReadDeadline(time.Now().Add(2 * time.Second))
	if line, err := r2.ReadString('\n'); err != nil || line != "held-new\n" {
		t.Fatalf("held data on new conn after Heal = %q, %v", line, err)
	}
	mustEcho(t, c2, r2, "after-new")
}

func TestLatencyDelaysBothDirections(t *testing.T) {
	p := startProxy(t, echoServer(t))
	c, r := dial(t, p.Addr())
	mustEcho(t, c, r, "warm")

	const d = 100 * time.Millisecond
	p.SetLatency(d)
	start := time.Now()
	mustEcho(t, c, r, "slow")
	if rtt := time.Since(start); rtt < 2*d {
		t.Fatalf("round trip took %v, want >= %v (latency each way)", rtt, 2*d)
	}

	p.SetLatency(0)
	start = time.Now()
	mustEcho(t, c, r, "fast")
	if rtt := time.Since(start); rtt >= 2*d {
		t.Fatalf("round trip after SetLatency(0) took %v", rtt)
	}
}

func TestTargetDownResetsClient(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	target := ln.Addr().String()
	_ = ln.Close()
	p := startProxy(t, target)
	expectReset(t, p.Addr(), "proxy to a dead target")
}

func TestCloseWaitsAndIsIdempotent(t *testing.T) {
	p, err := Start(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	c, r := dial(t, p.Addr())
	mustEcho(t, c, r, "x")
	p.Blackhole() // a parked goroutine must not keep Close from returning
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), 200*time.Millisecond); err == nil {
		t.Fatal("proxy still accepts after Close")
	}
}
