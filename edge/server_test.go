package edge

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/types"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/etcdserver/api/membership"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3lock/v3lockpb"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	edgev1 "github.com/aethermesh/aether/api/edge/v1"
	"github.com/aethermesh/aether/edge/internal/storage"
)

func extClient(t *testing.T, s *Server) edgev1.EdgeClient {
	t.Helper()
	conn, err := grpc.NewClient(strings.TrimPrefix(s.ClientURLs()[0], "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return edgev1.NewEdgeClient(conn)
}

// snapshotState records what a restart must keep: revision, hash, every
// revision's change hash, heads, compaction, leases.
type stateSnapshot struct {
	rev, compact int64
	hash         uint32
	revHashes    []string
	heads        string
	leases       string
}

func takeSnapshot(t *testing.T, s *Server) stateSnapshot {
	t.Helper()
	c := newClient(t, s)
	ctx := testCtx(t)
	hk, err := c.HashKV(ctx, s.ClientURLs()[0], 0)
	if err != nil {
		t.Fatal(err)
	}
	ext := extClient(t, s)
	snap := stateSnapshot{rev: hk.Header.Revision, compact: hk.CompactRevision, hash: hk.Hash}
	// Compaction also drops the revision -> change map below it.
	for r := max(2, snap.compact); r <= snap.rev; r++ {
		h, err := ext.HashOfRevision(ctx, &edgev1.HashOfRevisionRequest{Revision: r})
		if err != nil {
			t.Fatalf("hash of revision %d: %v", r, err)
		}
		back, err := ext.RevisionOfHash(ctx, &edgev1.RevisionOfHashRequest{Hash: h.Hash})
		if err != nil || back.Revision != r {
			t.Fatalf("revision of hash of %d: %v %v", r, back, err)
		}
		snap.revHashes = append(snap.revHashes, fmt.Sprintf("%x", h.Hash))
	}
	hr, err := ext.Heads(ctx, &edgev1.HeadsRequest{})
	if err != nil || len(hr.Heads) == 0 {
		t.Fatalf("heads: %v %v", hr, err)
	}
	snap.heads = fmt.Sprintf("%x", hr.Heads)
	ls, err := c.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	snap.leases = fmt.Sprint(ls.Leases)
	return snap
}

func TestRestartKeepsRevisionsHashesCompactionLeases(t *testing.T) {
	dir := t.TempDir()
	s := startServer(t, dir, nil)
	c := newClient(t, s)
	ctx := testCtx(t)
	g, err := c.Grant(ctx, 100)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if _, err := c.Put(ctx, fmt.Sprintf("r/%d", i%6), fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	c.Put(ctx, "r/leased", "v", clientv3.WithLease(g.ID))
	c.Delete(ctx, "r/1")
	c.Txn(ctx).If(clientv3.Compare(clientv3.Version("r/2"), ">", 0)).Then(clientv3.OpPut("r/t", "x"), clientv3.OpDelete("r/3")).Commit()
	if _, err := c.Compact(ctx, 10); err != nil {
		t.Fatal(err)
	}
	before := takeSnapshot(t, s)
	closeServer(t, s)

	s2 := startServer(t, dir, nil)
	if s2.MemberID() != s.MemberID() || s2.ClusterID() != s.ClusterID() {
		t.Fatal("ids changed across a restart")
	}
	after := takeSnapshot(t, s2)
	if fmt.Sprint(before) != fmt.Sprint(after) {
		t.Fatalf("state changed across restart:\nbefore %+v\nafter  %+v", before, after)
	}
	if before.compact != 10 {
		t.Fatalf("compact revision %d, want 10", before.compact)
	}
	if _, err := extClient(t, s2).HashOfRevision(ctx, &edgev1.HashOfRevisionRequest{Revision: 9}); status.Code(err) != codes.NotFound {
		t.Fatalf("hash of a compacted revision: %v", err)
	}
	c2 := newClient(t, s2)
	if _, err := c2.Get(ctx, "r/0", clientv3.WithRev(9)); !errors.Is(err, rpctypes.ErrCompacted) {
		t.Fatalf("compaction not restored: %v", err)
	}
	// The lease came back with its full TTL (etcd's promotion).
	ttl, err := c2.TimeToLive(ctx, g.ID, clientv3.WithAttachedKeys())
	if err != nil || ttl.TTL < 98 || len(ttl.Keys) != 1 {
		t.Fatalf("lease after restart: %+v %v", ttl, err)
	}
	// A watch resumes from a past revision across the restart.
	wr := recvWatch(t, c2.Watch(ctx, "r/", clientv3.WithPrefix(), clientv3.WithRev(before.rev-1)))
	if len(wr.Events) != 3 || wr.Events[0].Kv.ModRevision != before.rev-1 || wr.Events[2].Kv.ModRevision != before.rev {
		t.Fatalf("resumed watch: %+v", wr.Events)
	}
	// New writes continue the revisions.
	pr, err := c2.Put(ctx, "r/new", "v")
	if err != nil || pr.Header.Revision != before.rev+1 {
		t.Fatalf("put after restart: %+v %v", pr, err)
	}
}

// Many concurrent writers: every write acknowledged, revisions dense and
// unique, a watcher sees every change exactly once in order, and group
// commit actually grouped.
func TestConcurrentWritesGroupCommit(t *testing.T) {
	s := startServer(t, "", nil)
	c := newClient(t, s)
	ctx := testCtx(t)
	wch := c.Watch(ctx, "c/", clientv3.WithPrefix())
	const writers, each = 16, 50
	revs := make(chan int64, writers*each)
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				resp, err := c.Put(ctx, fmt.Sprintf("c/%d/%d", w, i), "v")
				if err != nil {
					errs <- err
					return
				}
				revs <- resp.Header.Revision
			}
		}()
	}
	// Readers alongside: a read never sees a revision not yet durable, so
	// every revision a read reports must be one the watcher gets too.
	var rwg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := c.Get(ctx, "c/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	rwg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	close(revs)
	seen := map[int64]bool{}
	for r := range revs {
		if seen[r] {
			t.Fatalf("revision %d acknowledged twice", r)
		}
		seen[r] = true
	}
	for r := int64(2); r < 2+writers*each; r++ {
		if !seen[r] {
			t.Fatalf("revision %d missing", r)
		}
	}
	next := int64(2)
	for next < 2+writers*each {
		for _, ev := range recvWatch(t, wch).Events {
			if ev.Kv.ModRevision != next {
				t.Fatalf("watch event revision %d, want %d", ev.Kv.ModRevision, next)
			}
			next++
		}
	}
	mfs, err := s.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "aether_edge_commit_batch_changes" {
			h := mf.GetMetric()[0].GetHistogram()
			if h.GetSampleSum() != writers*each {
				t.Fatalf("batches persisted %v changes, want %d", h.GetSampleSum(), writers*each)
			}
			if h.GetSampleCount() >= writers*each {
				t.Fatalf("%d batches for %d concurrent writes: no grouping", h.GetSampleCount(), writers*each)
			}
			return
		}
	}
	t.Fatal("batch metric not found")
}

