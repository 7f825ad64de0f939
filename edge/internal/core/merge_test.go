package core

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

type replica struct {
	s   *State
	g   *gen
	log []*Applied // every change in the order this replica applied it
}

// sync sends every change a has that b lacks, in a's order (causal: a
// change's parents come before it).
func syncTo(t *testing.T, now time.Time, a, b *replica) {
	t.Helper()
	for _, ap := range a.log {
		got, err := b.s.Merge(now, ap.Encoded)
		if err != nil {
			t.Fatalf("merge %s into replica %d: %v", ap.ID, b.s.Replica(), err)
		}
		if got != nil {
			b.log = append(b.log, got)
		}
	}
}

// keyValues is what the conflict rule makes converge: each key's value.
func keyValues(t *testing.T, s *State) string {
	resp, err := s.Range(&pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, kv := range resp.Kvs {
		fmt.Fprintf(&b, "%q=%q ", kv.Key, kv.Value)
	}
	h, _, _ := s.HashKV(0)
	fmt.Fprintf(&b, "hash %08x leases %v", h, s.leaseIDs())
	return b.String()
}

// TestMergeConverges runs three replicas writing concurrently (random
// requests, random partial syncs between them), then syncs all: every
// replica must end with the same keys and values (HashKV agrees), whatever
// order it merged in; and each replica's log replays to its exact state.
func TestMergeConverges(t *testing.T) {
	for seed := uint64(1); seed <= 30; seed++ {
		now := time.Unix(1_800_000_000, 0)
		rs := make([]*replica, 3)
		for i := range rs {
			rs[i] = &replica{s: New(ReplicaID(i + 1)), g: newGen(seed*10 + uint64(i))}
		}
		pick := newGen(seed)
		for range 300 {
			// Clocks are skewed: replica i runs i seconds behind, so
			// stamps, not arrival, must decide.
			now = now.Add(time.Duration(pick.r.IntN(5)) * time.Millisecond)
			if pick.r.IntN(4) == 0 {
				a, b := rs[pick.r.IntN(3)], rs[pick.r.IntN(3)]
				syncTo(t, now, a, b)
				continue
			}
			r := rs[pick.r.IntN(3)]
			req := r.g.next(false)
			if req.Compact != nil {
				continue // compaction forgets the parents late changes name: part 2
			}
			if req.Grant != nil {
				req.Grant.ID = 0 // replica-chosen ids: distinct across replicas
			}
			local := now.Add(-time.Duration(r.s.Replica()) * time.Second)
			r.log = append(r.log, coreApply(t, r.s, local, req)...)
			r.g.observe(r.s.Rev(), r.s.CompactRev(), r.s.leaseIDs())
		}
		for range 2 {
			for _, a := range rs {
				for _, b := range rs {
					syncTo(t, now, a, b)
				}
			}
		}
		want := keyValues(t, rs[0].s)
		for _, r := range rs[1:] {
			if got := keyValues(t, r.s); got != want {
				t.Fatalf("seed %d: replica %d has\n%s\nreplica 1 has\n%s", seed, r.s.Replica(), got, want)
			}
		}
		for _, r := range rs {
			if r.s.Index() != rs[0].s.Index() || fmt.Sprint(r.s.Heads()) != fmt.Sprint(rs[0].s.Heads()) {
				t.Fatalf("seed %d: replica %d applied %d changes to heads %x, replica 1 %d to %x", seed, r.s.Replica(), r.s.Index(), r.s.Heads(), rs[0].s.Index(), rs[0].s.Heads())
			}
			fresh := New(r.s.Replica())
			for _, ap := range r.log {
				if err := fresh.Replay(ap.Encoded, ap.Index, ap.Rev); err != nil {
					t.Fatalf("seed %d: replica %d replay index %d: %v", seed, r.s.Replica(), ap.Index, err)
				}
			}
			fresh.PromoteLeases(now)
			r.s.PromoteLeases(now)
			if a, b := dump(t, r.s), dump(t, fresh); a != b {
				t.Fatalf("seed %d: replica %d does not replay to itself:\n%s\n---\n%s", seed, r.s.Replica(), a, b)
			}
		}
	}
}

// The conflict rule on one key, step by step.
func TestMergeLastWriterWins(t *testing.T) {
	a, b := New(1), New(2)
	at := func(s int) time.Time { return time.Unix(100+int64(s), 0) }
	_, base, _ := a.Put(at(0), put("k", "base"))
	if _, err := b.Merge(at(0), base.Encoded); err != nil {
		t.Fatal(err)
	}
	// Concurrent: a writes at t=1, b at t=2 (b's stamp is later).
	_, pa, _ := a.Put(at(1), put("k", "from-a"))
	_, pb2, _ := b.Put(at(2), put("k", "from-b"))
	ma, err := a.Merge(at(3), pb2.Encoded)
	if err != nil || ma.Rev != a.Rev() || len(ma.Events) != 1 {
		t.Fatalf("b's later write at a: %+v %v; want a new revision with its event", ma, err)
	}
	mb, err := b.Merge(at(3), pa.Encoded)
	if err != nil || mb.Rev != 0 || len(mb.Events) != 0 {
		t.Fatalf("a's earlier write at b: %+v %v; want a change that loses: no revision, no event", mb, err)
	}
	if x, y := keyValues(t, a), keyValues(t, b); x != y || !strings.Contains(x, "from-b") {
		t.Fatalf("a %s, b %s", x, y)
	}
	if len(a.Heads()) != 2 || len(b.Heads()) != 2 {
		t.Fatalf("heads %d and %d after concurrent writes, want 2 each", len(a.Heads()), len(b.Heads()))
	}
	// A's next change has both heads as parents: the DAG joins again.
	_, join, _ := a.Put(at(0), put("j", "1")) // a's wall is behind: the HLC is not
	if len(join.Change.Parents) != 2 || join.Change.Stamp.Compare(pb2.Change.Stamp) <= 0 {
		t.Fatalf("join change %+v: want 2 parents and a stamp after b's", join.Change)
	}
	// A delete is a tombstone with the same order: a's delete (after
	// everything it saw) beats b's older concurrent put.
	_, del, _ := a.DeleteRange(at(0), &pb.DeleteRangeRequest{Key: []byte("k")})
	_, late, _ := b.Put(at(2), put("k", "late")) // b has not seen a's delete; its clock is behind it
	if _, err := b.Merge(at(4), join.Encoded); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Merge(at(4), del.Encoded); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Merge(at(4), late.Encoded); err != nil {
		t.Fatal(err)
	}
	if x, y := keyValues(t, a), keyValues(t, b); x != y {
		t.Fatalf("after delete vs put: a %s, b %s", x, y)
	}
	// Merging is idempotent, and refuses a change whose parents it lacks.
	if got, err := a.Merge(at(5), late.Encoded); got != nil || err != nil {
		t.Fatalf("second merge: %v %v", got, err)
	}
	c := New(3)
	if _, err := c.Merge(at(5), late.Encoded); !errors.Is(err, ErrMissingParents) {
		t.Fatalf("merge without parents: %v", err)
	}
	// A replica's own change comes back only through Replay.
	fresh := New(1)
	if _, err := fresh.Merge(at(5), base.Encoded); err == nil {
		t.Fatal("replica 1 merged a change of its own")
	}
}
