package edge

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	crand "crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"hash/crc32"
	"log/slog"
	"maps"
	"math/big"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	edgev1 "github.com/aethermesh/aether/api/edge/v1"
	edgesyncv1 "github.com/aethermesh/aether/api/edgesync/v1"
	"github.com/aethermesh/aether/edge/internal/core"
	"github.com/aethermesh/aether/internal/testutil/logbuf"
)

// testCluster is a set of replicas on real loopback sockets, each started
// and stopped on demand with its own data directory.
type testCluster struct {
	t     *testing.T
	names []string
	peer  map[string]url.URL
	dirs  map[string]string
	peers map[string][]string // nil: complete graph
	srv   map[string]*Server
	mod   func(name string, cfg *Config) // optional, before each start
	// snapshotsExpected: some replica ran with a peer retention (or the
	// test makes a member lose its data), so a peer may legitimately fall
	// behind a GC point (see stop).
	snapshotsExpected bool
}

func newTestCluster(t *testing.T, names []string, peers map[string][]string) *testCluster {
	t.Helper()
	c := &testCluster{t: t, names: names, peer: map[string]url.URL{}, dirs: map[string]string{}, peers: peers, srv: map[string]*Server{}}
	// The peer URLs must be known before any replica starts (member ids
	// derive from them): reserve free ports.
	for _, n := range names {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		c.peer[n] = url.URL{Scheme: "http", Host: l.Addr().String()}
		_ = l.Close()
		c.dirs[n] = t.TempDir()
	}
	t.Cleanup(func() {
		for _, n := range c.names {
			if c.srv[n] != nil {
				c.stop(n)
			}
		}
	})
	return c
}