func TestStatusMembersAndIDsMatchEtcd(t *testing.T) {
	peers := map[string][]url.URL{
		"e1": {{Scheme: "http", Host: "10.0.0.1:2380"}, {Scheme: "http", Host: "10.0.0.1:2381"}},
		"e2": {{Scheme: "http", Host: "10.0.0.2:2380"}},
	}
	s := startServer(t, "", func(c *Config) {
		c.InitialCluster = peers
		c.InitialClusterToken = "tok"
		c.AdvertiseClientURLs = []url.URL{{Scheme: "http", Host: "edge.example:2379"}}
	})
	// etcd's own membership code computes the ids we must match.
	um := types.URLsMap{}
	for n, us := range peers {
		um[n] = types.URLs(us)
	}
	rc, err := membership.NewClusterFromURLsMap(zap.NewNop(), "tok", um)
	if err != nil {
		t.Fatal(err)
	}
	if uint64(rc.ID()) != s.ClusterID() {
		t.Fatalf("cluster id %x, etcd says %x", s.ClusterID(), uint64(rc.ID()))
	}
	want := map[uint64]string{}
	for _, m := range rc.Members() {
		want[uint64(m.ID)] = m.Name
	}
	if want[s.MemberID()] != "e1" {
		t.Fatalf("member id %x is not etcd's id for e1 (%v)", s.MemberID(), want)
	}

	c := newClient(t, s)
	ctx := testCtx(t)
	ml, err := c.MemberList(ctx)
	if err != nil || len(ml.Members) != 2 {
		t.Fatalf("member list: %+v %v", ml, err)
	}
	for _, m := range ml.Members {
		if want[m.ID] != m.Name {
			t.Fatalf("member %x named %q, etcd says %q", m.ID, m.Name, want[m.ID])
		}
		if m.Name == "e1" && (len(m.ClientURLs) != 1 || m.ClientURLs[0] != "http://edge.example:2379" || len(m.PeerURLs) != 2) {
			t.Fatalf("self member: %+v", m)
		}
	}
	c.Put(ctx, "k", "v")
	c.Grant(ctx, 10) // a change without a revision: raft_index counts it
	st, err := c.Status(ctx, s.ClientURLs()[0])
	if err != nil {
		t.Fatal(err)
	}
	if st.Version != "3.7.3" || st.Leader != s.MemberID() || st.RaftIndex != 2 || st.RaftAppliedIndex != 2 ||
		st.RaftTerm != raftTerm || st.DbSize <= 0 || st.Header.Revision != 2 || st.IsLearner {
		t.Fatalf("status: %+v", st)
	}
	if _, err := c.Defragment(ctx, s.ClientURLs()[0]); err != nil {
		t.Fatalf("defragment: %v", err)
	}
	al, err := c.AlarmList(ctx)
	if err != nil || len(al.Alarms) != 0 {
		t.Fatalf("alarms: %+v %v", al, err)
	}
	_, err = c.MemberAdd(ctx, []string{"http://10.0.0.3:2380"})
	if status.Code(err) != codes.Unimplemented || !strings.Contains(err.Error(), "membership changes are not supported") {
		t.Fatalf("member add: %v", err)
	}
	_, err = c.UserAdd(ctx, "u", "p")
	if status.Code(err) != codes.Unimplemented || !strings.Contains(err.Error(), "authentication is not supported") {
		t.Fatalf("user add: %v", err)
	}
	as, err := c.AuthStatus(ctx)
	if err != nil || as.Enabled {
		t.Fatalf("auth status: %+v %v", as, err)
	}
	rs, err := extClient(t, s).ReplicationStatus(ctx, &edgev1.ReplicationStatusRequest{Hashes: [][]byte{make([]byte, 32)}})
	// e2 is a peer (sync.go) that never answers: listed, holding nothing.
	if err != nil || len(rs.Peers) != 1 || rs.Peers[0].Name != "e2" || rs.Peers[0].Has[0] || rs.Header.MemberId != s.MemberID() {
		t.Fatalf("replication status: %+v %v", rs, err)
	}
}

