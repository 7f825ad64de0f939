package core

import (
	"errors"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

var t0 = time.Unix(1_800_000_000, 0)

func put(k, v string) *pb.PutRequest { return &pb.PutRequest{Key: []byte(k), Value: []byte(v)} }

func opPut(k, v string) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: put(k, v)}}
}

func opGet(k string) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte(k)}}}
}

func opDel(k, end string) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: []byte(k), RangeEnd: []byte(end)}}}
}

func mustPut(t *testing.T, s *State, k, v string) *Applied {
	t.Helper()
	_, a, err := s.Put(t0, put(k, v))
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// Every mutating request is one change with the next index; only those
// that touch keys take a revision (as etcd bumps its revision only then).
func TestIndexAndRevisionRules(t *testing.T) {
	s := New(1)
	if s.Rev() != 1 || s.CompactRev() != -1 || s.Index() != 0 {
		t.Fatalf("empty state at rev %d compact %d index %d, want etcd's 1, -1 and 0", s.Rev(), s.CompactRev(), s.Index())
	}
	steps := []struct {
		name      string
		do        func() (*Applied, error)
		change    bool
		rev       int64 // Applied.Rev
		headerRev int64
	}{
		{"put", func() (*Applied, error) { _, a, err := s.Put(t0, put("a", "1")); return a, err }, true, 2, 2},
		{"lease grant", func() (*Applied, error) {
			_, a, err := s.LeaseGrant(t0, &pb.LeaseGrantRequest{ID: 7, TTL: 60})
			return a, err
		}, true, 0, 2},
		{"delete of nothing", func() (*Applied, error) {
			_, a, err := s.DeleteRange(t0, &pb.DeleteRangeRequest{Key: []byte("zz")})
			return a, err
		}, true, 0, 2},
		{"read-only txn", func() (*Applied, error) {
			_, a, err := s.Txn(t0, &pb.TxnRequest{Success: []*pb.RequestOp{opGet("a")}})
			return a, err
		}, false, 0, 2},
		{"txn taking a branch without writes", func() (*Applied, error) {
			_, a, err := s.Txn(t0, &pb.TxnRequest{Success: []*pb.RequestOp{opGet("a")}, Failure: []*pb.RequestOp{opPut("b", "1")}})
			return a, err
		}, true, 0, 2},
		{"txn writing two keys", func() (*Applied, error) {
			_, a, err := s.Txn(t0, &pb.TxnRequest{Success: []*pb.RequestOp{opPut("b", "1"), opPut("c", "1")}})
			return a, err
		}, true, 3, 3},
		{"revoke of a keyless lease", func() (*Applied, error) {
			_, a, err := s.LeaseRevoke(t0, 7)
			return a, err
		}, true, 0, 3},
		{"delete of two keys", func() (*Applied, error) {
			_, a, err := s.DeleteRange(t0, &pb.DeleteRangeRequest{Key: []byte("b"), RangeEnd: []byte("d")})
			return a, err
		}, true, 4, 4},
		{"failed put", func() (*Applied, error) {
			_, a, err := s.Put(t0, &pb.PutRequest{Key: []byte("a"), Lease: 99})
			return a, err
		}, false, 0, 4},
	}
	index := uint64(0)
	for _, st := range steps {
		a, err := st.do()
		if st.change {
			index++
		}
		if st.change != (a != nil) {
			t.Fatalf("%s: change %v, want %v (err %v)", st.name, a != nil, st.change, err)
		}
		if a != nil && (a.Rev != st.rev || a.Index != index) {
			t.Fatalf("%s: rev %d index %d, want %d %d", st.name, a.Rev, a.Index, st.rev, index)
		}
		if s.Rev() != st.headerRev || s.Index() != index {
			t.Fatalf("%s: state at rev %d index %d, want %d %d", st.name, s.Rev(), s.Index(), st.headerRev, index)
		}
		if a != nil {
			if got, _ := s.HashOfIndex(a.Index); got != a.ID {
				t.Fatalf("%s: index %d maps to %x", st.name, a.Index, got)
			}
			if rev, ok := s.RevisionOf(a.ID); !ok || rev != a.Rev {
				t.Fatalf("%s: RevisionOf = %d %v", st.name, rev, ok)
			}
			if a.Rev != 0 {
				if got, _ := s.HashOfRevision(a.Rev); got != a.ID {
					t.Fatalf("%s: revision %d maps to %x", st.name, a.Rev, got)
				}
			}
			if h := s.Heads(); len(h) != 1 || h[0] != a.ID {
				t.Fatalf("%s: heads %x", st.name, h)
			}
			if a.Change.Replica != 1 || a.ID != a.Change.ID() {
				t.Fatalf("%s: change %+v", st.name, a.Change)
			}
		}
	}
}

// Each change's parents are the heads before it: the log is a chain.
func TestChangesChain(t *testing.T) {
	s := New(1)
	a1 := mustPut(t, s, "a", "1")
	a2 := mustPut(t, s, "a", "2")
	if len(a1.Change.Parents) != 0 || len(a2.Change.Parents) != 1 || a2.Change.Parents[0] != a1.ID {
		t.Fatalf("parents %x then %x, want none then %x", a1.Change.Parents, a2.Change.Parents, a1.ID)
	}
	if a2.Change.Stamp.Compare(a1.Change.Stamp) <= 0 {
		t.Fatalf("stamps %v then %v at the same wall time: not increasing", a1.Change.Stamp, a2.Change.Stamp)
	}
	// The wall clock stepping back does not make stamps go back.
	_, a3, _ := s.Put(t0.Add(-time.Hour), put("a", "3"))
	if a3.Change.Stamp.Compare(a2.Change.Stamp) <= 0 {
		t.Fatalf("stamp %v after %v", a3.Change.Stamp, a2.Change.Stamp)
	}
	if w, r, ok := s.Winner([]byte("a")); !ok || w != a3.Change.Stamp || r != 1 {
		t.Fatalf("winner of a: %v %d %v, want %v 1", w, r, ok, a3.Change.Stamp)
	}
}

// etcd's duplicate-key check takes a range_end of "\x00" literally, so a
// Txn can delete every key >= "a" and put one of them again in the same
// revision. etcd v3.7.3 crashes on two forms of it (see gen_test.go); the
// core answers, and stays consistent through compaction and replay.
func TestTxnDeleteAllThenPut(t *testing.T) {
	s := New(1)
	mustPut(t, s, "a", "1")
	mustPut(t, s, "b", "1")
	txn := &pb.TxnRequest{Success: []*pb.RequestOp{
		opDel("a", "\x00"),
		{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{Success: []*pb.RequestOp{
			{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("b"), IgnoreValue: true, PrevKv: true}}},
		}}}},
	}}
	resp, a, err := s.Txn(t0, txn)
	if err != nil {
		t.Fatal(err)
	}
	if a.Rev != 4 || len(a.Events) != 3 {
		t.Fatalf("rev %d, %d events; want rev 4: delete a, delete b, put b", a.Rev, len(a.Events))
	}
	nested := resp.Responses[1].GetResponseTxn()
	if nested.Header.Revision != 0 || nested.Responses[0].GetResponsePut().PrevKv != nil {
		t.Fatalf("nested response %v: etcd leaves its header empty; b had no value at that point", nested)
	}
	got, _ := s.Range(&pb.RangeRequest{Key: []byte("b")})
	if len(got.Kvs) != 1 || got.Kvs[0].Version != 1 || got.Kvs[0].CreateRevision != 4 {
		t.Fatalf("b after the txn: %v, want a new key created at 4", got.Kvs)
	}
	if err := s.Compact(4); err != nil {
		t.Fatal(err)
	}
	got, err = s.Range(&pb.RangeRequest{Key: []byte("a"), RangeEnd: []byte{0}, Revision: 4})
	if err != nil || len(got.Kvs) != 1 || string(got.Kvs[0].Key) != "b" {
		t.Fatalf("range at the compaction revision: %v %v", got, err)
	}
}

