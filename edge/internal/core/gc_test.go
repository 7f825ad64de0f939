package core

import (
	"testing"
	"time"
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