func (c *testCluster) start(name string) *Server {
	c.t.Helper()
	ic := map[string][]url.URL{}
	for _, n := range c.names {
		ic[n] = []url.URL{c.peer[n]}
	}
	cfg := Config{
		Name:              name,
		DataDir:           c.dirs[name],
		ListenClientURLs:  []url.URL{{Scheme: "http", Host: "127.0.0.1:0"}},
		ListenPeerURLs:    []url.URL{c.peer[name]},
		AdvertisePeerURLs: []url.URL{c.peer[name]},
		InitialCluster:    ic,
		SyncPeers:         c.peers[name],
		SyncInterval:      100 * time.Millisecond,
	}
	recordHistory(c.t, &cfg)
	if c.mod != nil {
		c.mod(name, &cfg)
	}
	if cfg.PeerRetention > 0 {
		c.snapshotsExpected = true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := Start(ctx, cfg)
	if err != nil {
		c.t.Fatalf("start %s: %v", name, err)
	}
	c.srv[name] = s
	return s
}

// stop closes a replica. Without a peer retention no member ever stops
// holding GC back, so no peer can be behind a GC point: a snapshot sent,
// or a peer refused as behind, is a bug in the stability bookkeeping (a
// stale view of a peer taken for what it holds), and fails the test.
func (c *testCluster) stop(name string) {
	c.t.Helper()
	if s := c.srv[name]; !c.snapshotsExpected && !c.t.Failed() {
		for _, m := range []string{"aether_edge_snapshot_transfers_sent_total", "aether_edge_gc_peer_refused_total"} {
			if n := metricSum(c.t, s.Registry(), m); n > 0 {
				c.t.Errorf("%s: %s = %v with no peer retention: a peer was taken for behind a GC point", name, m, n)
			}
		}
	}
	closeServer(c.t, c.srv[name])
	c.srv[name] = nil
}

func (c *testCluster) running() []*Server {
	var out []*Server
	for _, n := range c.names {
		if s := c.srv[n]; s != nil {
			out = append(out, s)
		}
	}
	return out
}

// appliedVector is what a replica holds: per replica, how many of its
// changes it applied. Changes are applied in causal order, so the vector
// names the whole set (sync.go), whatever history GC dropped from the log.
func appliedVector(s *Server) vector {
	l := s.sync.log
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.applied.clone()
}

// heldChanges is how many changes a replica applied.
func heldChanges(s *Server) uint64 {
	var n uint64
	for _, c := range appliedVector(s) {
		n += c
	}
	return n
}

// covers reports whether v holds everything o does.
func (v vector) covers(o vector) bool {
	for r, n := range o {
		if v[r] < n {
			return false
		}
	}
	return true
}

// histories records every change each replica (by data directory)
// applies, in index order, through Config.onApplied: the model checks need
// every change a replica holds, and history GC drops them from its sync
// log once every peer holds them. A replica restarted on the same data
// directory replays what it held (recovery, not recorded again) and goes on
// at the next index; an index reused after a crash lost the change first
// recorded there is overwritten by the one made in its place.
var histories sync.Map // data dir -> *history

type history struct {
	mu      sync.Mutex
	byIndex map[uint64][]byte
}

func recordHistory(t *testing.T, cfg *Config) {
	h := &history{byIndex: map[uint64][]byte{}}
	if old, loaded := histories.LoadOrStore(cfg.DataDir, h); loaded {
		h = old.(*history)
	} else {
		dir := cfg.DataDir
		t.Cleanup(func() { histories.Delete(dir) })
	}
	cfg.onApplied = func(ap *core.Applied) {
		h.mu.Lock()
		h.byIndex[ap.Index] = ap.Encoded
		h.mu.Unlock()
	}
}

// encodingAt is the change applied at index on s.
func encodingAt(t *testing.T, s *Server, index uint64) []byte {
	t.Helper()
	if v, ok := histories.Load(s.cfg.DataDir); ok {
		h := v.(*history)
		h.mu.Lock()
		enc, ok := h.byIndex[index]
		h.mu.Unlock()
		if ok {
			return enc
		}
	}
	l := s.sync.log
	l.mu.Lock()
	defer l.mu.Unlock()
	if index < l.base || index >= l.base+uint64(len(l.entries)) {
		t.Fatalf("change %d of %s is neither recorded nor in the sync log", index, s.cfg.Name)
	}
	return l.entries[index-l.base].enc
}

// chainPosition is the (replica, seq) of change id on s: from the sync log
// or the core while they still hold it, else (GC collected it) from the
// changes recorded (recordHistory), counting its author's changes before
// it in index order.
func chainPosition(t *testing.T, s *Server, id core.Hash) (core.ReplicaID, uint64, bool) {
	t.Helper()
	s.mu.RLock()
	r, seq, ok := s.sync.position(id)
	s.mu.RUnlock()
	if ok {
		return r, seq, true
	}
	v, ok := histories.Load(s.cfg.DataDir)
	if !ok {
		return 0, 0, false
	}
	h := v.(*history)
	h.mu.Lock()
	defer h.mu.Unlock()
	count := map[core.ReplicaID]uint64{}
	for _, i := range slices.Sorted(maps.Keys(h.byIndex)) {
		c, err := core.DecodeChange(h.byIndex[i])
		if err != nil {
			t.Fatal(err)
		}
		count[c.Replica]++
		if c.ID() == id {
			return c.Replica, count[c.Replica], true
		}
	}
	return 0, 0, false
}

// logChanges is every change s applied, in index order.
func logChanges(t *testing.T, s *Server) []*core.Change {
	t.Helper()
	l := s.sync.log
	l.mu.Lock()
	// The log holds indexes [base, base+len) and GC dropped the ones just
	// before, one per trimmed change.
	first := l.base - l.trimmed.lacks(vector{})
	end := l.base + uint64(len(l.entries))
	l.mu.Unlock()
	var out []*core.Change
	for i := max(first, 1); i < end; i++ {
		c, err := core.DecodeChange(encodingAt(t, s, i))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
	return out
}

// converged reports whether every given replica holds the same changes
// (the same vector) and reports the same HashKV, and returns that hash.
func converged(ctx context.Context, t *testing.T, ss []*Server) (uint32, bool) {
	t.Helper()
	var first vector
	for _, s := range ss {
		v := appliedVector(s)
		if first == nil {
			first = v
			continue
		}
		if !mapsEqual(v, first) {
			return 0, false
		}
	}
	var hash uint32
	for i, s := range ss {
		resp, err := newClientQuiet(t, s).HashKV(ctx, s.ClientURLs()[0], 0)
		if err != nil {
			t.Fatalf("HashKV: %v", err)
		}
		if i > 0 && resp.Hash != hash {
			return 0, false
		}
		hash = resp.Hash
	}
	return hash, true
}

var clientsMu sync.Mutex
var clientsOf = map[*Server]*clientv3.Client{}

// newClientQuiet is one cached client per server (convergence polls often).
func newClientQuiet(t *testing.T, s *Server) *clientv3.Client {
	t.Helper()
	clientsMu.Lock()
	defer clientsMu.Unlock()
	if c := clientsOf[s]; c != nil {
		return c
	}
	c := newClient(t, s)
	clientsOf[s] = c
	t.Cleanup(func() {
		clientsMu.Lock()
		delete(clientsOf, s)
		clientsMu.Unlock()
	})
	return c
}

func waitConverged(t *testing.T, ss []*Server) uint32 {
	t.Helper()
	ctx := testCtx(t)
	var h uint32
	eventually(t, 20*time.Second, "replicas to converge", func() bool {
		var ok bool
		h, ok = converged(ctx, t, ss)
		return ok
	})
	// The same changes make the same DAG: every replica reports the same
	// heads on the extension API.
	var first [][]byte
	for i, s := range ss {
		resp, err := extClient(t, s).Heads(ctx, &edgev1.HeadsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = resp.Heads
			continue
		}
		if !slices.EqualFunc(first, resp.Heads, bytes.Equal) {
			t.Fatalf("converged replicas report different heads: %x and %x", first, resp.Heads)
		}
	}
	return h
}

// modelHash is the reference merge: per key, the change with the largest
// (stamp, replica) that touches it decides; its last op on the key gives
// the value or absence. Hashed as core.HashKV does (CRC-32C over
// length-prefixed keys and values in key order).
func modelHash(changes []*core.Change) (uint32, map[string]string) {
	type win struct {
		stamp core.HLC
		repl  core.ReplicaID
		live  bool
		value []byte
	}
	keys := map[string]*win{}
	for _, c := range changes {
		touched := map[string]bool{}
		for _, op := range c.Ops {
			if op.Kind != core.OpPut && op.Kind != core.OpDelete {
				continue
			}
			k := string(op.Key)
			w := keys[k]
			if w == nil {
				w = &win{}
				keys[k] = w
			}
			later := c.Stamp.Compare(w.stamp) > 0 || (c.Stamp.Compare(w.stamp) == 0 && c.Replica > w.repl)
			same := c.Stamp.Compare(w.stamp) == 0 && c.Replica == w.repl && touched[k]
			if !later && !same {
				continue
			}
			touched[k] = true
			w.stamp, w.repl = c.Stamp, c.Replica
			w.live = op.Kind == core.OpPut
			w.value = op.Value
		}
	}
	names := make([]string, 0, len(keys))
	final := map[string]string{}
	for k, w := range keys {
		if w.live {
			names = append(names, k)
			final[k] = string(w.value)
		}
	}
	sort.Strings(names)
	h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	for _, k := range names {
		h.Write(appendLen(nil, len(k)))
		h.Write([]byte(k))
		h.Write(appendLen(nil, len(final[k])))
		h.Write([]byte(final[k]))
	}
	return h.Sum32(), final
}

func appendLen(b []byte, n int) []byte {
	for n >= 0x80 {
		b = append(b, byte(n)|0x80)
		n >>= 7
	}
	return append(b, byte(n))
}

// TestModelHashCatchesDivergence proves the reference model can fail: a
// lost change or a reversed conflict gives another hash.
func TestModelHashCatchesDivergence(t *testing.T) {
	a := &core.Change{Replica: 1, Stamp: core.HLC{Wall: 10}, Ops: []core.Op{{Kind: core.OpPut, Key: []byte("k"), Value: []byte("a")}}}
	b := &core.Change{Replica: 2, Stamp: core.HLC{Wall: 10}, Ops: []core.Op{{Kind: core.OpPut, Key: []byte("k"), Value: []byte("b")}}}
	d := &core.Change{Replica: 1, Stamp: core.HLC{Wall: 5}, Ops: []core.Op{{Kind: core.OpDelete, Key: []byte("k")}}}
	h1, m1 := modelHash([]*core.Change{a, b, d})
	h2, _ := modelHash([]*core.Change{d, b, a})
	if h1 != h2 || m1["k"] != "b" {
		t.Fatalf("order changed the model: %x %x %v", h1, h2, m1)
	}
	if h3, _ := modelHash([]*core.Change{a, d}); h3 == h1 {
		t.Fatal("a lost change gave the same hash")
	}
	// A real state that merged all three agrees with the model.
	st := core.New(3)
	for _, c := range []*core.Change{d, b, a} {
		if _, err := st.Merge(time.Unix(0, 0), c.Encode()); err != nil {
			t.Fatal(err)
		}
	}
	got, _, err := st.HashKV(0)
	if err != nil || got != h1 {
		t.Fatalf("core HashKV %x, model %x (%v)", got, h1, err)
	}
}

// watchLog collects one replica's watch events on prefix from revision 2.
type watchLog struct {
	mu     sync.Mutex
	events []*mvccpb.Event
	err    error
}

func startWatch(ctx context.Context, t *testing.T, s *Server, prefix string) *watchLog {
	t.Helper()
	w := &watchLog{}
	cli := newClient(t, s)
	ctx, cancel := context.WithCancel(ctx)
	wch := cli.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(2), clientv3.WithPrevKV())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for resp := range wch {
			w.mu.Lock()
			if err := resp.Err(); err != nil {
				w.err = err
			}
			w.events = append(w.events, resp.Events...)
			w.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	return w
}

// check verifies the watch events as etcd's guarantees state them, per
// replica: ordered (revisions never go back), unique (no (revision, key)
// twice, and a revision's events are contiguous), complete (replaying them
// gives the replica's key space; the last one is at the replica's
// revision). It returns how many events carried a value written at
// another replica (merged changes seen as ordinary events).
func (w *watchLog) check(t *testing.T, name string, s *Server, prefix string, origin func(value string) string) int {
	t.Helper()
	ctx := testCtx(t)
	cli := newClientQuiet(t, s)
	resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for _, kv := range resp.Kvs {
		want[string(kv.Key)] = string(kv.Value)
	}
	eventually(t, 10*time.Second, name+"'s watcher to reach its revision", func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return len(w.events) > 0 && w.events[len(w.events)-1].Kv.ModRevision >= resp.Header.Revision
	})
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		t.Fatalf("%s: watch error: %v", name, w.err)
	}
	got := map[string]string{}
	seen := map[string]bool{}
	closed := map[int64]bool{}
	var last int64
	merged := 0
	for i, ev := range w.events {
		r := ev.Kv.ModRevision
		if r < last {
			t.Fatalf("%s: event %d at revision %d after %d", name, i, r, last)
		}
		if r > last {
			if closed[r] {
				t.Fatalf("%s: revision %d's events are split", name, r)
			}
			closed[last] = true
			last = r
		}
		id := fmt.Sprintf("%d/%s", r, ev.Kv.Key)
		if seen[id] {
			t.Fatalf("%s: event %s twice", name, id)
		}
		seen[id] = true
		switch ev.Type {
		case mvccpb.PUT:
			got[string(ev.Kv.Key)] = string(ev.Kv.Value)
			if origin(string(ev.Kv.Value)) != name {
				merged++
			}
		case mvccpb.DELETE:
			delete(got, string(ev.Kv.Key))
		}
	}
	if last != resp.Header.Revision {
		t.Fatalf("%s: last event at %d, replica at %d", name, last, resp.Header.Revision)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%s: replaying the watch gives\n%v\nthe replica has\n%v", name, got, want)
	}
	return merged
}

