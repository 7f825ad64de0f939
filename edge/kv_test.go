package edge

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/aethermesh/aether/internal/testutil/etcdtest"
)

func keysOf(resp *clientv3.GetResponse) string {
	var ks []string
	for _, kv := range resp.Kvs {
		ks = append(ks, string(kv.Key))
	}
	return strings.Join(ks, ",")
}

func TestKVRangeOptions(t *testing.T) {
	s := startServer(t, "", nil)
	c := newClient(t, s)
	ctx := testCtx(t)

	var revs []int64
	for i, k := range []string{"a/3", "a/1", "a/2", "b/1"} {
		resp, err := c.Put(ctx, k, fmt.Sprintf("v%d", i))
		if err != nil {
			t.Fatalf("put %s: %v", k, err)
		}
		revs = append(revs, resp.Header.Revision)
	}
	// The empty store is at revision 1, as etcd's: the first put is 2.
	if revs[0] != 2 || revs[3] != 5 {
		t.Fatalf("put revisions = %v, want 2..5", revs)
	}
	if _, err := c.Put(ctx, "a/1", "v1b"); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		key  string
		opts []clientv3.OpOption
		want string
	}{
		{"prefix", "a/", []clientv3.OpOption{clientv3.WithPrefix()}, "a/1,a/2,a/3"},
		{"limit", "a/", []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithLimit(2)}, "a/1,a/2"},
		{"sort desc by key", "a/", []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend)}, "a/3,a/2,a/1"},
		{"sort by mod rev", "a/", []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByModRevision, clientv3.SortAscend)}, "a/3,a/2,a/1"},
		{"from key", "a/2", []clientv3.OpOption{clientv3.WithFromKey()}, "a/2,a/3,b/1"},
		{"range", "a/1", []clientv3.OpOption{clientv3.WithRange("a/3")}, "a/1,a/2"},
		{"at revision", "a/", []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithRev(3)}, "a/1,a/3"},
		{"min mod rev", "", []clientv3.OpOption{clientv3.WithFromKey(), clientv3.WithMinModRev(5)}, "a/1,b/1"},
		{"max create rev", "", []clientv3.OpOption{clientv3.WithFromKey(), clientv3.WithMaxCreateRev(3)}, "a/1,a/3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := tc.key
			if key == "" {
				key = "\x00"
			}
			resp, err := c.Get(ctx, key, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			if got := keysOf(resp); got != tc.want {
				t.Fatalf("keys = %q, want %q", got, tc.want)
			}
			if resp.Header.Revision != 6 || resp.Header.MemberId != s.MemberID() || resp.Header.ClusterId != s.ClusterID() || resp.Header.RaftTerm != raftTerm {
				t.Fatalf("header = %+v", resp.Header)
			}
		})
	}

	resp, err := c.Get(ctx, "a/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 3 || len(resp.Kvs) != 0 {
		t.Fatalf("count only: %v %v", resp, err)
	}
	resp, err = c.Get(ctx, "a/", clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(1))
	if err != nil || len(resp.Kvs) != 1 || len(resp.Kvs[0].Value) != 0 || !resp.More || resp.Count != 3 {
		t.Fatalf("keys only + limit: %v %v", resp, err)
	}
	resp, err = c.Get(ctx, "a/1", clientv3.WithSerializable())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("serializable: %v %v", resp, err)
	}
	kv := resp.Kvs[0]
	if string(kv.Value) != "v1b" || kv.CreateRevision != 3 || kv.ModRevision != 6 || kv.Version != 2 {
		t.Fatalf("a/1 = %+v", kv)
	}
}