func TestCompactErrors(t *testing.T) {
	s := New(1)
	for range 5 {
		mustPut(t, s, "a", "x")
	}
	mustPut(t, s, "b", "x")
	for _, c := range []struct {
		rev  int64
		want error
	}{
		{8, rpctypes.ErrGRPCFutureRev},
		{3, nil},
		{3, rpctypes.ErrGRPCCompacted},
		{2, rpctypes.ErrGRPCCompacted},
		{7, nil},
	} {
		if err := s.Compact(c.rev); !errors.Is(err, c.want) {
			t.Fatalf("Compact(%d) = %v, want %v", c.rev, err, c.want)
		}
	}
	if _, err := s.Range(&pb.RangeRequest{Key: []byte("a"), Revision: 6}); !errors.Is(err, rpctypes.ErrGRPCCompacted) {
		t.Fatalf("range below the compaction: %v", err)
	}
	if _, err := s.Events(6, []byte("a"), nil); !errors.Is(err, rpctypes.ErrGRPCCompacted) {
		t.Fatalf("events below the compaction: %v", err)
	}
	evs, err := s.Events(7, []byte("a"), []byte{0})
	if err != nil || len(evs) != 1 || string(evs[0].Kv.Key) != "b" || evs[0].PrevKv != nil {
		t.Fatalf("events from the compaction revision: %v %v; want b's put, no prev (create)", evs, err)
	}
	if _, _, err := s.HashKV(6); !errors.Is(err, rpctypes.ErrGRPCCompacted) {
		t.Fatalf("HashKV below the compaction: %v", err)
	}
	if _, _, err := s.HashKV(8); !errors.Is(err, rpctypes.ErrGRPCFutureRev) {
		t.Fatalf("HashKV of the future: %v", err)
	}
	// The bookkeeping of compacted changes goes too; the change that made
	// the compaction revision stays, as that revision is still readable.
	if _, ok := s.HashOfRevision(6); ok {
		t.Error("revision 6 still maps to a change after compaction at 7")
	}
	if h, ok := s.HashOfRevision(7); !ok {
		t.Error("revision 7 no longer maps to its change")
	} else if r, ok := s.RevisionOf(h); !ok || r != 7 {
		t.Errorf("RevisionOf(change of 7) = %d %v", r, ok)
	}
	if _, ok := s.HashOfIndex(5); ok {
		t.Error("index 5 still maps to a change after compaction at 7")
	}
	// Compaction dropped a's older versions but not its current value.
	r, _ := s.Range(&pb.RangeRequest{Key: []byte("a")})
	if len(r.Kvs) != 1 || r.Kvs[0].Version != 5 || r.Kvs[0].CreateRevision != 2 {
		t.Fatalf("a after compaction: %v", r.Kvs)
	}
}

