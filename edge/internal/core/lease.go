package core

import (
	"math"
	"sort"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// leaseRec is one lease. Only its granter expires it: expiry is that
// replica's clock (package doc, "Leases").
type leaseRec struct {
	id      int64
	ttl     int64 // granted TTL, seconds
	granter ReplicaID
	stamp   HLC // the granting change's (record sets it): a snapshot merge tells by it whether a side saw the grant
	expiry  time.Time
	keys    map[string]struct{}
}

// Lease ids a replica chooses are tag<<leaseSeqBits | seq: the tag comes
// from the replica id, so two replicas (with different tags) never choose
// the same id, and the result is a positive int64 as etcd's.
const leaseSeqBits = 40

// LeaseTag is the high part of the lease ids replica id chooses: in
// [1, 2^23-1], so ids stay positive int64s.
func LeaseTag(id ReplicaID) uint64 { return uint64(id)%(1<<23-1) + 1 }

func (s *State) nextLeaseID() int64 {
	for {
		s.leaseSeq++
		id := int64(LeaseTag(s.id)<<leaseSeqBits | s.leaseSeq&(1<<leaseSeqBits-1))
		if s.leases[id] == nil {
			return id
		}
	}
}

// noteLeaseIDs moves the sequence past the ids a replayed change of ours
// granted, so a restarted replica does not choose them again.
func (s *State) noteLeaseIDs(c *Change) {
	tag := LeaseTag(s.id)
	for _, op := range c.Ops {
		if op.Kind == OpLeaseGrant && op.Lease > 0 && uint64(op.Lease)>>leaseSeqBits == tag {
			if seq := uint64(op.Lease) & (1<<leaseSeqBits - 1); seq > s.leaseSeq {
				s.leaseSeq = seq
			}
		}
	}
}

func (s *State) grant(id, ttl int64, granter ReplicaID, now time.Time) {
	s.leases[id] = &leaseRec{id: id, ttl: ttl, granter: granter, expiry: now.Add(time.Duration(ttl) * time.Second), keys: map[string]struct{}{}}
}

func (s *State) attach(id int64, key []byte) {
	if l := s.leases[id]; l != nil {
		l.keys[string(key)] = struct{}{}
	}
}

func (s *State) detach(id int64, key []byte) {
	if l := s.leases[id]; l != nil {
		delete(l.keys, string(key))
	}
}

// LeaseGrant grants a lease: the client's id when it chose one (etcd's
// ErrGRPCLeaseExist if taken), else the next id of this replica; the TTL
// raised to the minimum. One change, which touches no keys.
func (s *State) LeaseGrant(now time.Time, req *pb.LeaseGrantRequest) (*pb.LeaseGrantResponse, *Applied, error) {
	id := req.GetID()
	if req.GetTTL() > MaxLeaseTTL {
		return nil, nil, rpctypes.ErrGRPCLeaseTTLTooLarge
	}
	if id != 0 && s.leases[id] != nil {
		return nil, nil, rpctypes.ErrGRPCLeaseExist
	}
	if id == 0 {
		id = s.nextLeaseID()
	}
	ttl := req.GetTTL()
	if ttl < s.minLeaseTTL {
		ttl = s.minLeaseTTL
	}
	w := s.newWriter()
	s.grant(id, ttl, s.id, now)
	w.ops = append(w.ops, Op{Kind: OpLeaseGrant, Lease: id, TTL: ttl})
	a := w.commit(now)
	return &pb.LeaseGrantResponse{Header: &pb.ResponseHeader{Revision: s.rev}, ID: id, TTL: ttl}, a, nil
}

// LeaseRevoke revokes a lease and deletes its keys, in key order as etcd
// does, in one change (with a revision when there were keys).
func (s *State) LeaseRevoke(now time.Time, id int64) (*pb.LeaseRevokeResponse, *Applied, error) {
	l := s.leases[id]
	if l == nil {
		return nil, nil, rpctypes.ErrGRPCLeaseNotFound
	}
	a := s.revoke(now, l)
	return &pb.LeaseRevokeResponse{Header: &pb.ResponseHeader{Revision: s.rev}}, a, nil
}

func (s *State) revoke(now time.Time, l *leaseRec) *Applied {
	w := s.newWriter()
	for _, k := range sortedKeys(l.keys) {
		w.del([]byte(k))
	}
	delete(s.leases, l.id)
	w.ops = append(w.ops, Op{Kind: OpLeaseRevoke, Lease: l.id})
	return w.commit(now)
}

// LeaseRenew is a keepalive: the lease's full TTL again from now. Not a
// change. An expired lease is not found, as in etcd (it waits for the
// revoke, then answers not found). So is, for now, a lease another replica
// granted: its granter keeps it alive (how keepalives reach it is part 2's).
func (s *State) LeaseRenew(now time.Time, id int64) (ttl int64, err error) {
	l := s.leases[id]
	if l == nil || l.granter != s.id || !now.Before(l.expiry) {
		return -1, rpctypes.ErrGRPCLeaseNotFound
	}
	l.expiry = now.Add(time.Duration(l.ttl) * time.Second)
	return l.ttl, nil
}

// LeaseTimeToLive answers as etcd's gRPC server does: a missing lease is
// TTL -1 and no error; TTL is the remaining time truncated to seconds;
// keys (when asked) in key order.
func (s *State) LeaseTimeToLive(now time.Time, req *pb.LeaseTimeToLiveRequest) (*pb.LeaseTimeToLiveResponse, error) {
	l := s.leases[req.GetID()]
	if l == nil {
		return &pb.LeaseTimeToLiveResponse{Header: &pb.ResponseHeader{Revision: s.rev}, ID: req.GetID(), TTL: -1}, nil
	}
	remaining := time.Duration(math.MaxInt64)
	if !l.expiry.IsZero() {
		remaining = l.expiry.Sub(now)
	}
	resp := &pb.LeaseTimeToLiveResponse{Header: &pb.ResponseHeader{Revision: s.rev}, ID: l.id, TTL: int64(remaining.Seconds()), GrantedTTL: l.ttl}
	if req.GetKeys() {
		resp.Keys = make([][]byte, 0, len(l.keys))
		for _, k := range sortedKeys(l.keys) {
			resp.Keys = append(resp.Keys, []byte(k))
		}
	}
	return resp, nil
}

// Leases lists the leases by id.
func (s *State) Leases() *pb.LeaseLeasesResponse {
	resp := &pb.LeaseLeasesResponse{Header: &pb.ResponseHeader{Revision: s.rev}, Leases: make([]*pb.LeaseStatus, 0, len(s.leases))}
	for _, id := range s.leaseIDs() {
		resp.Leases = append(resp.Leases, &pb.LeaseStatus{ID: id})
	}
	return resp
}

func (s *State) leaseIDs() []int64 {
	ids := make([]int64, 0, len(s.leases))
	for id := range s.leases {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids
}

// ExpireLeases revokes every lease this replica granted whose expiry is at
// or before now, earliest first (ties by id): one change each.
func (s *State) ExpireLeases(now time.Time) []*Applied {
	var due []*leaseRec
	for _, l := range s.leases {
		if l.granter == s.id && !now.Before(l.expiry) {
			due = append(due, l)
		}
	}
	sort.Slice(due, func(i, j int) bool {
		if !due[i].expiry.Equal(due[j].expiry) {
			return due[i].expiry.Before(due[j].expiry)
		}
		return due[i].id < due[j].id
	})
	out := make([]*Applied, 0, len(due))
	for _, l := range due {
		out = append(out, s.revoke(now, l))
	}
	return out
}

// NextLeaseExpiry is the earliest expiry of a lease this replica granted.
func (s *State) NextLeaseExpiry() (time.Time, bool) {
	var next time.Time
	ok := false
	for _, l := range s.leases {
		if l.granter == s.id && (!ok || l.expiry.Before(next)) {
			next, ok = l.expiry, true
		}
	}
	return next, ok
}

// PromoteLeases gives every lease this replica granted its full TTL again
// from now: after a restart nobody knows how long the replica was down,
// and etcd's lessor does the same when it becomes primary (Promote).
// Leases of other replicas keep no expiry here: their granter expires them.
func (s *State) PromoteLeases(now time.Time) {
	for _, l := range s.leases {
		if l.granter == s.id {
			l.expiry = now.Add(time.Duration(l.ttl) * time.Second)
		} else {
			l.expiry = time.Time{}
		}
	}
}