func TestKVPutDeleteTxn(t *testing.T) {
	s := startServer(t, "", nil)
	c := newClient(t, s)
	ctx := testCtx(t)

	if _, err := c.Put(ctx, "k", "v1"); err != nil {
		t.Fatal(err)
	}
	pr, err := c.Put(ctx, "k", "v2", clientv3.WithPrevKV())
	if err != nil || pr.PrevKv == nil || string(pr.PrevKv.Value) != "v1" {
		t.Fatalf("put prev_kv: %v %v", pr, err)
	}
	if _, err := c.Put(ctx, "k", "", clientv3.WithIgnoreValue()); err != nil {
		t.Fatalf("ignore value: %v", err)
	}
	gr, _ := c.Get(ctx, "k")
	if string(gr.Kvs[0].Value) != "v2" || gr.Kvs[0].Version != 3 {
		t.Fatalf("after ignore_value: %+v", gr.Kvs[0])
	}
	// etcd's validation errors, before the core.
	if _, err := c.Put(ctx, "", "v"); !errors.Is(err, rpctypes.ErrEmptyKey) {
		t.Fatalf("empty key: %v", err)
	}
	if _, err := c.Put(ctx, "k", "x", clientv3.WithIgnoreValue()); !errors.Is(err, rpctypes.ErrValueProvided) {
		t.Fatalf("value provided: %v", err)
	}
	if _, err := c.Put(ctx, "k", "x", clientv3.WithLease(12345)); !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		t.Fatalf("unknown lease: %v", err)
	}

	for _, k := range []string{"d/1", "d/2", "d/3"} {
		if _, err := c.Put(ctx, k, k); err != nil {
			t.Fatal(err)
		}
	}
	before, _ := c.Get(ctx, "x")
	dr, err := c.Delete(ctx, "d/", clientv3.WithPrefix(), clientv3.WithPrevKV())
	if err != nil || dr.Deleted != 3 || len(dr.PrevKvs) != 3 || dr.Header.Revision != before.Header.Revision+1 {
		t.Fatalf("delete prefix: %+v %v", dr, err)
	}
	// Deleting nothing is not a change: no new revision, as in etcd.
	dr, err = c.Delete(ctx, "d/", clientv3.WithPrefix())
	if err != nil || dr.Deleted != 0 || dr.Header.Revision != before.Header.Revision+1 {
		t.Fatalf("delete nothing: %+v %v", dr, err)
	}

	// Txn: compare on a missing key uses etcd's zero values.
	tr, err := c.Txn(ctx).If(
		clientv3.Compare(clientv3.Version("missing"), "=", 0),
		clientv3.Compare(clientv3.Value("k"), "=", "v2"),
	).Then(
		clientv3.OpPut("t1", "a"),
		clientv3.OpTxn(nil, []clientv3.Op{clientv3.OpPut("t2", "b")}, nil),
		clientv3.OpGet("k"),
	).Else(clientv3.OpPut("t3", "c")).Commit()
	if err != nil || !tr.Succeeded || len(tr.Responses) != 3 {
		t.Fatalf("txn: %+v %v", tr, err)
	}
	gr, _ = c.Get(ctx, "t", clientv3.WithPrefix())
	if keysOf(gr) != "t1,t2" {
		t.Fatalf("txn wrote %q", keysOf(gr))
	}
	// A read-only txn does not bump the revision.
	rev := gr.Header.Revision
	tr, err = c.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision("nope"), ">", 0)).Else(clientv3.OpGet("t1")).Commit()
	if err != nil || tr.Succeeded || tr.Header.Revision != rev {
		t.Fatalf("read-only txn: %+v %v", tr, err)
	}
	_, err = c.Txn(ctx).Then(clientv3.OpPut("dup", "1"), clientv3.OpPut("dup", "2")).Commit()
	if !errors.Is(err, rpctypes.ErrDuplicateKey) {
		t.Fatalf("duplicate key txn: %v", err)
	}
	ops := make([]clientv3.Op, DefaultMaxTxnOps+1)
	for i := range ops {
		ops[i] = clientv3.OpPut(fmt.Sprintf("many/%d", i), "v")
	}
	if _, err := c.Txn(ctx).Then(ops...).Commit(); !errors.Is(err, rpctypes.ErrTooManyOps) {
		t.Fatalf("too many ops: %v", err)
	}
}

