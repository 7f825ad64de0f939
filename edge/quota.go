package edge

import (
	"fmt"
	"sync"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// The space quota and the NOSPACE alarm, as etcd's (storage/quota.go,
// etcdserver/api/v3rpc/quota.go, etcdserver/api/v3alarm).
//
// What is measured differs, on purpose: etcd bounds its bbolt file, which
// holds the MVCC history and is memory-mapped, so the quota bounds memory
// and disk together. Here the MVCC history lives in the core's memory and
// the disk holds the change log, which compaction does not shorten (storage
// checkpoints will). The quota bounds what compaction can reclaim and what
// costs memory: the history retained since the last compaction, each
// version counted as etcd counts a put (256 bytes of overhead plus key and
// value). As in etcd, a write that would pass the quota raises the NOSPACE
// alarm; while it is active every write that adds data (Put, a Txn with a
// Put, LeaseGrant) fails with "database space exceeded"; compaction (and
// deletes) still work, and disarming the alarm restores writes.

const (
	// etcd's defaults and per-request costs (storage/quota.go).
	defaultQuotaBytes = 2 * 1024 * 1024 * 1024
	kvOverhead        = 256
	leaseOverhead     = 64
	metaAlarms        = "alarms"
)

type alarmSet struct {
	mu     sync.Mutex
	active map[pb.AlarmType]bool
}

// quotaLimit is the configured quota: etcd's 0 means the default, a
// negative value none.
func quotaLimit(cfg int64) int64 {
	if cfg == 0 {
		return defaultQuotaBytes
	}
	return cfg
}

func costPut(r *pb.PutRequest) int { return kvOverhead + len(r.Key) + len(r.Value) }

func costTxnReq(u *pb.RequestOp) int {
	if r := u.GetRequestPut(); r != nil {
		return costPut(r)
	}
	if t := u.GetRequestTxn(); t != nil {
		return costTxn(t)
	}
	return 0
}

// costTxn is etcd's: the costlier branch.
func costTxn(r *pb.TxnRequest) int {
	success, failure := 0, 0
	for _, u := range r.Success {
		success += costTxnReq(u)
	}
	for _, u := range r.Failure {
		failure += costTxnReq(u)
	}
	return max(success, failure)
}

// eventsCost is what one change's events add to the retained history.
func eventsCost(evs []*mvccpb.Event) int64 {
	var n int64
	for _, ev := range evs {
		n += int64(kvOverhead + len(ev.Kv.Key) + len(ev.Kv.Value))
	}
	return n
}

// checkQuota is etcd's quotaAlarmer.check plus its capped applier: a
// request that adds data fails while NOSPACE is active, and one that would
// pass the quota raises it.
func (s *Server) checkQuota(cost int) error {
	if cost == 0 || s.quota < 0 {
		return nil
	}
	if s.alarmActive(pb.AlarmType_NOSPACE) {
		return rpctypes.ErrGRPCNoSpace
	}
	if s.quotaUsed.Load()+int64(cost) >= s.quota {
		if _, err := s.setAlarm(pb.AlarmType_NOSPACE, true); err != nil {
			s.log.Warn("raising the NOSPACE alarm", "err", err)
		}
		return rpctypes.ErrGRPCNoSpace
	}
	return nil
}

// recountQuota measures the retained history: every key's value at the
// compaction revision plus every event after it. The caller holds the
// state lock (read or write); writers, which add to quotaUsed, hold it
// exclusively, so the count and the counter agree.
func (s *Server) recountQuota() {
	if s.quota < 0 {
		return
	}
	c := max(s.st.CompactRev(), 1)
	var used int64
	if resp, err := s.st.Range(&pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, Revision: c}); err == nil {
		for _, kv := range resp.Kvs {
			used += int64(kvOverhead + len(kv.Key) + len(kv.Value))
		}
	}
	if evs, err := s.st.Events(c+1, []byte{0}, []byte{0}); err == nil {
		used += eventsCost(evs)
	}
	s.quotaUsed.Store(used)
}

func (s *Server) alarmActive(t pb.AlarmType) bool {
	s.alarms.mu.Lock()
	defer s.alarms.mu.Unlock()
	return s.alarms.active[t]
}

// activeAlarms lists the active alarms of type t (NONE: all), as etcd's
// AlarmStore.Get.
func (s *Server) activeAlarms(t pb.AlarmType) []*pb.AlarmMember {
	s.alarms.mu.Lock()
	defer s.alarms.mu.Unlock()
	out := []*pb.AlarmMember{}
	for _, at := range []pb.AlarmType{pb.AlarmType_NOSPACE, pb.AlarmType_CORRUPT} {
		if s.alarms.active[at] && (t == pb.AlarmType_NONE || t == at) {
			out = append(out, &pb.AlarmMember{MemberID: s.memberID, Alarm: at})
		}
	}
	return out
}

// setAlarm activates or deactivates an alarm of this member and persists
// the set, as etcd keeps alarms across restarts. It reports whether the
// alarm was active before.
func (s *Server) setAlarm(t pb.AlarmType, on bool) (bool, error) {
	s.alarms.mu.Lock()
	defer s.alarms.mu.Unlock()
	was := s.alarms.active[t]
	if was == on {
		return was, nil
	}
	if on {
		s.alarms.active[t] = true
		s.log.Warn("alarm raised", "alarm", t.String(), "member-id", fmt.Sprintf("%x", s.memberID))
	} else {
		delete(s.alarms.active, t)
		s.log.Info("alarm cleared", "alarm", t.String(), "member-id", fmt.Sprintf("%x", s.memberID))
	}
	var b []byte
	for at := range s.alarms.active {
		b = append(b, byte(at))
	}
	if err := s.store.SetMeta(metaAlarms, b); err != nil {
		return was, fmt.Errorf("edge: persist alarms: %w", err)
	}
	return was, nil
}

// loadAlarms restores the persisted alarms.
func (s *Server) loadAlarms() error {
	s.alarms.active = map[pb.AlarmType]bool{}
	b, err := s.store.Meta(metaAlarms)
	if err != nil {
		return fmt.Errorf("edge: read alarms: %w", err)
	}
	for _, at := range b {
		s.alarms.active[pb.AlarmType(at)] = true
	}
	return nil
}
