package core

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// coreApply runs one generated request and returns the changes it made.
func coreApply(t *testing.T, s *State, now time.Time, r request) []*Applied {
	t.Helper()
	var a *Applied
	switch {
	case r.Put != nil:
		_, a, _ = s.Put(now, r.Put)
	case r.Delete != nil:
		_, a, _ = s.DeleteRange(now, r.Delete)
	case r.Txn != nil:
		_, a, _ = s.Txn(now, r.Txn)
	case r.Compact != nil:
		_ = s.Compact(r.Compact.Revision)
	case r.Grant != nil:
		_, a, _ = s.LeaseGrant(now, r.Grant)
	case r.Revoke != nil:
		_, a, _ = s.LeaseRevoke(now, r.Revoke.ID)
	default:
		if _, err := coreDo(s, now, r); err != nil && r.Range == nil && r.Watch == nil {
			t.Fatalf("%s: %v", r, err)
		}
	}
	if a == nil {
		return nil
	}
	return []*Applied{a}
}

// dump renders everything a client or a peer can observe of a state, at
// every revision it still has, and what it keeps to decide later merges:
// equal dumps mean equal states.
func dump(t *testing.T, s *State) string {
	t.Helper()
	return observable(t, s) + internals(s)
}

// observable is what clients and peers see of a state: values and hashes
// at every retained revision, the change bookkeeping, events, leases.
func observable(t *testing.T, s *State) string {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "rev %d index %d compact %d heads %x clock %v\n", s.Rev(), s.Index(), s.CompactRev(), s.Heads(), s.Clock())
	for rev := max(s.CompactRev(), 1); rev <= s.Rev(); rev++ {
		h, _ := s.HashOfRevision(rev)
		kv, hr, err := s.HashKV(rev)
		resp, rerr := s.Range(&pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, Revision: rev})
		if err != nil || rerr != nil || hr != rev {
			t.Fatalf("rev %d: hashkv %v, range %v", rev, err, rerr)
		}
		fmt.Fprintf(&b, "rev %d change %x hashkv %08x kvs %v\n", rev, h[:4], kv, resp.Kvs)
	}
	for i := uint64(1); i <= s.Index(); i++ {
		h, _ := s.HashOfIndex(i)
		rev, _ := s.RevisionOf(h)
		fmt.Fprintf(&b, "index %d change %x rev %d\n", i, h[:4], rev)
	}
	evs, err := s.Events(max(s.CompactRev(), 1), []byte{0}, []byte{0})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(&b, "events %v\n", evs)
	for _, l := range s.Leases().Leases {
		ttl, _ := s.LeaseTimeToLive(time.Unix(0, 0), &pb.LeaseTimeToLiveRequest{ID: l.ID, Keys: true})
		fmt.Fprintf(&b, "lease %d granted %d keys %q\n", l.ID, ttl.GrantedTTL, ttl.Keys)
	}
	return b.String()
}

// internals is what a state keeps to decide later merges and answer for
// its history.
func internals(s *State) string {
	var b strings.Builder
	// What compaction left (incremental compactions leave what one would).
	versions := 0
	s.order.ascend(nil, nil, func(k *keyRec) bool {
		fmt.Fprintf(&b, "winner %q %v %d\n", k.key, k.win, k.winRepl)
		if k.doc != nil {
			var ds strings.Builder
			docString(&ds, k.doc.root, "", 0)
			fmt.Fprintf(&b, "doc %q lease %d by %v\n%s", k.key, k.doc.lease, k.doc.leaseReg, ds.String())
		}
		for _, g := range k.gens {
			versions += len(g.revs)
		}
		return true
	})
	fmt.Fprintf(&b, "keys %d (%d ordered) versions %d\n", len(s.keys), s.order.n, versions)
	// The chains and what GC keeps: a replayed replica answers for them
	// as the first did.
	fmt.Fprintf(&b, "vector %v collected %v tombstones %d forgotten %d\n", s.Vector(), s.Collected(), s.Tombstones(), s.Forgotten())
	for _, r := range slices.Sorted(maps.Keys(s.chains)) {
		ch := s.chains[r]
		fmt.Fprintf(&b, "chain %d n %d last %v stable %d base %d stamps %v gone %v\n", r, ch.n, ch.last, ch.stable, ch.base, ch.stamps, ch.gone)
	}
	return b.String()
}