// gRPC and HTTP/1 share the client port.
func TestHTTPOnClientPort(t *testing.T) {
	s := startServer(t, "", nil)
	c := newClient(t, s)
	if _, err := c.Put(testCtx(t), "k", "v"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(s.ClientURLs()[0] + "/health")
	if err != nil {
		t.Fatal(err)
	}
	var h map[string]string
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil || resp.StatusCode != 200 || h["health"] != "true" {
		t.Fatalf("/health: %d %v %v", resp.StatusCode, h, err)
	}
	resp.Body.Close()
	resp, err = http.Get(s.ClientURLs()[0] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("/metrics: %d %.200s", resp.StatusCode, body)
	}
	for _, want := range []string{
		"aether_edge_commit_batch_changes_count 1",
		"etcd_server_has_leader 1",
		"etcd_debugging_mvcc_current_revision 2",
		`grpc_server_handled_total{grpc_code="OK",grpc_method="Put",grpc_service="etcdserverpb.KV",grpc_type="unary"} 1`,
		`etcd_server_version{server_version="3.7.3"} 1`,
		"etcd_disk_wal_fsync_duration_seconds_count 1",
	} {
		if !bytes.Contains(body, []byte(want)) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// --enable-pprof serves Go's profiles on the client URLs as etcd does;
// without it the paths are not there.
func TestPprofOnlyWhenEnabled(t *testing.T) {
	status := func(s *Server, path string) (int, string) {
		t.Helper()
		resp, err := http.Get(s.ClientURLs()[0] + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	off := startServer(t, "", nil)
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/cmdline"} {
		if code, _ := status(off, path); code != http.StatusNotFound {
			t.Errorf("pprof off: %s answered %d, want 404", path, code)
		}
	}
	on := startServer(t, "", func(c *Config) { c.EnablePprof = true })
	if code, body := status(on, "/debug/pprof/"); code != 200 || !strings.Contains(body, "goroutine") {
		t.Errorf("pprof on: /debug/pprof/ answered %d %.200q, want the index", code, body)
	}
	if code, body := status(on, "/debug/pprof/goroutine?debug=1"); code != 200 || !strings.Contains(body, "edge.(*committer).run") {
		t.Errorf("pprof on: goroutine profile %d %.300q, want the committer's goroutine in it", code, body)
	}
	// The other endpoints are still served beside it.
	if code, _ := status(on, "/health"); code != 200 {
		t.Errorf("pprof on: /health answered %d", code)
	}
}

func TestStartRefusesUnknownMember(t *testing.T) {
	cfg := Config{
		Name: "nope", DataDir: t.TempDir(),
		ListenClientURLs: []url.URL{{Scheme: "http", Host: "127.0.0.1:0"}},
		InitialCluster:   map[string][]url.URL{"e1": {{Scheme: "http", Host: "127.0.0.1:2380"}}},
	}
	if _, err := Start(testCtx(t), cfg); err == nil || !strings.Contains(err.Error(), `member "nope" is not in the initial cluster`) {
		t.Fatalf("Start: %v", err)
	}
	_ = pb.AlarmRequest_GET
}

// When storage fails the in-memory state is ahead of the disk: the server
// must stop acknowledging anything, say so in Status and /health, and
// never show the unpersisted change. The failure is real: the log is
// closed under the server.
func TestStorageFailureStopsServing(t *testing.T) {
	s := startServer(t, "", nil)
	c := newClient(t, s)
	ctx := testCtx(t)
	if _, err := c.Put(ctx, "k", "durable"); err != nil {
		t.Fatal(err)
	}
	if err := s.store.Close(); err != nil {
		t.Fatal(err)
	}
	_, err := c.Put(ctx, "k", "lost")
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "storage failed") {
		t.Fatalf("put after a storage failure: %v", err)
	}
	if _, err := c.Get(ctx, "k"); status.Code(err) != codes.Unavailable {
		t.Fatalf("get after a storage failure: %v", err)
	}
	if s.Ready() {
		t.Fatal("Ready after a storage failure")
	}
	st, err := c.Status(ctx, s.ClientURLs()[0])
	if err != nil || len(st.Errors) == 0 {
		t.Fatalf("status after a storage failure: %+v %v", st, err)
	}
	resp, err := http.Get(s.ClientURLs()[0] + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("/health after a storage failure: %d", resp.StatusCode)
	}
}

// Close ends every goroutine the server started: the count returns to
// what it was before Start once the server and its client are closed.
func TestCloseJoinsGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	func() {
		s := startServer(t, "", nil)
		c, err := clientv3.New(clientv3.Config{Endpoints: s.ClientURLs(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		ctx := testCtx(t)
		wch := c.Watch(ctx, "k", clientv3.WithPrefix())
		g, _ := c.Grant(ctx, 30)
		if _, err := c.KeepAlive(ctx, g.ID); err != nil {
			t.Fatal(err)
		}
		c.Put(ctx, "k", "v", clientv3.WithLease(g.ID))
		recvWatch(t, wch)
		lc := v3lockpb.NewLockClient(c.ActiveConnection())
		if _, err := lc.Lock(ctx, &v3lockpb.LockRequest{Name: []byte("m"), Lease: int64(g.ID)}); err != nil {
			t.Fatal(err)
		}
		c.Close()
		closeServer(t, s)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines before Start, %d after Close:\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A checkpoint whose snapshot does not decode is refused by name, not
// skipped: replaying only the changes after it would serve a state with
// a hole in it.
func TestStartRefusesDamagedCheckpoint(t *testing.T) {
	dir := t.TempDir()
	s := startServer(t, dir, nil)
	c := newClient(t, s)
	if _, err := c.Put(testCtx(t), "k", "v"); err != nil {
		t.Fatal(err)
	}
	closeServer(t, s)
	l, err := storage.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Checkpoint(storage.Checkpoint{Index: 1, KeepFrom: 2, Snapshot: []byte("state")}); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Name: "e1", DataDir: dir, ListenClientURLs: []url.URL{{Scheme: "http", Host: "127.0.0.1:0"}},
		AdvertisePeerURLs: []url.URL{{Scheme: "http", Host: "127.0.0.1:2380"}}}
	if _, err := Start(testCtx(t), cfg); err == nil || !strings.Contains(err.Error(), "restore the checkpoint at index 1") {
		t.Fatalf("Start on a checkpointed data dir: %v", err)
	}
}