func TestKVCompact(t *testing.T) {
	s := startServer(t, "", nil)
	c := newClient(t, s)
	ctx := testCtx(t)
	for i := 0; i < 5; i++ {
		if _, err := c.Put(ctx, "k", fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	// revisions 2..6
	if _, err := c.Compact(ctx, 10); !errors.Is(err, rpctypes.ErrFutureRev) {
		t.Fatalf("future compaction: %v", err)
	}
	if _, err := c.Compact(ctx, 4); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Compact(ctx, 4); !errors.Is(err, rpctypes.ErrCompacted) {
		t.Fatalf("repeated compaction: %v", err)
	}
	if _, err := c.Get(ctx, "k", clientv3.WithRev(3)); !errors.Is(err, rpctypes.ErrCompacted) {
		t.Fatalf("read below compaction: %v", err)
	}
	gr, err := c.Get(ctx, "k", clientv3.WithRev(4))
	if err != nil || string(gr.Kvs[0].Value) != "2" {
		t.Fatalf("read at compaction: %v %v", gr, err)
	}
	if _, err := c.Get(ctx, "k", clientv3.WithRev(7)); !errors.Is(err, rpctypes.ErrFutureRev) {
		t.Fatalf("future read: %v", err)
	}
}

func TestRequestTooLarge(t *testing.T) {
	s := startServer(t, "", func(c *Config) { c.MaxRequestBytes = 1024 })
	c := newClient(t, s)
	ctx := testCtx(t)
	// Over MaxRequestBytes: etcd's "request is too large".
	if _, err := c.Put(ctx, "k", strings.Repeat("x", 2000)); !errors.Is(err, rpctypes.ErrRequestTooLarge) {
		t.Fatalf("put over the limit: %v", err)
	}
	// Over MaxRequestBytes + 512 KiB: gRPC itself refuses the message.
	_, err := c.Put(ctx, "k", strings.Repeat("x", 1024+grpcOverheadBytes))
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("put over the gRPC limit: %v", err)
	}
	// Reads are not held to MaxRequestBytes (etcd checks only raft
	// requests), but a key that fits passes on writes.
	if _, err := c.Get(ctx, strings.Repeat("k", 2000)); err != nil {
		t.Fatalf("large read: %v", err)
	}
	if _, err := c.Put(ctx, "k", strings.Repeat("x", 900)); err != nil {
		t.Fatalf("put under the limit: %v", err)
	}
}

// HashKV's CompactRevision follows etcd's hash cache: at a revision where a
// compaction happened it is the compaction before that one. The same
// sequence runs against a real etcd and the edge store.
func TestHashKVCompactRevisionLikeEtcd(t *testing.T) {
	run := func(c *clientv3.Client, ep string) string {
		ctx := testCtx(t)
		gr, err := c.Get(ctx, "x")
		if err != nil {
			t.Fatal(err)
		}
		base := gr.Header.Revision
		var out []string
		for i := range 8 {
			if _, err := c.Put(ctx, "k", fmt.Sprint(i)); err != nil {
				t.Fatal(err)
			}
		}
		for _, rev := range []int64{base + 2, base + 5} {
			if _, err := c.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil {
				t.Fatal(err)
			}
		}
		for _, rev := range []int64{0, base + 2, base + 4, base + 5, base + 6} {
			h, err := c.HashKV(ctx, ep, rev)
			if err != nil {
				out = append(out, fmt.Sprintf("rev+%d: %v", rev-base, err))
				continue
			}
			cr := h.CompactRevision
			if cr > 0 {
				cr -= base
			}
			out = append(out, fmt.Sprintf("rev+%d: compact %d hashrev+%d", max(rev-base, 0), cr, h.HashRevision-base))
		}
		return strings.Join(out, "; ")
	}
	etcd := etcdtest.Start(t)
	want := run(etcd.Client(t), etcd.Endpoints()[0])
	s := startServer(t, "", nil)
	if got := run(newClient(t, s), s.ClientURLs()[0]); got != want {
		t.Fatalf("edge: %s\netcd: %s", got, want)
	}
}

// etcd's tests/common TestAlarm, against the edge store: a small quota,
// puts until "database space exceeded" raises NOSPACE, writes refused while
// it is active, compaction and defragmentation make room, disarming
// restores writes; the alarm survives a restart.
func TestQuotaNoSpaceAlarm(t *testing.T) {
	dir := t.TempDir()
	quota := func(c *Config) { c.QuotaBackendBytes = 13 * 4096 }
	s := startServer(t, dir, quota)
	c := newClient(t, s)
	ctx := testCtx(t)
	if _, err := c.Put(ctx, "1st_test", strings.Repeat("a", 64)); err != nil {
		t.Fatal(err)
	}
	buf := strings.Repeat("b", 4096)
	puts := 0
	for {
		_, err := c.Put(ctx, "2nd_test", buf)
		if err != nil {
			if !errors.Is(err, rpctypes.ErrNoSpace) {
				t.Fatalf("put over the quota: %v", err)
			}
			break
		}
		if puts++; puts > 100 {
			t.Fatal("the quota never ran out")
		}
	}
	al, err := c.AlarmList(ctx)
	if err != nil || len(al.Alarms) != 1 || al.Alarms[0].Alarm != pb.AlarmType_NOSPACE || al.Alarms[0].MemberID != s.MemberID() {
		t.Fatalf("alarms: %+v %v", al, err)
	}
	if _, err := c.Put(ctx, "3rd_test", "small"); !errors.Is(err, rpctypes.ErrNoSpace) {
		t.Fatalf("put while NOSPACE is active: %v", err)
	}
	if _, err := c.Grant(ctx, 10); !errors.Is(err, rpctypes.ErrNoSpace) {
		t.Fatalf("lease grant while NOSPACE is active: %v", err)
	}
	if _, err := c.Delete(ctx, "1st_test"); err != nil {
		t.Fatalf("delete while NOSPACE is active: %v", err)
	}
	st, err := c.Status(ctx, s.ClientURLs()[0])
	if err != nil || len(st.Errors) != 1 || st.DbSizeQuota != 13*4096 {
		t.Fatalf("status: %+v %v", st, err)
	}
	closeServer(t, s)

	s = startServer(t, dir, quota)
	c = newClient(t, s)
	al, err = c.AlarmList(ctx)
	if err != nil || len(al.Alarms) != 1 {
		t.Fatalf("alarms after a restart: %+v %v", al, err)
	}
	gr, _ := c.Get(ctx, "x")
	if _, err := c.Compact(ctx, gr.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Defragment(ctx, s.ClientURLs()[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, "4th_test", "small"); !errors.Is(err, rpctypes.ErrNoSpace) {
		t.Fatalf("put before disarming: %v", err)
	}
	for _, a := range al.Alarms {
		if _, err := c.AlarmDisarm(ctx, (*clientv3.AlarmMember)(a)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Put(ctx, "4th_test", "small"); err != nil {
		t.Fatalf("put after compaction and disarming: %v", err)
	}
	if al, _ := c.AlarmList(ctx); len(al.Alarms) != 0 {
		t.Fatalf("alarms after disarming: %v", al.Alarms)
	}
}
