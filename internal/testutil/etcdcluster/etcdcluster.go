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
package etcdcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
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
}

type member struct {
	name         string
	client, peer url.URL
	dir          string
	etcd         *embed.Etcd
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
	token := "etcdcluster-" + c.members[0].peer.Port()
	logger := zap.New(&testCore{gate: c.logs})

	// Members are started one after the other, each once the previous one
	// serves its peer port: a new member first asks its peers whether it
	// was bootstrapped already, and a peer that has bound its port but does
	// not serve it yet makes that question wait for a timeout (1s each).
	// StartEtcd does not wait for the other members; readiness, which needs
	// a quorum, is awaited below.
	for _, m := range c.members {
		cfg := embed.NewConfig()
		cfg.Name = m.name
		cfg.Dir = m.dir
		cfg.ListenClientUrls = []url.URL{m.client}
		cfg.AdvertiseClientUrls = []url.URL{m.client}
		cfg.ListenPeerUrls = []url.URL{m.peer}
		cfg.AdvertisePeerUrls = []url.URL{m.peer}
		cfg.InitialCluster = strings.Join(initial, ",")
		cfg.InitialClusterToken = token
		cfg.ClusterState = embed.ClusterStateFlagNew
		cfg.Logger = "zap"
		cfg.LogLevel = "error"
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(logger.With(zap.String("member", m.name)))
		// Loopback is fast; shorter raft timers make the first election
		// quick without making leadership flap under -race.
		cfg.TickMs = 50
		cfg.ElectionMs = 500
		e, err := embed.StartEtcd(cfg)
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

// stop stops every member. Closing members gracefully while their peers
// are closing too takes seconds (a leader tries to hand over leadership to a
// member that is going away), so the raft side of every member is stopped
// hard first, all at once; then all members are closed at once. Close still
// spends about a second shutting down its peer server, so a whole stop
// takes about a second, whatever n.
func (c *Cluster) stop() {
	c.once.Do(func() {
		c.logs.close()
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
