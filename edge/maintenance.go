package edge

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Version is what Status reports: the etcd release whose API this server
// implements, so clients and tools that gate features on the server version
// (etcdctl, clientv3's version checks, Kubernetes) treat it as that etcd.
const Version = "3.7.3"

// storageVersion is etcd 3.7's storage schema version as Status reports it.
const storageVersion = "3.7.0"

type maintenanceServer struct {
	pb.UnimplementedMaintenanceServer
	s *Server
}

// Status fills every field etcd does. There is no raft: this member is its
// own leader, the term is constant, and the raft indexes are the core's
// apply index (each change gets the next one), committed = applied.
func (m *maintenanceServer) Status(ctx context.Context, r *pb.StatusRequest) (*pb.StatusResponse, error) {
	s := m.s
	s.mu.RLock()
	index := s.st.Index()
	s.mu.RUnlock()
	rev := s.currentRev()
	size := s.store.Size()
	resp := &pb.StatusResponse{
		Header:           s.header(nil, rev),
		Version:          Version,
		DbSize:           size,
		DbSizeInUse:      size,
		Leader:           s.memberID,
		RaftIndex:        index,
		RaftTerm:         raftTerm,
		RaftAppliedIndex: index,
		DbSizeQuota:      s.quota,
		StorageVersion:   storageVersion,
		DowngradeInfo:    &pb.DowngradeInfo{},
	}
	if err := s.failure(); err != nil {
		resp.Errors = append(resp.Errors, err.Error())
	}
	// etcd lists the active alarms as errors.
	for _, a := range s.activeAlarms(pb.AlarmType_NONE) {
		resp.Errors = append(resp.Errors, a.String())
	}
	return resp, nil
}

// HashKV hashes the keys and values at a revision (0 = current). Unlike
// etcd's, the hash leaves revisions out, so two replicas that converged on
// the same key space agree on it (the convergence check of part 2).
func (m *maintenanceServer) HashKV(ctx context.Context, r *pb.HashKVRequest) (*pb.HashKVResponse, error) {
	s := m.s
	if c, ok := s.compactionHash(r.Revision); ok {
		return &pb.HashKVResponse{Header: s.header(nil, s.currentRev()), Hash: c.hash, CompactRevision: c.prev, HashRevision: c.rev}, nil
	}
	var h uint32
	var hashRev, compacted int64
	rev, err := s.read(ctx, func() (err error) {
		h, hashRev, err = s.st.HashKV(r.Revision)
		compacted = s.st.CompactRev()
		return err
	})
	if err != nil {
		return nil, err
	}
	return &pb.HashKVResponse{Header: s.header(nil, rev), Hash: h, CompactRevision: compacted, HashRevision: hashRev}, nil
}

// etcd hashes the store at every compaction and keeps the last ten hashes
// (storage/mvcc/hash.go); HashKV of exactly such a revision answers the
// kept hash, even once a later compaction has removed that revision, with
// the compaction before it as CompactRevision. The same here, in memory as
// in etcd.
const compactionHashesKept = 10

type compactionHash struct {
	rev, prev int64
	hash      uint32
}

// noteCompactionHash hashes the store at rev, just compacted after prev.
// The caller holds compactMu, so rev is still the compaction revision and
// still readable.
func (s *Server) noteCompactionHash(rev, prev int64) {
	s.mu.RLock()
	h, _, err := s.st.HashKV(rev)
	s.mu.RUnlock()
	if err != nil {
		return
	}
	s.hashMu.Lock()
	defer s.hashMu.Unlock()
	s.compactionHashes = append(s.compactionHashes, compactionHash{rev: rev, prev: prev, hash: h})
	if n := len(s.compactionHashes); n > compactionHashesKept {
		s.compactionHashes = append([]compactionHash(nil), s.compactionHashes[n-compactionHashesKept:]...)
	}
}

func (s *Server) compactionHash(rev int64) (compactionHash, bool) {
	s.hashMu.Lock()
	defer s.hashMu.Unlock()
	for _, c := range s.compactionHashes {
		if c.rev == rev {
			return c, true
		}
	}
	return compactionHash{}, false
}

// Hash (deprecated in etcd) answers the HashKV of the current revision.
func (m *maintenanceServer) Hash(ctx context.Context, r *pb.HashRequest) (*pb.HashResponse, error) {
	resp, err := m.HashKV(ctx, &pb.HashKVRequest{})
	if err != nil {
		return nil, err
	}
	return &pb.HashResponse{Header: resp.Header, Hash: resp.Hash}, nil
}

func (m *maintenanceServer) Defragment(ctx context.Context, r *pb.DefragmentRequest) (*pb.DefragmentResponse, error) {
	m.s.log.Info("starting defragment")
	if err := m.s.store.Defragment(); err != nil {
		m.s.log.Warn("failed to defragment", "err", err)
		return nil, status.Errorf(codes.Unknown, "edge: defragment: %v", err)
	}
	m.s.log.Info("finished defragment")
	return &pb.DefragmentResponse{}, nil
}

