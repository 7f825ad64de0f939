// Package faultproxy is a user-space TCP proxy that injects network faults:
// connection resets, partitions and latency. The test kernel has no netem, so
// faults are made one hop above the kernel instead.
//
// It lives outside internal/testutil because the benchmark harness, which
// ships in the aether binary, partitions etcd through it at run time; the
// binary must not link packages written only for tests.
//
// Invariants:
//
//   - A Proxy is always in exactly one mode: forwarding, cut or blackholed.
//     Mode changes apply to open connections at once: Cut resets every open
//     connection; Blackhole stops forwarding on all of them without closing
//     anything; Heal resumes forwarding on the blackholed ones. A connection
//     that was cut stays cut.
//   - Bytes on one connection are forwarded in order, each chunk delayed by
//     the latency in force when it was read. Nothing read is ever dropped
//     while the connection lives: a chunk read during a blackhole is written
//     after Heal, as TCP would retransmit it after a partition ends.
//   - Close stops everything and waits for every goroutine the proxy started,
//     so a test that closes its proxy leaks nothing.
package faultproxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

type mode int

const (
	forwarding mode = iota
	cut
	blackholed
)

// Proxy forwards TCP connections from Addr to a target, with faults on demand.
type Proxy struct {
	target string
	ln     net.Listener

	mu      sync.Mutex
	mode    mode
	latency time.Duration
	// changed is closed and replaced on every mode change, so goroutines
	// parked on a blackhole can select on it alongside their own shutdown.
	changed chan struct{}
	links   map[*link]struct{}
	closed  bool

	wg sync.WaitGroup
}

// link is one proxied connection: the accepted client side and, once dialled,
// the target side.
type link struct {
	client net.Conn
	done   chan struct{} // closed by shutdown
	once   sync.Once

	mu     sync.Mutex
	server net.Conn
}

// Start listens on 127.0.0.1 at a free port and forwards every accepted
// connection to target.
func Start(target string) (*Proxy, error) { return StartOn("127.0.0.1:0", target) }

// StartOn is Start listening on addr instead: the benchmark harness puts
// proxies on a bridge address that processes in other network namespaces
// can reach, where loopback is private to each namespace.
func StartOn(addr, target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen on %s for target %s: %w", addr, target, err)
	}
	p := &Proxy{
		target:  target,
		ln:      ln,
		changed: make(chan struct{}),
		links:   make(map[*link]struct{}),
	}
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// Addr is the host:port clients dial instead of the target.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Cut resets every open connection and every new one until Heal, like a
// peer that has restarted: both sides see a reset, not a timeout.
func (p *Proxy) Cut() {
	p.mu.Lock()
	p.setModeLocked(cut)
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	for _, l := range links {
		l.shutdown(true)
	}
}

// Blackhole stops forwarding in both directions without closing anything,
// like a network partition: each side sees its peer go silent and only
// timeouts or keepalives can tell it something is wrong.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	p.setModeLocked(blackholed)
	p.mu.Unlock()
}

// Heal resumes forwarding: new connections are proxied again and blackholed
// ones deliver what they held back. Connections that were cut stay closed.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.setModeLocked(forwarding)
	p.mu.Unlock()
}

// SetLatency delays each chunk by d in whichever direction it travels; a
// round trip through the proxy therefore costs at least 2*d.
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	p.latency = d
	p.mu.Unlock()
}

// Close stops accepting, closes every connection and waits for all of the
// proxy's goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()

	err := p.ln.Close()
	for _, l := range links {
		l.shutdown(false)
	}
	p.wg.Wait()
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("faultproxy: close listener %s: %w", p.Addr(), err)
	}
	return nil
}

func (p *Proxy) setModeLocked(m mode) {
	if p.mode == m {
		return
	}
	p.mode = m
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			// The listener only fails for good once Close has closed it;
			// anything else on loopback is transient (e.g. EMFILE).
			if p.isClosed() {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		l := &link{client: c, done: make(chan struct{})}
		p.mu.Lock()
		// Registering under the same lock Cut takes guarantees a connection
		// is either seen by Cut or sees the cut mode here; none slips through.
		if p.closed || p.mode == cut {
			p.mu.Unlock()
			l.shutdown(true)
			continue
		}
		p.links[l] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.serve(l)
	}
}