// TestReplayReproducesState applies random sequences (with lease expiries
// and compactions) to one state, replays the changes it returned into a
// fresh one, as recovery does, and requires the same observable state:
// revisions, hashes, values at every revision, events, leases.
func TestReplayReproducesState(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		a := New(3)
		g := newGen(seed)
		now := time.Unix(1_800_000_000, 0)
		var log []*Applied
		for range 400 {
			r := g.next(true)
			if r.Grant != nil {
				r.Grant.TTL = int64(g.r.IntN(30)) // short: some expire below
				if g.r.IntN(3) == 0 {
					r.Grant.ID = 0 // the replica chooses
				}
			}
			aps := coreApply(t, a, now, r)
			now = now.Add(time.Duration(g.r.IntN(2000)) * time.Millisecond)
			aps = append(aps, a.ExpireLeases(now)...)
			for _, ap := range aps {
				checkApplied(t, a, ap)
			}
			log = append(log, aps...)
			g.observe(a.Rev(), a.CompactRev(), a.leaseIDs())
		}
		b := New(3)
		for _, ap := range log {
			if err := b.Replay(ap.Encoded, ap.Index, ap.Rev); err != nil {
				t.Fatalf("seed %d: replay: %v", seed, err)
			}
		}
		if a.CompactRev() >= 0 {
			if err := b.Compact(a.CompactRev()); err != nil {
				t.Fatalf("seed %d: compact: %v", seed, err)
			}
		}
		b.PromoteLeases(now)
		if da, db := dump(t, a), dump(t, b); da != db {
			t.Fatalf("seed %d: replayed state differs:\n--- applied\n%s\n--- replayed\n%s", seed, da, db)
		}
		// The replayed replica goes on where the first left off: its next
		// lease id and stamp are new.
		ga, _, err := a.LeaseGrant(now, &pb.LeaseGrantRequest{TTL: 10})
		if err != nil {
			t.Fatal(err)
		}
		gb, _, err := b.LeaseGrant(now, &pb.LeaseGrantRequest{TTL: 10})
		if err != nil || gb.ID != ga.ID {
			t.Fatalf("seed %d: next lease id after replay %d (%v), want %d", seed, gb.GetID(), err, ga.ID)
		}
	}
}

func TestReplayRefusesWhatDoesNotFit(t *testing.T) {
	a := New(1)
	now := time.Unix(100, 0)
	_, put, _ := a.Put(now, &pb.PutRequest{Key: []byte("k"), Value: []byte("v")})
	_, grant, _ := a.LeaseGrant(now, &pb.LeaseGrantRequest{ID: 5, TTL: 10})
	_, del, _ := a.DeleteRange(now, &pb.DeleteRangeRequest{Key: []byte("k")})

	b := New(1)
	if err := b.Replay(put.Encoded, 2, put.Rev); err == nil {
		t.Error("replay at index 2 of an empty state accepted")
	}
	if err := b.Replay(put.Encoded, 1, 5); err == nil {
		t.Error("replay with a wrong revision accepted")
	}
	if err := b.Replay(del.Encoded, 1, 2); err == nil {
		t.Error("replay of a change out of order accepted")
	}
	forged := &Change{Replica: 1, Ops: []Op{{Kind: OpDelete, Key: []byte("nope")}}}
	if err := b.Replay(forged.Encode(), 1, 2); err == nil {
		t.Error("replay of a delete of a missing key accepted")
	}
	bad := append([]byte{}, put.Encoded...)
	bad[len(bad)-1] ^= 1
	if err := b.Replay(bad[:len(bad)-2], 1, 2); err == nil {
		t.Error("replay of a truncated change accepted")
	}
	if err := b.Replay(put.Encoded, 1, put.Rev); err != nil {
		t.Fatal(err)
	}
	if err := b.Replay(grant.Encoded, 2, 5); err == nil {
		t.Error("replay of a grant with a revision accepted")
	}
	if err := b.Replay(grant.Encoded, 2, 0); err != nil {
		t.Fatal(err)
	}
	if err := b.Replay(grant.Encoded, 3, 0); err == nil {
		t.Error("replay of the same change twice accepted")
	}
	if err := b.Replay(del.Encoded, 3, del.Rev); err != nil {
		t.Fatal(err)
	}
	if b.Rev() != a.Rev() || b.Index() != a.Index() {
		t.Fatalf("replayed rev %d index %d, want %d %d", b.Rev(), b.Index(), a.Rev(), a.Index())
	}
}

// checkApplied holds an Applied to its contract: its encoding is its
// change's, its id the hash, and the events published live are the ones a
// watch catching up from its revision would get.
func checkApplied(t *testing.T, s *State, ap *Applied) {
	t.Helper()
	if !bytes.Equal(ap.Change.Encode(), ap.Encoded) || ap.ID != ap.Change.ID() {
		t.Fatalf("index %d: encoding or id is not the change's", ap.Index)
	}
	if ap.Rev == 0 {
		if len(ap.Events) != 0 {
			t.Fatalf("index %d: events without a revision", ap.Index)
		}
		return
	}
	evs, err := s.Events(ap.Rev, []byte{0}, []byte{0})
	if err != nil {
		t.Fatal(err)
	}
	var atRev []*mvccpb.Event
	for _, ev := range evs {
		if ev.Kv.ModRevision == ap.Rev {
			atRev = append(atRev, ev)
		}
	}
	if fmt.Sprint(atRev) != fmt.Sprint(ap.Events) {
		t.Fatalf("index %d rev %d: published %v, catch-up gives %v", ap.Index, ap.Rev, ap.Events, atRev)
	}
}