// HashKV covers keys and values only: two replicas that reach the same key
// space through different histories agree; any value difference shows.
func TestHashKVConverges(t *testing.T) {
	a, b := New(1), New(2)
	mustPut(t, a, "x", "1")
	mustPut(t, a, "y", "2")
	mustPut(t, b, "y", "0")
	mustPut(t, b, "z", "9")
	if _, _, err := b.DeleteRange(t0, &pb.DeleteRangeRequest{Key: []byte("z")}); err != nil {
		t.Fatal(err)
	}
	mustPut(t, b, "y", "2")
	mustPut(t, b, "x", "1")
	ha, _, _ := a.HashKV(0)
	hb, _, _ := b.HashKV(0)
	if ha != hb || a.Rev() == b.Rev() {
		t.Fatalf("same keys and values at revisions %d and %d: hashes %08x %08x", a.Rev(), b.Rev(), ha, hb)
	}
	mustPut(t, b, "x", "2")
	if hb2, _, _ := b.HashKV(0); hb2 == ha {
		t.Fatal("a different value, the same hash")
	}
	// A hash at a past revision is the state then.
	if old, _, _ := b.HashKV(b.Rev() - 1); old != ha {
		t.Fatalf("hash at the previous revision %08x, want %08x", old, ha)
	}
	// Key/value boundaries count: ("ab","c") is not ("a","bc").
	c, d := New(1), New(1)
	mustPut(t, c, "ab", "c")
	mustPut(t, d, "a", "bc")
	if hc, _, _ := c.HashKV(0); func() bool { hd, _, _ := d.HashKV(0); return hc == hd }() {
		t.Fatal("hash ignores where the key ends")
	}
}