func (p *Proxy) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// gate blocks while the proxy is blackholed. It reports false if the link
// was shut down meanwhile.
func (p *Proxy) gate(l *link) bool {
	for {
		p.mu.Lock()
		m, ch := p.mode, p.changed
		p.mu.Unlock()
		if m != blackholed {
			return true
		}
		select {
		case <-ch:
		case <-l.done:
			return false
		}
	}
}

func (p *Proxy) serve(l *link) {
	defer p.wg.Done()
	defer func() {
		l.shutdown(false)
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
	}()

	// During a partition the target must not even see the connection, so
	// the dial waits for the blackhole to lift.
	if !p.gate(l) {
		return
	}
	server, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		// Target down: the client sees the same reset a dead peer gives.
		l.shutdown(true)
		return
	}
	if !l.setServer(server) {
		return
	}

	var pumps sync.WaitGroup
	pumps.Add(2)
	go func() { defer pumps.Done(); p.pump(l, l.client, server) }()
	go func() { defer pumps.Done(); p.pump(l, server, l.client) }()
	pumps.Wait()
}

type chunk struct {
	data []byte
	due  time.Time
}

// pump copies src to dst. Reading and writing run in separate goroutines
// joined by a queue so that latency delays each chunk without capping
// throughput at one chunk per latency period.
func (p *Proxy) pump(l *link, src, dst net.Conn) {
	q := make(chan chunk, 64)
	readDone := make(chan struct{})
	var readErr error // written before readDone closes
	go func() {
		defer close(readDone)
		defer close(q)
		// One read buffer, and each chunk a copy of what was read: a
		// fresh 32 KiB buffer per read made a proxy carrying many small
		// messages (the edge-scale benchmark's sync traffic) allocate
		// megabytes a second, and its garbage collection took CPU from
		// the servers under test on the same cores.
		buf := make([]byte, 32*1024)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				p.mu.Lock()
				d := p.latency
				p.mu.Unlock()
				select {
				case q <- chunk{data: bytes.Clone(buf[:n]), due: time.Now().Add(d)}:
				case <-l.done:
					readErr = net.ErrClosed
					return
				}
			}
			if err != nil {
				readErr = err
				return
			}
		}
	}()

	for c := range q {
		if !sleepUntil(c.due, l.done) || !p.gate(l) {
			l.shutdown(false)
			break
		}
		if _, err := dst.Write(c.data); err != nil {
			l.shutdown(false)
			break
		}
	}
	<-readDone
	if errors.Is(readErr, io.EOF) {
		// Pass a clean half-close on, so protocols that finish one
		// direction first keep working; the other pump still runs.
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		return
	}
	// Anything but EOF means the connection is broken: tear down both
	// sides rather than leave the other direction half alive.
	l.shutdown(false)
}

func sleepUntil(t time.Time, done <-chan struct{}) bool {
	d := time.Until(t)
	if d <= 0 {
		select {
		case <-done:
			return false
		default:
			return true
		}
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-done:
		return false
	}
}

// setServer records the dialled target side; it reports false (and closes
// server) if the link was shut down while dialling.
func (l *link) setServer(server net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.done:
		_ = server.Close()
		return false
	default:
	}
	l.server = server
	return true
}

// shutdown closes both sides once. With reset, linger 0 makes the kernel send
// RST instead of FIN, which is what a crashed or restarted peer looks like.
func (l *link) shutdown(reset bool) {
	l.once.Do(func() {
		l.mu.Lock()
		close(l.done)
		server := l.server
		l.mu.Unlock()
		for _, c := range []net.Conn{l.client, server} {
			if c == nil {
				continue
			}
			if tc, ok := c.(*net.TCPConn); ok && reset {
				_ = tc.SetLinger(0)
			}
			_ = c.Close()
		}
	})
}
