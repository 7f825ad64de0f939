package core

import (
	"errors"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// Lease ids a replica chooses carry its tag in the high bits: positive,
// increasing, and disjoint from another replica's.
func TestLeaseIDsFromReplica(t *testing.T) {
	seen := map[int64]ReplicaID{}
	for _, r := range []ReplicaID{1, 2, 0xdeadbeefcafe, 1<<64 - 1} {
		s := New(r)
		for range 3 {
			resp, _, err := s.LeaseGrant(t0, &pb.LeaseGrantRequest{TTL: 5})
			if err != nil {
				t.Fatal(err)
			}
			if resp.ID <= 0 || uint64(resp.ID)>>leaseSeqBits != LeaseTag(r) {
				t.Fatalf("replica %x: id %x, want a positive id tagged %x", r, resp.ID, LeaseTag(r))
			}
			if o, dup := seen[resp.ID]; dup {
				t.Fatalf("id %x chosen by replicas %x and %x", resp.ID, o, r)
			}
			seen[resp.ID] = r
		}
	}
	// A client's id is honoured; taking it twice is etcd's LeaseExist, and
	// the replica's own sequence skips ids clients took.
	s := New(1)
	own := int64(LeaseTag(1)<<leaseSeqBits | 1)
	if resp, _, err := s.LeaseGrant(t0, &pb.LeaseGrantRequest{ID: own, TTL: 5}); err != nil || resp.ID != own {
		t.Fatalf("client id: %v %v", resp, err)
	}
	if _, _, err := s.LeaseGrant(t0, &pb.LeaseGrantRequest{ID: own, TTL: 5}); !errors.Is(err, rpctypes.ErrGRPCLeaseExist) {
		t.Fatalf("second grant of %x: %v", own, err)
	}
	if resp, _, _ := s.LeaseGrant(t0, &pb.LeaseGrantRequest{TTL: 5}); resp.ID == own {
		t.Fatal("the replica chose an id a client holds")
	}
}

func TestLeaseTTLs(t *testing.T) {
	s := New(1)
	resp, _, _ := s.LeaseGrant(t0, &pb.LeaseGrantRequest{ID: 1, TTL: 0})
	if resp.TTL != DefaultMinLeaseTTL {
		t.Fatalf("TTL 0 granted as %d, want etcd's minimum %d", resp.TTL, DefaultMinLeaseTTL)
	}
	s.LeaseGrant(t0, &pb.LeaseGrantRequest{ID: 2, TTL: 10})
	ttl, _ := s.LeaseTimeToLive(t0.Add(3500*time.Millisecond), &pb.LeaseTimeToLiveRequest{ID: 2})
	if ttl.TTL != 6 || ttl.GrantedTTL != 10 {
		t.Fatalf("after 3.5s of 10: TTL %d granted %d, want 6 (truncated) and 10", ttl.TTL, ttl.GrantedTTL)
	}
	if got, err := s.LeaseRenew(t0.Add(5*time.Second), 2); err != nil || got != 10 {
		t.Fatalf("renew: %d %v", got, err)
	}
	if ttl, _ := s.LeaseTimeToLive(t0.Add(5*time.Second), &pb.LeaseTimeToLiveRequest{ID: 2}); ttl.TTL != 10 {
		t.Fatalf("after renew: TTL %d", ttl.TTL)
	}
	if next, ok := s.NextLeaseExpiry(); !ok || !next.Equal(t0.Add(2*time.Second)) {
		t.Fatalf("next expiry %v %v, want lease 1's at t0+2s", next, ok)
	}
	if _, err := s.LeaseRenew(t0.Add(2*time.Second), 1); !errors.Is(err, rpctypes.ErrGRPCLeaseNotFound) {
		t.Fatalf("renew of an expired lease: %v, want not found as etcd", err)
	}
	if ttl, _ := s.LeaseTimeToLive(t0, &pb.LeaseTimeToLiveRequest{ID: 99}); ttl.TTL != -1 || ttl.ID != 99 {
		t.Fatalf("missing lease: %v, want TTL -1 as etcd", ttl)
	}
}

// A revoke, and an expiry, deletes the lease's keys in one change, in key
// order; keys that moved to another lease or were deleted stay out.
func TestLeaseRevokeAndExpiry(t *testing.T) {
	s := New(1)
	s.LeaseGrant(t0, &pb.LeaseGrantRequest{ID: 1, TTL: 10})
	s.LeaseGrant(t0, &pb.LeaseGrantRequest{ID: 2, TTL: 20})
	for _, k := range []string{"c", "a", "b", "moved", "gone"} {
		if _, _, err := s.Put(t0, &pb.PutRequest{Key: []byte(k), Lease: 1}); err != nil {
			t.Fatal(err)
		}
	}
	s.Put(t0, &pb.PutRequest{Key: []byte("moved"), Lease: 2})
	s.DeleteRange(t0, &pb.DeleteRangeRequest{Key: []byte("gone")})
	ttl, _ := s.LeaseTimeToLive(t0, &pb.LeaseTimeToLiveRequest{ID: 1, Keys: true})
	if got := keysOf(ttl.Keys); got != "a,b,c" {
		t.Fatalf("lease 1 keys %s", got)
	}
	if got := s.ExpireLeases(t0.Add(9 * time.Second)); len(got) != 0 {
		t.Fatalf("expired early: %v", got)
	}
	// A lease of another replica is not ours to expire.
	s.applyRemoteGrant(t, 3, 99)
	got := s.ExpireLeases(t0.Add(20 * time.Second))
	if len(got) != 2 {
		t.Fatalf("%d expiries, want 2 (one change each)", len(got))
	}
	var keys []string
	for _, ev := range got[0].Events {
		if ev.Type != mvccpb.Event_DELETE || ev.Kv.ModRevision != got[0].Rev {
			t.Fatalf("expiry event %v", ev)
		}
		keys = append(keys, string(ev.Kv.Key))
	}
	if k := keysOf2(keys); k != "a,b,c" {
		t.Fatalf("lease 1 expiry deleted %s, want a,b,c in order", k)
	}
	if ops := got[0].Change.Ops; ops[len(ops)-1].Kind != OpLeaseRevoke || ops[len(ops)-1].Lease != 1 {
		t.Fatalf("expiry change ops %v", ops)
	}
	if len(got[1].Events) != 1 || string(got[1].Events[0].Kv.Key) != "moved" {
		t.Fatalf("lease 2 expiry: %v", got[1].Events)
	}
	if l := s.Leases().Leases; len(l) != 1 || l[0].ID != 99 {
		t.Fatalf("leases left %v, want only the remote one", l)
	}
	// After a restart every lease gets its full TTL again.
	s.PromoteLeases(t0.Add(time.Hour))
	if next, ok := s.NextLeaseExpiry(); ok {
		t.Fatalf("next expiry %v: the only lease left is another replica's", next)
	}
}

// applyRemoteGrant applies a grant made by another replica, as part 2's
// merge will: through Replay, the only way in for a foreign change today.
func (s *State) applyRemoteGrant(t *testing.T, from ReplicaID, id int64) {
	t.Helper()
	c := &Change{Parents: s.Heads(), Replica: from, Stamp: s.Clock().Next(0), Ops: []Op{{Kind: OpLeaseGrant, Lease: id, TTL: 1}}}
	if err := s.Replay(c.Encode(), s.Index()+1, 0); err != nil {
		t.Fatal(err)
	}
}

func keysOf(ks [][]byte) string {
	var out []string
	for _, k := range ks {
		out = append(out, string(k))
	}
	return keysOf2(out)
}

func keysOf2(ks []string) string {
	s := ""
	for i, k := range ks {
		if i > 0 {
			s += ","
		}
		s += k
	}
	return s
}
