// Package etcdcluster runs a real multi-member etcd cluster inside the test
// process, for tests of code that looks at membership (quorum, voters,
// sites). Tests that need only a key-value store should use etcdtest, which
// runs one member through the registrar's own start path.
//
// Invariants:
//
//   - Start(t, n) returns once all n members have joined one cluster, have a
//     leader and serve clients; members are named m0..m{n-1}, in that order
//     in Names, Endpoints and PeerURLs.
//   - Every member listens on free loopback ports and keeps its data in its
//     own t.TempDir(). Everything is stopped by t.Cleanup.
//   - etcd logs only errors, to t.Log, and nothing once the cluster is being
//     stopped (members report each other's shutdown as errors), so a passing
//     test prints nothing.
//   - Kill stops one member's raft at once, as a crash would (no leadership
//     transfer), keeping its data dir and ports; Restart brings it back on
//     them and returns once it serves again. The other members keep running
//     throughout. A killed member's client connections are not reset at
//     once: etcd closes them gracefully, for up to its request timeout (7s
//     here), so until then a client on it sees a member that does not
//     answer. Put a faultproxy in front of the member to reset them.
package etcdcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// startTimeout bounds the start of the whole cluster; a healthy one on
// loopback takes well under a second.
const startTimeout = 30 * time.Second

// portAttempts bounds restarts of the whole cluster when a port picked for a
// member was taken by someone else before etcd bound it.
const portAttempts = 3

// Cluster is a running n-member etcd cluster owned by a test.
type Cluster struct {
	members []*member
	logs    *logGate
	once    sync.Once

	// What every member is configured with, for Restart.
	initial string
	token   string
	logger  *zap.Logger

	mu sync.Mutex // guards member.etcd after Start
}

type member struct {
	name         string
	client, peer url.URL
	dir          string
	etcd         *embed.Etcd
	closed       chan struct{} // after Kill: closed once the killed etcd has released its ports
}

// Start starts an n-member cluster and stops it when the test ends.
func Start(t testing.TB, n int) *Cluster {
	t.Helper()
	if n < 1 {
		t.Fatalf("etcdcluster: %d members; need at least 1", n)
	}
	for attempt := 1; ; attempt++ {
		c, err := start(t, n)
		if err == nil {
			t.Cleanup(c.stop)
			return c
		}
		if errors.Is(err, syscall.EADDRINUSE) && attempt < portAttempts {
			t.Logf("etcdcluster: a picked port was taken before etcd bound it; retrying: %v", err)
			continue
		}
		t.Fatalf("etcdcluster: start %d members: %v", n, err)
	}
}

// Names are the member names, m0..m{n-1}.
func (c *Cluster) Names() []string {
	out := make([]string, len(c.members))
	for i, m := range c.members {
		out[i] = m.name
	}
	return out
}

// Endpoints are the members' client URLs, in member order.
func (c *Cluster) Endpoints() []string {
	out := make([]string, len(c.members))
	for i, m := range c.members {
		out[i] = m.client.String()
	}
	return out
}

// PeerURLs are the members' peer URLs, in member order.
func (c *Cluster) PeerURLs() []string {
	out := make([]string, len(c.members))
	for i, m := range c.members {
		out[i] = m.peer.String()
	}
	return out
}

func start(t testing.TB, n int) (*Cluster, error) {
	c := &Cluster{logs: &logGate{t: t}}
	c.logger = zap.New(&testCore{gate: c.logs})
	var initial []string
	for i := range n {
		m := &member{
			name:   fmt.Sprintf("m%d", i),
			client: url.URL{Scheme: "http", Host: freeAddr(t)},
			peer:   url.URL{Scheme: "http", Host: freeAddr(t)},
			dir:    t.TempDir(),
		}
		c.members = append(c.members, m)
		initial = append(initial, m.name+"="+m.peer.String())
	}
	// One token per cluster, so members of two tests' clusters that somehow
	// reach each other refuse to mix.
	c.token = "etcdcluster-" + c.members[0].peer.Port()
	c.initial = strings.Join(initial, ",")

	// Members are started one after the other, each once the previous one
	// serves its peer port: a new member first asks its peers whether it
	// was bootstrapped already, and a peer that has bound its port but does
	// not serve it yet makes that question wait for a timeout (1s each).
	// StartEtcd does not wait for the other members; readiness, which needs
	// a quorum, is awaited below.
	for _, m := range c.members {
		e, err := embed.StartEtcd(c.config(m))
		if err != nil {
			c.stop()
			return nil, fmt.Errorf("member %s: %w", m.name, err)
		}
		m.etcd = e
	}

	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	for _, m := range c.members {
		select {
		case <-m.etcd.Server.ReadyNotify():
		case err := <-m.etcd.Err():
			c.stop()
			return nil, fmt.Errorf("member %s: %w", m.name, err)
		case <-m.etcd.Server.StopNotify():
			c.stop()
			return nil, fmt.Errorf("member %s stopped before it was ready", m.name)
		case <-ctx.Done():
			c.stop()
			return nil, fmt.Errorf("member %s not ready within %s", m.name, startTimeout)
		}
	}
	return c, nil
}