// Alarm is etcd's: GET lists this member's active alarms (of a type, or
// all), ACTIVATE raises one, DEACTIVATE clears one (answering it when it
// was active). The edge store raises NOSPACE itself (quota.go) and enforces
// it; CORRUPT it never raises (no corruption checker), and activating it by
// hand is refused since nothing here would act on it.
func (m *maintenanceServer) Alarm(ctx context.Context, r *pb.AlarmRequest) (*pb.AlarmResponse, error) {
	s := m.s
	resp := &pb.AlarmResponse{Alarms: []*pb.AlarmMember{}}
	switch r.Action {
	case pb.AlarmRequest_GET:
		resp.Alarms = s.activeAlarms(r.Alarm)
	case pb.AlarmRequest_ACTIVATE:
		switch r.Alarm {
		case pb.AlarmType_NONE:
			// etcd ignores it the same way.
		case pb.AlarmType_NOSPACE:
			if _, err := s.setAlarm(r.Alarm, true); err != nil {
				return nil, status.Error(codes.Unavailable, err.Error())
			}
			resp.Alarms = append(resp.Alarms, &pb.AlarmMember{MemberID: s.memberID, Alarm: r.Alarm})
		default:
			return nil, status.Errorf(codes.Unimplemented, "edge: activating the %s alarm is not supported: the edge store would not act on it", r.Alarm)
		}
	case pb.AlarmRequest_DEACTIVATE:
		was, err := s.setAlarm(r.Alarm, false)
		if err != nil {
			return nil, status.Error(codes.Unavailable, err.Error())
		}
		if was {
			resp.Alarms = append(resp.Alarms, &pb.AlarmMember{MemberID: s.memberID, Alarm: r.Alarm})
		}
	default:
		return nil, status.Errorf(codes.InvalidArgument, "edge: unknown alarm action %d", r.Action)
	}
	resp.Header = s.header(nil, s.currentRev())
	return resp, nil
}

func (m *maintenanceServer) Snapshot(r *pb.SnapshotRequest, srv pb.Maintenance_SnapshotServer) error {
	return status.Error(codes.Unimplemented, "edge: Snapshot is not supported: the edge store's data file is not an etcd backend snapshot")
}

// MoveLeader: there is no leader election; this member is always the
// leader. Moving to itself succeeds as in etcd; any other target is refused.
func (m *maintenanceServer) MoveLeader(ctx context.Context, r *pb.MoveLeaderRequest) (*pb.MoveLeaderResponse, error) {
	if r.TargetID == m.s.memberID {
		return &pb.MoveLeaderResponse{Header: m.s.header(nil, m.s.currentRev())}, nil
	}
	return nil, status.Error(codes.Unimplemented, "edge: MoveLeader is not supported: edge replicas have no leader to move")
}

func (m *maintenanceServer) Downgrade(ctx context.Context, r *pb.DowngradeRequest) (*pb.DowngradeResponse, error) {
	return nil, status.Error(codes.Unimplemented, "edge: Downgrade is not supported by the edge store")
}

// currentRev is the newest durable revision: what headers of requests that
// read no data carry, so no client hears of a revision a crash could undo.
func (s *Server) currentRev() int64 {
	rev, _ := s.hub.snapshot()
	return rev
}

type clusterServer struct {
	pb.UnimplementedClusterServer
	s *Server
}

// MemberList answers the configured initial cluster. Only this member's
// client URLs are known (part 1 has no peer traffic to learn the others').
func (c *clusterServer) MemberList(ctx context.Context, r *pb.MemberListRequest) (*pb.MemberListResponse, error) {
	s := c.s
	out := make([]*pb.Member, 0, len(s.members))
	for _, m := range s.members {
		pm := &pb.Member{ID: m.id, Name: m.name, PeerURLs: m.peerURLs}
		if m.id == s.memberID {
			pm.ClientURLs = s.advertiseClientURLs()
		}
		out = append(out, pm)
	}
	return &pb.MemberListResponse{Header: s.header(nil, s.currentRev()), Members: out}, nil
}

func (s *Server) advertiseClientURLs() []string {
	if len(s.cfg.AdvertiseClientURLs) == 0 {
		return s.ClientURLs()
	}
	return urlStrings(s.cfg.AdvertiseClientURLs)
}

const memberChangeMsg = "edge: membership changes are not supported: the edge store's members are fixed by --initial-cluster"

func (c *clusterServer) MemberAdd(context.Context, *pb.MemberAddRequest) (*pb.MemberAddResponse, error) {
	return nil, status.Error(codes.Unimplemented, memberChangeMsg)
}

func (c *clusterServer) MemberRemove(context.Context, *pb.MemberRemoveRequest) (*pb.MemberRemoveResponse, error) {
	return nil, status.Error(codes.Unimplemented, memberChangeMsg)
}

func (c *clusterServer) MemberUpdate(context.Context, *pb.MemberUpdateRequest) (*pb.MemberUpdateResponse, error) {
	return nil, status.Error(codes.Unimplemented, memberChangeMsg)
}

func (c *clusterServer) MemberPromote(context.Context, *pb.MemberPromoteRequest) (*pb.MemberPromoteResponse, error) {
	return nil, status.Error(codes.Unimplemented, memberChangeMsg)
}

// authServer: authentication is not supported. AuthStatus answers
// "disabled" (true, and tools probe it); every other call is Unimplemented.
type authServer struct {
	pb.UnimplementedAuthServer
	s *Server
}

const authMsg = "edge: authentication is not supported by the edge store"

func (a *authServer) AuthStatus(ctx context.Context, r *pb.AuthStatusRequest) (*pb.AuthStatusResponse, error) {
	return &pb.AuthStatusResponse{Header: a.s.header(nil, a.s.currentRev()), Enabled: false}, nil
}

func (a *authServer) AuthDisable(ctx context.Context, r *pb.AuthDisableRequest) (*pb.AuthDisableResponse, error) {
	// Already disabled: etcd answers success too.
	return &pb.AuthDisableResponse{Header: a.s.header(nil, a.s.currentRev())}, nil
}

func (a *authServer) Authenticate(context.Context, *pb.AuthenticateRequest) (*pb.AuthenticateResponse, error) {
	// etcd's own answer when auth is off.
	return nil, rpctypes.ErrGRPCAuthNotEnabled
}