// load writes at s: puts, deletes, txns and leases (a put on a new lease,
// revokes, which delete the lease's keys) over a few keys, values naming
// their origin. It returns the acknowledged puts (key -> values).
func load(ctx context.Context, t *testing.T, s *Server, name string, seed uint64, n int) map[string][]string {
	t.Helper()
	cli := newClient(t, s)
	rng := rand.New(rand.NewPCG(seed, 1))
	acked := map[string][]string{}
	var leases []clientv3.LeaseID
	for i := range n {
		key := fmt.Sprintf("k%02d", rng.IntN(16))
		val := fmt.Sprintf("%s/%d/%d", name, seed, i)
		var err error
		switch r := rng.IntN(20); {
		case r == 0:
			var g *clientv3.LeaseGrantResponse
			if g, err = cli.Grant(ctx, 600); err == nil {
				leases = append(leases, g.ID)
				if _, err = cli.Put(ctx, key, val, clientv3.WithLease(g.ID)); err == nil {
					acked[key] = append(acked[key], val)
				}
			}
		case r == 1 && len(leases) > 0:
			_, err = cli.Revoke(ctx, leases[0])
			leases = leases[1:]
		case r < 12:
			_, err = cli.Put(ctx, key, val)
			if err == nil {
				acked[key] = append(acked[key], val)
			}
		case r < 16:
			_, err = cli.Delete(ctx, key)
		default:
			// Put only if absent, else delete: a Txn decided locally.
			var resp *clientv3.TxnResponse
			resp, err = cli.Txn(ctx).If(clientv3.Compare(clientv3.Version(key), "=", 0)).
				Then(clientv3.OpPut(key, val)).Else(clientv3.OpDelete(key)).Commit()
			if err == nil && resp.Succeeded {
				acked[key] = append(acked[key], val)
			}
		}
		if err != nil {
			t.Errorf("%s: write %d: %v", name, i, err)
			return acked
		}
	}
	return acked
}