func TestRequestChecks(t *testing.T) {
	s := New(1)
	mustPut(t, s, "a", "1")
	deep := &pb.TxnRequest{}
	for range 129 {
		deep.Success = append(deep.Success, opGet("a"))
	}
	for name, c := range map[string]struct {
		err  error
		want error
	}{
		"range empty key": {func() error { _, err := s.Range(&pb.RangeRequest{}); return err }(), rpctypes.ErrGRPCEmptyKey},
		"range bad sort":  {func() error { _, err := s.Range(&pb.RangeRequest{Key: []byte("a"), SortOrder: 9}); return err }(), rpctypes.ErrGRPCInvalidSortOption},
		"range future":    {func() error { _, err := s.Range(&pb.RangeRequest{Key: []byte("a"), Revision: 3}); return err }(), rpctypes.ErrGRPCFutureRev},
		"put empty key":   {func() error { _, _, err := s.Put(t0, &pb.PutRequest{}); return err }(), rpctypes.ErrGRPCEmptyKey},
		"put value and ignore": {func() error {
			_, _, err := s.Put(t0, &pb.PutRequest{Key: []byte("a"), Value: []byte("v"), IgnoreValue: true})
			return err
		}(), rpctypes.ErrGRPCValueProvided},
		"put lease and ignore": {func() error {
			_, _, err := s.Put(t0, &pb.PutRequest{Key: []byte("a"), Lease: 1, IgnoreLease: true})
			return err
		}(), rpctypes.ErrGRPCLeaseProvided},
		"put missing lease":     {func() error { _, _, err := s.Put(t0, &pb.PutRequest{Key: []byte("a"), Lease: 1}); return err }(), rpctypes.ErrGRPCLeaseNotFound},
		"ignore on missing key": {func() error { _, _, err := s.Put(t0, &pb.PutRequest{Key: []byte("b"), IgnoreValue: true}); return err }(), rpctypes.ErrGRPCKeyNotFound},
		"delete empty key":      {func() error { _, _, err := s.DeleteRange(t0, &pb.DeleteRangeRequest{}); return err }(), rpctypes.ErrGRPCEmptyKey},
		"txn too many ops":      {func() error { _, _, err := s.Txn(t0, deep); return err }(), rpctypes.ErrGRPCTooManyOps},
		"txn duplicate put": {func() error {
			_, _, err := s.Txn(t0, &pb.TxnRequest{Success: []*pb.RequestOp{opPut("a", "1"), opPut("a", "2")}})
			return err
		}(), rpctypes.ErrGRPCDuplicateKey},
		"txn put under delete": {func() error {
			_, _, err := s.Txn(t0, &pb.TxnRequest{Success: []*pb.RequestOp{opDel("a", "c"), opPut("b", "2")}})
			return err
		}(), rpctypes.ErrGRPCDuplicateKey},
		"txn empty op":          {func() error { _, _, err := s.Txn(t0, &pb.TxnRequest{Success: []*pb.RequestOp{{}}}); return err }(), rpctypes.ErrGRPCKeyNotFound},
		"txn compare empty key": {func() error { _, _, err := s.Txn(t0, &pb.TxnRequest{Compare: []*pb.Compare{{}}}); return err }(), rpctypes.ErrGRPCEmptyKey},
		"grant too long":        {func() error { _, _, err := s.LeaseGrant(t0, &pb.LeaseGrantRequest{TTL: MaxLeaseTTL + 1}); return err }(), rpctypes.ErrGRPCLeaseTTLTooLarge},
		"revoke missing":        {func() error { _, _, err := s.LeaseRevoke(t0, 4); return err }(), rpctypes.ErrGRPCLeaseNotFound},
		"renew missing":         {func() error { _, err := s.LeaseRenew(t0, 4); return err }(), rpctypes.ErrGRPCLeaseNotFound},
	} {
		if !errors.Is(c.err, c.want) {
			t.Errorf("%s: %v, want %v", name, c.err, c.want)
		}
	}
	// A nil nested Txn (in-process only) is the empty Txn, not a crash.
	if resp, _, err := s.Txn(t0, &pb.TxnRequest{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestTxn{}}}}); err != nil || !resp.Responses[0].GetResponseTxn().Succeeded {
		t.Errorf("nil nested txn: %v %v", resp, err)
	}
	// Then/else branches may put the same key: only one of them runs.
	nested := &pb.TxnRequest{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{
		Success: []*pb.RequestOp{opPut("k", "1")}, Failure: []*pb.RequestOp{opPut("k", "2")}}}}}}
	if _, _, err := s.Txn(t0, nested); err != nil {
		t.Errorf("then/else putting one key: %v", err)
	}
	if s.Rev() != 3 || s.Index() != 3 {
		t.Fatalf("after refused requests: rev %d index %d, want 3 and 3 (the empty nested txn and the then/else put)", s.Rev(), s.Index())
	}
}