// config is member m's configuration. A member restarted on its data dir
// ignores the initial cluster and rejoins as the member it was.
func (c *Cluster) config(m *member) *embed.Config {
	cfg := embed.NewConfig()
	cfg.Name = m.name
	cfg.Dir = m.dir
	cfg.ListenClientUrls = []url.URL{m.client}
	cfg.AdvertiseClientUrls = []url.URL{m.client}
	cfg.ListenPeerUrls = []url.URL{m.peer}
	cfg.AdvertisePeerUrls = []url.URL{m.peer}
	cfg.InitialCluster = c.initial
	cfg.InitialClusterToken = c.token
	cfg.ClusterState = embed.ClusterStateFlagNew
	cfg.Logger = "zap"
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(c.logger.With(zap.String("member", m.name)))
	// Loopback is fast; shorter raft timers make the first election
	// quick without making leadership flap under -race.
	cfg.TickMs = 50
	cfg.ElectionMs = 500
	return cfg
}

// Leader is the index of the member that the running members agree leads,
// or -1 if they do not agree (an election is under way).
func (c *Cluster) Leader() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	leader := -1
	for _, m := range c.members {
		if m.etcd == nil {
			continue
		}
		id := m.etcd.Server.Leader()
		j := slices.IndexFunc(c.members, func(o *member) bool { return o.etcd != nil && o.etcd.Server.MemberID() == id })
		if j < 0 || (leader >= 0 && leader != j) {
			return -1
		}
		leader = j
	}
	return leader
}

// Kill stops member i abruptly, as a crash would: raft stops at once (a
// leader hands nothing over), and its listeners close in the background.
// Its data dir and ports are kept for Restart. Killing a killed member does
// nothing.
func (c *Cluster) Kill(i int) {
	c.mu.Lock()
	m := c.members[i]
	e := m.etcd
	if e != nil {
		m.etcd, m.closed = nil, make(chan struct{})
	}
	closed := m.closed
	c.mu.Unlock()
	if e != nil {
		e.Server.HardStop()
		go func() { defer close(closed); e.Close() }()
	}
}

// Restart starts killed member i again on its data dir and ports, and
// returns once it serves clients (which needs a quorum). A port taken
// meanwhile by another socket is retried for a while.
func (c *Cluster) Restart(t testing.TB, i int) {
	t.Helper()
	m := c.members[i]
	c.mu.Lock()
	running, closed := m.etcd != nil, m.closed
	c.mu.Unlock()
	if running {
		t.Fatalf("etcdcluster: restart of %s, which runs", m.name)
	}
	<-closed // its ports are free
	var e *embed.Etcd
	for attempt := 1; ; attempt++ {
		var err error
		if e, err = embed.StartEtcd(c.config(m)); err == nil {
			break
		}
		if !errors.Is(err, syscall.EADDRINUSE) || attempt == 50 {
			t.Fatalf("etcdcluster: restart %s: %v", m.name, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		t.Fatalf("etcdcluster: restarted %s failed: %v", m.name, err)
	case <-time.After(startTimeout):
		e.Close()
		t.Fatalf("etcdcluster: restarted %s not ready within %s", m.name, startTimeout)
	}
	c.mu.Lock()
	m.etcd = e
	c.mu.Unlock()
}

// stop stops every member. Closing members gracefully while their peers
// are closing too takes seconds (a leader tries to hand over leadership to a
// member that is going away), so the raft side of every member is stopped
// hard first, all at once; then all members are closed at once. Close still
// spends about a second shutting down its peer server, so a whole stop
// takes about a second, whatever n.
func (c *Cluster) stop() {
	c.once.Do(func() {
		c.logs.close()
		c.mu.Lock()
		defer c.mu.Unlock()
		defer func() {
			for _, m := range c.members {
				if m.etcd == nil && m.closed != nil {
					<-m.closed // killed and not restarted
				}
			}
		}()
		var wg sync.WaitGroup
		for _, m := range c.members {
			if m.etcd != nil {
				wg.Go(m.etcd.Server.HardStop)
			}
		}
		wg.Wait()
		for _, m := range c.members {
			if m.etcd != nil {
				wg.Go(m.etcd.Close)
			}
		}
		wg.Wait()
	})
}

// freeAddr is a loopback host:port that was free a moment ago.
func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("etcdcluster: pick a free port: %v", err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// logGate sends etcd's log entries to t.Log until the cluster is being
// stopped, and drops them after that: members report each other's orderly
// shutdown as errors, and t.Log must not be called once the test has
// finished, which may be before etcd's last goroutine is gone.
type logGate struct {
	t      testing.TB
	mu     sync.RWMutex // held for reading while logging, for writing by close
	closed bool
}

func (g *logGate) log(format string, args ...any) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	if !g.closed {
		g.t.Logf(format, args...)
	}
}

// close returns once no entry is being logged; none is logged after it.
func (g *logGate) close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
}

// testCore is a zap core of error level and above writing to a logGate.
type testCore struct {
	gate   *logGate
	fields []zapcore.Field
}

func (c *testCore) Enabled(l zapcore.Level) bool { return l >= zapcore.ErrorLevel }

func (c *testCore) With(fields []zapcore.Field) zapcore.Core {
	return &testCore{gate: c.gate, fields: append(append([]zapcore.Field(nil), c.fields...), fields...)}
}

func (c *testCore) Check(ent zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(ent.Level) {
		return ce.AddCore(ent, c)
	}
	return ce
}

func (c *testCore) Write(ent zapcore.Entry, fields []zapcore.Field) error {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range c.fields {
		f.AddTo(enc)
	}
	for _, f := range fields {
		f.AddTo(enc)
	}
	c.gate.log("etcd %s: %s %v", ent.Level, ent.Message, enc.Fields)
	return nil
}

func (c *testCore) Sync() error { return nil }