func originOf(v string) string {
	i := bytes.IndexByte([]byte(v), '/')
	if i < 0 {
		return ""
	}
	return v[:i]
}

// checkModel compares the converged hash with the reference merge of the
// changes held, and checks every acknowledged put is among them.
func checkModel(t *testing.T, s *Server, hash uint32, acked []map[string][]string) {
	t.Helper()
	changes := logChanges(t, s)
	want, _ := modelHash(changes)
	if want != hash {
		t.Fatalf("replicas agree on HashKV %x, the reference merge gives %x", hash, want)
	}
	puts := map[string]bool{}
	for _, c := range changes {
		for _, op := range c.Ops {
			if op.Kind == core.OpPut {
				puts[string(op.Key)+"="+string(op.Value)] = true
			}
		}
	}
	n := 0
	for _, a := range acked {
		for k, vs := range a {
			for _, v := range vs {
				n++
				if !puts[k+"="+v] {
					t.Fatalf("acknowledged put %s=%s is in no change", k, v)
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("no acknowledged puts: the load did nothing")
	}
}

func TestSyncConvergesUnderConcurrentWrites(t *testing.T) {
	for _, n := range []int{3, 5} {
		t.Run(fmt.Sprintf("replicas=%d", n), func(t *testing.T) {
			testSyncConverges(t, []string{"a", "b", "c", "d", "e"}[:n])
		})
	}
}

func testSyncConverges(t *testing.T, names []string) {
	c := newTestCluster(t, names, nil)
	for _, n := range names {
		c.start(n)
	}
	ctx := testCtx(t)
	watches := map[string]*watchLog{}
	for _, n := range names {
		watches[n] = startWatch(ctx, t, c.srv[n], "k")
	}
	var (
		mu    sync.Mutex
		acked []map[string][]string
		wg    sync.WaitGroup
	)
	for i, n := range names {
		for g := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				a := load(ctx, t, c.srv[n], n, uint64(10*i+g), 150)
				mu.Lock()
				acked = append(acked, a)
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	hash := waitConverged(t, c.running())
	checkModel(t, c.srv["a"], hash, acked)
	for _, n := range names {
		if merged := watches[n].check(t, n, c.srv[n], "k", originOf); merged == 0 {
			t.Fatalf("%s's watcher saw no merged change", n)
		}
	}

	// Replication status: a new write at a is reported held by both peers
	// once they have it, and lag drops to zero.
	resp, err := newClientQuiet(t, c.srv["a"]).Put(ctx, "status", "x")
	if err != nil {
		t.Fatal(err)
	}
	ext := extClient(t, c.srv["a"])
	h, err := ext.HashOfRevision(ctx, &edgev1.HashOfRevisionRequest{Revision: resp.Header.Revision})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "both peers to hold the write", func() bool {
		st, err := ext.ReplicationStatus(ctx, &edgev1.ReplicationStatusRequest{Hashes: [][]byte{h.Hash, make([]byte, 32)}})
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Peers) != len(names)-1 {
			t.Fatalf("status lists %d peers, want %d", len(st.Peers), len(names)-1)
		}
		for _, p := range st.Peers {
			if p.Has[1] {
				t.Fatalf("peer %s holds an unknown change", p.Name)
			}
			if !p.Has[0] || p.LastSyncUnixNano == 0 {
				return false
			}
		}
		return true
	})
	// The metrics say the same, per peer.
	reg := c.srv["a"].Registry()
	// The DAG metric counts what the log holds; with history GC (the
	// default) that plus what GC trimmed is every change applied. Acks
	// still arriving trim more meanwhile: compare once they agree.
	eventually(t, 10*time.Second, "the DAG metric to match the log", func() bool {
		n, _ := c.srv["a"].sync.log.stats()
		got := metricValue(t, reg, "aether_edge_dag_changes", "")
		trimmed := metricValue(t, reg, "aether_edge_gc_trimmed_changes_total", "")
		return got == float64(n) && uint64(got+trimmed) == heldChanges(c.srv["a"]) && heldChanges(c.srv["a"]) > 0
	})
	for _, peer := range names[1:] {
		for _, m := range []string{"aether_edge_sync_rounds_total", "aether_edge_sync_changes_sent_total", "aether_edge_sync_bytes_sent_total",
			"aether_edge_sync_changes_received_total", "aether_edge_sync_bytes_received_total", "aether_edge_sync_peer_connected"} {
			if v := metricValue(t, reg, m, peer); v <= 0 {
				t.Fatalf("%s{peer=%q} = %v", m, peer, v)
			}
		}
		if v := metricValue(t, reg, "aether_edge_sync_lag_changes", peer); v != 0 {
			t.Fatalf("lag to %s is %v changes after convergence", peer, v)
		}
		if v := metricValue(t, reg, "aether_edge_sync_lag_seconds", peer); v != 0 {
			t.Fatalf("lag to %s is %vs after convergence", peer, v)
		}
	}
}

// metricValue reads one gauge or counter from reg (-1 when absent).
func metricValue(t *testing.T, reg *prometheus.Registry, name, peer string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := peer == ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "peer" && l.GetValue() == peer {
					match = true
				}
			}
			if !match {
				continue
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return -1
}

// metricSum is the sum of a counter over all its label values.
func metricSum(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

func TestSyncLateReplicaCatchesUp(t *testing.T) {
	names := []string{"a", "b", "c"}
	c := newTestCluster(t, names, nil)
	c.start("a")
	c.start("b")
	ctx := testCtx(t)
	acked := []map[string][]string{
		load(ctx, t, c.srv["a"], "a", 1, 200),
		load(ctx, t, c.srv["b"], "b", 2, 200),
	}
	waitConverged(t, c.running())
	late := c.start("c")
	w := startWatch(ctx, t, late, "k")
	acked = append(acked, load(ctx, t, late, "c", 3, 50))
	hash := waitConverged(t, c.running())
	checkModel(t, late, hash, acked)
	w.check(t, "c", late, "k", originOf)
}

func TestSyncChainTopologyIsTransitive(t *testing.T) {
	names := []string{"a", "b", "c"}
	c := newTestCluster(t, names, map[string][]string{"a": {"b"}, "b": {"a", "c"}, "c": {"b"}})
	for _, n := range names {
		c.start(n)
	}
	if got := len(c.srv["a"].sync.peers); got != 1 {
		t.Fatalf("a has %d peers, want 1", got)
	}
	ctx := testCtx(t)
	var acked []map[string][]string
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i, n := range []string{"a", "c"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := load(ctx, t, c.srv[n], n, uint64(i), 150)
			mu.Lock()
			acked = append(acked, a)
			mu.Unlock()
		}()
	}
	wg.Wait()
	hash := waitConverged(t, c.running())
	checkModel(t, c.srv["c"], hash, acked)
	// a's changes reached c only through b.
	if _, ok := c.srv["a"].sync.log.durableVector()[core.ReplicaID(c.srv["c"].MemberID())]; !ok {
		t.Fatal("a holds nothing of c")
	}
}

func TestSyncRestartedPeerConverges(t *testing.T) {
	names := []string{"a", "b", "c"}
	c := newTestCluster(t, names, nil)
	for _, n := range names {
		c.start(n)
	}
	ctx := testCtx(t)
	acked := []map[string][]string{load(ctx, t, c.srv["b"], "b", 1, 100)}
	waitConverged(t, c.running())
	c.stop("b")
	acked = append(acked, load(ctx, t, c.srv["a"], "a", 2, 100), load(ctx, t, c.srv["c"], "c", 3, 100))
	b := c.start("b")
	acked = append(acked, load(ctx, t, b, "b", 4, 50))
	hash := waitConverged(t, c.running())
	checkModel(t, b, hash, acked)
	// Every replica's vector counts each replica's changes once: the
	// restart re-derived b's positions from its log.
	va := c.srv["a"].sync.log.durableVector()
	vb := b.sync.log.durableVector()
	if !mapsEqual(va, vb) {
		t.Fatalf("vectors differ after convergence: a %v, b %v", va, vb)
	}
}

func mapsEqual(a, b vector) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestSyncLogVectorWalk checks the sync log's walk sends exactly the
// vector difference, in index order, skipping what the peer holds.
func TestSyncLogVectorWalk(t *testing.T) {
	l := newSyncLog(time.Now)
	// Index order: a1 b1 a2 c1 b2 a3.
	order := []core.ReplicaID{1, 2, 1, 3, 2, 1}
	for i, r := range order {
		var id core.Hash
		id[0] = byte(i + 1)
		if err := l.add(uint64(i+1), id, []byte{byte(i + 1)}, r, false); err != nil {
			t.Fatal(err)
		}
	}
	c0, _ := l.newCursor(vector{})
	if got, _, _ := l.take(c0, nil, 100, 1<<20); len(got) != 0 {
		t.Fatalf("sent %d changes before any was durable", len(got))
	}
	l.markDurable(6)
	cur, _ := l.newCursor(vector{1: 2, 2: 1})          // holds a1 a2 b1
	got, _, _ := l.take(cur, vector{3: 1}, 100, 1<<20) // and c1, heard from it
	var ids []byte
	for _, g := range got {
		ids = append(ids, g[0])
	}
	if want := []byte{5, 6}; !slices.Equal(ids, want) {
		t.Fatalf("sent %v, want %v", ids, want)
	}
	if !mapsEqual(cur.sent, vector{1: 3, 2: 2, 3: 1}) {
		t.Fatalf("cursor vector %v", cur.sent)
	}
	if v := l.durableVector(); !mapsEqual(v, vector{1: 3, 2: 2, 3: 1}) {
		t.Fatalf("durable vector %v", v)
	}
	if n := (vector{1: 3, 2: 2}).lacks(vector{1: 1}); n != 4 {
		t.Fatalf("lacks = %d, want 4", n)
	}
}

// TestSyncAfterCompaction: a change whose parent the receiver applied
// before a compaction still merges (the core forgets old hashes at
// compaction; the receiver must not refuse the child). b pushes to a only,
// so b's next change has the old change as parent.
func TestSyncAfterCompaction(t *testing.T) {
	names := []string{"a", "b", "c"} // c never runs: a pushes only to it
	c := newTestCluster(t, names, map[string][]string{"a": {"c"}, "b": {"a"}})
	a, b := c.start("a"), c.start("b")
	ctx := testCtx(t)
	ca, cb := newClient(t, a), newClient(t, b)
	if _, err := cb.Put(ctx, "y", "1"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "a to get b's put", func() bool {
		r, err := ca.Get(ctx, "y")
		return err == nil && len(r.Kvs) == 1
	})
	var rev int64
	for i := range 3 {
		r, err := ca.Put(ctx, fmt.Sprintf("a%d", i), "x")
		if err != nil {
			t.Fatal(err)
		}
		rev = r.Header.Revision
	}
	if _, err := ca.Compact(ctx, rev); err != nil {
		t.Fatal(err)
	}
	if _, err := cb.Put(ctx, "z", "2"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "a to get b's put after its compaction", func() bool {
		r, err := ca.Get(ctx, "z")
		return err == nil && len(r.Kvs) == 1
	})
}

// offsetClock is a clock that can be moved forward, for Config.Now.
type offsetClock struct{ off atomic.Int64 }

func (c *offsetClock) now() time.Time          { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *offsetClock) advance(d time.Duration) { c.off.Add(int64(d)) }

// TestSyncLeaseOwnedByGranter: while the granter is cut off, another
// replica keeps showing its lease (no local expiry, keepalives refused)
// and the keys on it, however much time passes there; the granter expires
// the lease by its own clock, and the revoke deletes the keys elsewhere.
func TestSyncLeaseOwnedByGranter(t *testing.T) {
	names := []string{"a", "b"}
	c := newTestCluster(t, names, nil)
	clocks := map[string]*offsetClock{"a": {}, "b": {}}
	c.mod = func(name string, cfg *Config) { cfg.Now = clocks[name].now }
	a, b := c.start("a"), c.start("b")
	ctx := testCtx(t)
	ca, cb := newClient(t, a), newClient(t, b)
	lease, err := ca.Grant(ctx, 2) // etcd's minimum: the owner's expiry timer runs on real time
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ca.Put(ctx, "l", "v", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "b to get the leased key", func() bool {
		r, err := cb.Get(ctx, "l")
		return err == nil && len(r.Kvs) == 1 && r.Kvs[0].Lease == int64(lease.ID)
	})
	c.stop("a") // the owner is cut off
	clocks["b"].advance(time.Hour)
	r, err := cb.Get(ctx, "l")
	if err != nil || len(r.Kvs) != 1 {
		t.Fatalf("b lost the key while the owner is away: %v %v", r, err)
	}
	ttl, err := cb.TimeToLive(ctx, lease.ID, clientv3.WithAttachedKeys())
	if err != nil || ttl.GrantedTTL != 2 || ttl.TTL < 3600 || len(ttl.Keys) != 1 {
		t.Fatalf("b's view of the lease: %+v %v", ttl, err)
	}
	if _, err := cb.KeepAliveOnce(ctx, lease.ID); err == nil {
		t.Fatal("b renewed a lease it does not own")
	}
	// The owner comes back (its leases get their full TTL again, as in
	// etcd) and its clock passes the TTL: it expires the lease, and b
	// deletes the key as an ordinary event.
	w := cb.Watch(ctx, "l", clientv3.WithRev(r.Header.Revision+1))
	clocks["a"].advance(time.Minute)
	c.start("a")
	clocks["a"].advance(10 * time.Second)
	select {
	case resp := <-w:
		if len(resp.Events) != 1 || resp.Events[0].Type != mvccpb.DELETE {
			t.Fatalf("b's watcher: %+v", resp)
		}
	case <-ctx.Done():
		t.Fatal("the owner's expiry never reached b")
	}
	ttl, err = cb.TimeToLive(ctx, lease.ID)
	if err != nil || ttl.TTL != -1 {
		t.Fatalf("b's view of the expired lease: %+v %v", ttl, err)
	}
}

// peerCert is a self-signed CA certificate for 127.0.0.1 usable as both
// server and client certificate (mTLS between peers).
func peerCert(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), crand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(2),
		Subject:               pkix.Name{CommonName: "edge-peer"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(crand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pool
}

// TestSyncPeerMTLS: peers on https URLs sync over mutual TLS (the peer
// TLS config as etcd's flags build it: a server config requiring client
// certificates), and a caller without a client certificate is refused.
func TestSyncPeerMTLS(t *testing.T) {
	cert, pool := peerCert(t)
	names := []string{"a", "b"}
	c := newTestCluster(t, names, nil)
	for n, u := range c.peer {
		u.Scheme = "https"
		c.peer[n] = u
	}
	c.mod = func(_ string, cfg *Config) {
		cfg.PeerTLS = &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}
	}
	a, b := c.start("a"), c.start("b")
	ctx := testCtx(t)
	acked := []map[string][]string{load(ctx, t, a, "a", 1, 30), load(ctx, t, b, "b", 2, 30)}
	hash := waitConverged(t, c.running())
	checkModel(t, a, hash, acked)

	// No client certificate: the handshake fails, nothing is pushed.
	conn, err := grpc.NewClient(c.peer["a"].Host, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stream, err := edgesyncv1.NewEdgeSyncClient(conn).Push(ctx)
	if err == nil {
		err = stream.Send(&edgesyncv1.PushRequest{Hello: &edgesyncv1.Hello{MemberId: b.MemberID(), ClusterId: b.ClusterID(), Version: syncVersion}})
		if err == nil {
			_, err = stream.Recv()
		}
	}
	if err == nil {
		t.Fatal("a peer without a client certificate was served")
	}
}

// TestSyncNoEcho: a change is not sent back to the peer it came from, nor
// re-sent on a new stream: b, which writes nothing, sends a nothing.
func TestSyncNoEcho(t *testing.T) {
	c := newTestCluster(t, []string{"a", "b"}, nil)
	a, b := c.start("a"), c.start("b")
	ctx := testCtx(t)
	load(ctx, t, a, "a", 1, 100)
	waitConverged(t, c.running())
	c.stop("a")
	a = c.start("a")
	before := heldChanges(a)
	load(ctx, t, a, "a", 2, 20)
	after := heldChanges(a)
	waitConverged(t, c.running())
	if v := metricValue(t, b.Registry(), "aether_edge_sync_changes_sent_total", "a"); v > 0 {
		t.Fatalf("b sent a %v changes, all of them a's own", v)
	}
	if v := metricValue(t, a.Registry(), "aether_edge_sync_changes_sent_total", "b"); v != float64(after-before) {
		t.Fatalf("a's new stream sent b %v changes, want the %d new ones", v, after-before)
	}
}

// TestSyncCloseJoinsGoroutines: the senders, their ack readers and the
// peer server's handlers all end with Close, also with a peer that is
// down (a sender in backoff) and streams open both ways.
func TestSyncCloseJoinsGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	func() {
		c := newTestCluster(t, []string{"a", "b", "c"}, nil) // c never runs
		a, b := c.start("a"), c.start("b")
		ctx := testCtx(t)
		cli, err := clientv3.New(clientv3.Config{Endpoints: a.ClientURLs(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(ctx, "k", "v"); err != nil {
			t.Fatal(err)
		}
		_ = cli.Close()
		eventually(t, 10*time.Second, "b to get a's put", func() bool { return int(heldChanges(b)) == 1 })
		c.stop("a")
		c.stop("b")
	}()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines before, %d after Close:\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSyncLogTakeBoundsScan: a long run of changes the peer holds is
// skipped over several calls, each returning a ready channel, and the
// change after it is still found.
func TestSyncLogTakeBoundsScan(t *testing.T) {
	l := newSyncLog(time.Now)
	n := 3*maxScan + 1
	for i := range n {
		var id core.Hash
		id[0], id[1], id[2] = byte(i), byte(i>>8), byte(i>>16)
		r := core.ReplicaID(1)
		if i == n-1 {
			r = 2
		}
		if err := l.add(uint64(i+1), id, []byte{byte(i)}, r, true); err != nil {
			t.Fatal(err)
		}
	}
	cur := &cursor{next: 1, sent: vector{1: uint64(n - 1)}}
	calls := 0
	for {
		calls++
		got, wake, _ := l.take(cur, nil, 100, 1<<20)
		if len(got) == 1 {
			break
		}
		select {
		case <-wake:
		default:
			t.Fatalf("call %d: nothing taken and a channel that is not ready", calls)
		}
	}
	if calls < 3 {
		t.Fatalf("found the change in %d calls: the scan is not bounded", calls)
	}
}

// TestSyncRestartUnderLoad: a replica stopped and restarted while the
// others keep writing (streams break mid-batch, reconnect, resume from
// the vector) converges with them.
func TestSyncRestartUnderLoad(t *testing.T) {
	names := []string{"a", "b", "c"}
	c := newTestCluster(t, names, nil)
	for _, n := range names {
		c.start(n)
	}
	ctx := testCtx(t)
	var (
		mu    sync.Mutex
		acked []map[string][]string
		wg    sync.WaitGroup
	)
	for i, n := range []string{"a", "c"} {
		s := c.srv[n]
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := load(ctx, t, s, n, uint64(20+i), 300)
			mu.Lock()
			acked = append(acked, a)
			mu.Unlock()
		}()
	}
	// Restart b twice while a and c write.
	for range 2 {
		n := int(heldChanges(c.srv["b"]))
		eventually(t, 10*time.Second, "b to receive more changes", func() bool { return int(heldChanges(c.srv["b"])) > n+10 })
		c.stop("b")
		c.start("b")
	}
	writing := int(heldChanges(c.srv["a"]))
	wg.Wait()
	if int(heldChanges(c.srv["a"])) == writing {
		t.Log("the load had ended before b's last restart")
	}
	hash := waitConverged(t, c.running())
	checkModel(t, c.srv["b"], hash, acked)
}

// TestSyncLagSeconds: the lag in seconds to a peer that is down is the age
// of the oldest change it lacks, by the replica's clock.
func TestSyncLagSeconds(t *testing.T) {
	c := newTestCluster(t, []string{"a", "b"}, nil) // b never runs
	clock := &offsetClock{}
	c.mod = func(_ string, cfg *Config) { cfg.Now = clock.now }
	a := c.start("a")
	if v := metricValue(t, a.Registry(), "aether_edge_sync_lag_seconds", "b"); v != 0 {
		t.Fatalf("lag %vs with nothing to send", v)
	}
	ctx := testCtx(t)
	cli := newClient(t, a)
	if _, err := cli.Put(ctx, "k", "1"); err != nil {
		t.Fatal(err)
	}
	clock.advance(time.Minute)
	if _, err := cli.Put(ctx, "k", "2"); err != nil {
		t.Fatal(err)
	}
	if v := metricValue(t, a.Registry(), "aether_edge_sync_lag_seconds", "b"); v < 60 || v > 70 {
		t.Fatalf("lag to b is %vs, want the first put's age (60s)", v)
	}
	if v := metricValue(t, a.Registry(), "aether_edge_sync_lag_changes", "b"); v != 2 {
		t.Fatalf("lag to b is %v changes, want 2", v)
	}
}

// TestSyncStuckPeerDoesNotBlockWrites: a peer that accepts connections
// and never answers (a blackhole) costs local writes nothing: they are
// acknowledged at their usual pace, and the lag to it grows.
func TestSyncStuckPeerDoesNotBlockWrites(t *testing.T) {
	c := newTestCluster(t, []string{"a", "b"}, nil)
	l, err := net.Listen("tcp", c.peer["b"].Host)
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	var mu sync.Mutex
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, conn) // held open, never read
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		<-done
		mu.Lock()
		for _, conn := range conns {
			_ = conn.Close()
		}
		mu.Unlock()
	})
	a := c.start("a")
	ctx, cancel := context.WithTimeout(testCtx(t), 10*time.Second)
	defer cancel()
	cli := newClient(t, a)
	for i := range 200 {
		if _, err := cli.Put(ctx, fmt.Sprintf("k%d", i), "v"); err != nil {
			t.Fatalf("put %d with a stuck peer: %v", i, err)
		}
	}
	if v := metricValue(t, a.Registry(), "aether_edge_sync_lag_changes", "b"); v != 200 {
		t.Fatalf("lag to the stuck peer is %v changes, want 200", v)
	}
}

// TestSyncWaitReplicated: the extension API's wait returns once a write is
// on k replicas, waits while it is not (deadline), and refuses what it
// cannot answer.
func TestSyncWaitReplicated(t *testing.T) {
	c := newTestCluster(t, []string{"a", "b", "c"}, nil)
	a := c.start("a")
	c.start("b")
	ctx := testCtx(t)
	put, err := newClient(t, a).Put(ctx, "k", "v")
	if err != nil {
		t.Fatal(err)
	}
	ext := extClient(t, a)
	h, err := ext.HashOfRevision(ctx, &edgev1.HashOfRevisionRequest{Revision: put.Header.Revision})
	if err != nil {
		t.Fatal(err)
	}
	wait := func(ctx context.Context, k uint32, hashes ...[]byte) (*edgev1.WaitReplicatedResponse, error) {
		return ext.WaitReplicated(ctx, &edgev1.WaitReplicatedRequest{Hashes: hashes, Replicas: k})
	}
	resp, err := wait(ctx, 2, h.Hash)
	if err != nil || len(resp.MemberIds) != 1 || resp.MemberIds[0] != c.srv["b"].MemberID() {
		t.Fatalf("wait for 2 replicas: %+v %v", resp, err)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := wait(short, 3, h.Hash); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("wait for 3 replicas with c down: %v", err)
	}
	if _, err := wait(ctx, 4, h.Hash); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("wait for 4 of 3 replicas: %v", err)
	}
	if _, err := wait(ctx, 1, make([]byte, 32)); status.Code(err) != codes.NotFound {
		t.Fatalf("wait for an unknown change: %v", err)
	}
	// A wait in progress returns when c comes up and catches up.
	errc := make(chan error, 1)
	go func() {
		resp, err := wait(ctx, 3, h.Hash)
		if err == nil && len(resp.MemberIds) != 2 {
			err = fmt.Errorf("holders %v", resp.MemberIds)
		}
		errc <- err
	}()
	c.start("c")
	if err := <-errc; err != nil {
		t.Fatalf("wait for 3 replicas once c is up: %v", err)
	}
}

// TestSyncRefusesPeerThatWentBack: b's data directory is lost and b
// restarts under the same name, with fewer of its own changes than it had
// reported. a refuses to sync with it, saying why and what to do, instead
// of sending it nothing (what a knows b held is more than b holds now).
func TestSyncRefusesPeerThatWentBack(t *testing.T) {
	names := []string{"a", "b"}
	c := newTestCluster(t, names, nil)
	var logs logbuf.Buffer
	c.mod = func(name string, cfg *Config) {
		if name == "a" {
			cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		}
	}
	c.start("a")
	c.start("b")
	ctx := testCtx(t)
	cb := newClient(t, c.srv["b"])
	for i := range 5 {
		if _, err := cb.Put(ctx, fmt.Sprintf("b/%d", i), "v"); err != nil {
			t.Fatal(err)
		}
	}
	waitConverged(t, c.running())
	a, bid := c.srv["a"], c.srv["b"].memberID
	eventually(t, 10*time.Second, "a to hear b report its 5 changes", func() bool {
		return a.sync.stab.newestOf(bid)[core.ReplicaID(bid)] == 5
	})
	if strings.Contains(logs.String(), "went back") {
		t.Fatal("a refused b before b lost anything")
	}
	c.stop("b")
	// b, empty again, finds itself below a's GC point and offers a its
	// (empty) state: a must refuse that too.
	c.snapshotsExpected = true
	if err := os.RemoveAll(c.dirs["b"]); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(c.dirs["b"], 0o700); err != nil {
		t.Fatal(err)
	}
	c.start("b")
	defer func() {
		if t.Failed() {
			t.Log(logs.String())
		}
	}()
	eventually(t, 20*time.Second, "a to refuse b, whose history went back", func() bool {
		l := logs.String()
		return strings.Contains(l, "refusing to sync with a peer whose history went back") &&
			strings.Contains(l, "holds 0 of its own changes and reported 5 before") && strings.Contains(l, "new name")
	})
	if n := metricValue(t, a.Registry(), "aether_edge_snapshot_transfers_received_total", "b"); n != 0 {
		t.Fatalf("a merged %v snapshots of the b that lost its history", n)
	}
	resp, err := newClient(t, a).Get(ctx, "b/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if resp.Count != 5 {
		t.Fatalf("a holds %d of b's 5 keys after b came back empty", resp.Count)
	}
}