// Txn compares follow etcd's zero-value rules for missing keys.
func TestCompareMissingKeys(t *testing.T) {
	s := New(1)
	mustPut(t, s, "a", "1")
	cmp := func(c *pb.Compare) bool {
		c.Key = []byte(c.Key)
		resp, _, err := s.Txn(t0, &pb.TxnRequest{Compare: []*pb.Compare{c}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Succeeded
	}
	for name, c := range map[string]struct {
		c    *pb.Compare
		want bool
	}{
		"version of missing = 0":  {&pb.Compare{Key: []byte("m"), Target: pb.Compare_VERSION, TargetUnion: &pb.Compare_Version{}}, true},
		"create of missing = 0":   {&pb.Compare{Key: []byte("m"), Target: pb.Compare_CREATE, TargetUnion: &pb.Compare_CreateRevision{}}, true},
		"lease of missing = 0":    {&pb.Compare{Key: []byte("m"), Target: pb.Compare_LEASE, TargetUnion: &pb.Compare_Lease{}}, true},
		"value of missing = \"\"": {&pb.Compare{Key: []byte("m"), Target: pb.Compare_VALUE, TargetUnion: &pb.Compare_Value{}}, false},
		"value of missing != x":   {&pb.Compare{Key: []byte("m"), Result: pb.Compare_NOT_EQUAL, Target: pb.Compare_VALUE, TargetUnion: &pb.Compare_Value{Value: []byte("x")}}, false},
		"mod of a > 1":            {&pb.Compare{Key: []byte("a"), Result: pb.Compare_GREATER, Target: pb.Compare_MOD, TargetUnion: &pb.Compare_ModRevision{ModRevision: 1}}, true},
		"value of a < 2":          {&pb.Compare{Key: []byte("a"), Result: pb.Compare_LESS, Target: pb.Compare_VALUE, TargetUnion: &pb.Compare_Value{Value: []byte("2")}}, true},
		"range all version = 1":   {&pb.Compare{Key: []byte("a"), RangeEnd: []byte{0}, Target: pb.Compare_VERSION, TargetUnion: &pb.Compare_Version{Version: 1}}, true},
		"empty range version=0":   {&pb.Compare{Key: []byte("b"), RangeEnd: []byte("c"), Target: pb.Compare_VERSION, TargetUnion: &pb.Compare_Version{}}, true},
	} {
		if got := cmp(c.c); got != c.want {
			t.Errorf("%s: %v, want %v", name, got, c.want)
		}
	}
}
