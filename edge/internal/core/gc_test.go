package core

import (
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// Vector counts each replica's changes in chain order, as the sync log
// numbers them; StampOf answers for each; a change at or before its
// author's last applied stamp is a duplicate even when its hash is gone.
func TestChainTracking(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	a, b := New(1), New(2)
	var la, lb []*Applied
	for i := range 5 {
		la = append(la, mustPut(t, a, "k", "a"))
		if i%2 == 0 {
			lb = append(lb, mustPut(t, b, "j", "b"))
		}
	}
	for _, ap := range la {
		if _, err := b.Merge(now, ap.Encoded); err != nil {
			t.Fatal(err)
		}
	}
	lb = append(lb, mustPut(t, b, "k", "b"))
	for _, ap := range lb {
		if _, err := a.Merge(now, ap.Encoded); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []*State{a, b} {
		v := s.Vector()
		if len(v) != 2 || v[1] != 5 || v[2] != 4 {
			t.Fatalf("replica %d: vector %v, want 1:5 2:4", s.Replica(), v)
		}
		for r, log := range map[ReplicaID][]*Applied{1: la, 2: lb} {
			for i, ap := range log {
				st, ok := s.StampOf(r, uint64(i+1))
				if !ok || st != ap.Change.Stamp {
					t.Fatalf("replica %d: stamp of %d's change %d = %v %v, want %v", s.Replica(), r, i+1, st, ok, ap.Change.Stamp)
				}
				if pr, seq, ok := s.ChainPos(ap.ID); !ok || pr != r || seq != uint64(i+1) {
					t.Fatalf("replica %d: position of %d's change %d = %d %d %v", s.Replica(), r, i+1, pr, seq, ok)
				}
			}
			if last, _ := s.LastStamp(r); last != log[len(log)-1].Change.Stamp {
				t.Fatalf("replica %d: last stamp of %d = %v", s.Replica(), r, last)
			}
		}
		if _, ok := s.StampOf(1, 6); ok {
			t.Fatal("stamp of a change not applied")
		}
	}
	// Duplicates by stamp: every change again, in order, changes nothing.
	for _, ap := range append(la, lb...) {
		if got, err := b.Merge(now, ap.Encoded); got != nil || err != nil {
			t.Fatalf("duplicate merged: %v %v", got, err)
		}
	}
}

// The resurrection bug of part 2: a replica that compacted past a delete
// dropped the key's record, and with it the tombstone's winner, so a put
// concurrent with the delete (and older: it should lose), arriving after
// the compaction, brought the key back at that replica only.
func TestLateConcurrentPutAfterCompactedDeleteStaysDeleted(t *testing.T) {
	at := func(s int) time.Time { return time.Unix(1_800_000_000+int64(s), 0) }
	a, b, c := New(1), New(2), New(3)
	base := mustPutAt(t, a, at(0), "k", "base")
	for _, s := range []*State{b, c} {
		if _, err := s.Merge(at(0), base.Encoded); err != nil {
			t.Fatal(err)
		}
	}
	_, del, err := c.DeleteRange(at(2), &pb.DeleteRangeRequest{Key: []byte("k")})
	if err != nil {
		t.Fatal(err)
	}
	late := mustPutAt(t, b, at(1), "k", "late") // concurrent with the delete, earlier
	if _, err := a.Merge(at(3), del.Encoded); err != nil {
		t.Fatal(err)
	}
	other := mustPutAt(t, a, at(3), "other", "1") // compaction keeps a tombstone at its own revision: go past it
	if err := a.Compact(a.Rev()); err != nil {
		t.Fatal(err)
	}
	got, err := a.Merge(at(3), late.Encoded)
	if err != nil {
		t.Fatal(err)
	}
	if got.Rev != 0 || len(got.Events) != 0 {
		t.Fatalf("the late put took effect: rev %d events %v", got.Rev, got.Events)
	}
	resp, err := a.Range(&pb.RangeRequest{Key: []byte("k")})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 0 {
		t.Fatalf("k came back after compaction: %v", resp.Kvs)
	}
	for _, ap := range []*Applied{late, other} {
		if _, err := c.Merge(at(3), ap.Encoded); err != nil {
			t.Fatal(err)
		}
	}
	ha, _, _ := a.HashKV(0)
	hc, _, _ := c.HashKV(0)
	if ha != hc {
		t.Fatalf("replicas diverged: hashkv %08x at the compacted one, %08x at the other", ha, hc)
	}
}

func mustPutAt(t *testing.T, s *State, now time.Time, k, v string) *Applied {
	t.Helper()
	_, a, err := s.Put(now, put(k, v))
	if err != nil {
		t.Fatal(err)
	}
	return a
}
