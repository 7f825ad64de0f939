package core

import (
	"bytes"
	"math"
	"sort"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// The request semantics below follow etcd v3.7.3 step by step: the gRPC
// checks of server/etcdserver/api/v3rpc/key.go, then the apply code of
// server/etcdserver/txn (range.go, put.go, delete.go, txn.go) over the
// store rules of server/storage/mvcc/kvstore_txn.go. Where etcd has a
// quirk (a sort without an order applied after the limit, keys_only
// answers without leases) it is kept: clients see etcd.

// Range answers a RangeRequest at the current revision. The response
// header has only Revision set.
func (s *State) Range(req *pb.RangeRequest) (*pb.RangeResponse, error) {
	if err := checkRangeRequest(req); err != nil {
		return nil, err
	}
	return s.rangeAt(req, s.rev)
}

// rangeAt is etcd's executeRange over a view whose current revision is
// cur (inside a Txn, the revision its earlier writes made).
func (s *State) rangeAt(r *pb.RangeRequest, cur int64) (*pb.RangeResponse, error) {
	rev := r.GetRevision()
	if rev > cur {
		return nil, rpctypes.ErrGRPCFutureRev
	}
	if rev <= 0 {
		rev = cur
	}
	if rev < s.compactRev {
		return nil, rpctypes.ErrGRPCCompacted
	}
	resp := &pb.RangeResponse{Header: &pb.ResponseHeader{Revision: cur}}
	key, single := r.GetKey(), len(r.GetRangeEnd()) == 0
	end := mkGteRange(r.GetRangeEnd())
	if r.GetCountOnly() {
		s.visit(key, end, single, rev, func(*keyRec, *val) { resp.Count++ })
		resp.Kvs = []*mvccpb.KeyValue{}
		return resp, nil
	}
	limit := rangeLimit(r)
	fastKeysOnly := r.GetKeysOnly() && r.GetSortTarget() != pb.RangeRequest_VALUE
	var kvs []*mvccpb.KeyValue
	s.visit(key, end, single, rev, func(k *keyRec, v *val) {
		resp.Count++
		if limit > 0 && int64(len(kvs)) >= limit {
			return
		}
		c := v.kv(k.key)
		if fastKeysOnly {
			// etcd answers these from its index alone: no value, no lease.
			c.Value, c.Lease = nil, 0
		}
		kvs = append(kvs, c)
	})
	kvs = filterKVs(kvs, r)
	sortKVs(kvs, r)
	if r.GetLimit() > 0 && int64(len(kvs)) > r.GetLimit() {
		kvs = kvs[:r.GetLimit()]
		resp.More = true
	}
	if r.GetKeysOnly() {
		for _, kv := range kvs {
			kv.Value = nil
		}
	}
	if kvs == nil {
		kvs = []*mvccpb.KeyValue{}
	}
	resp.Kvs = kvs
	return resp, nil
}

// visit calls f, in key order, with the value at rev of every key of the
// range that existed then.
func (s *State) visit(key, end []byte, single bool, rev int64, f func(*keyRec, *val)) {
	if single {
		if k := s.keys[string(key)]; k != nil {
			if v := k.at(rev); v != nil {
				f(k, v)
			}
		}
		return
	}
	s.order.ascend(key, end, func(k *keyRec) bool {
		if v := k.at(rev); v != nil {
			f(k, v)
		}
		return true
	})
}

// mkGteRange: a range_end of "\x00" means every key >= key, which the
// index spells as an empty end.
func mkGteRange(end []byte) []byte {
	if len(end) == 1 && end[0] == 0 {
		return nil
	}
	return end
}

// rangeLimit is how many keys etcd reads from its index: all of them when
// it must sort or filter first, else one more than the limit to learn
// `more`. Note etcd tests the request's raw sort order here: a sort target
// with order NONE is sorted (ascending) later, but only among the keys the
// limit let through.
func rangeLimit(r *pb.RangeRequest) int64 {
	limit := r.GetLimit()
	if !isDefaultOrdering(r.GetSortTarget(), r.GetSortOrder()) || hasRevisionFilters(r) {
		limit = 0
	}
	if limit > 0 && limit < math.MaxInt64 {
		limit++
	}
	return limit
}

func isDefaultOrdering(t pb.RangeRequest_SortTarget, o pb.RangeRequest_SortOrder) bool {
	return o == pb.RangeRequest_NONE || (t == pb.RangeRequest_KEY && o == pb.RangeRequest_ASCEND)
}

func hasRevisionFilters(r *pb.RangeRequest) bool {
	return r.GetMinModRevision() != 0 || r.GetMaxModRevision() != 0 ||
		r.GetMinCreateRevision() != 0 || r.GetMaxCreateRevision() != 0
}

func filterKVs(kvs []*mvccpb.KeyValue, r *pb.RangeRequest) []*mvccpb.KeyValue {
	keep := kvs[:0]
	for _, kv := range kvs {
		switch {
		case r.GetMaxModRevision() != 0 && kv.ModRevision > r.GetMaxModRevision():
		case r.GetMinModRevision() != 0 && kv.ModRevision < r.GetMinModRevision():
		case r.GetMaxCreateRevision() != 0 && kv.CreateRevision > r.GetMaxCreateRevision():
		case r.GetMinCreateRevision() != 0 && kv.CreateRevision < r.GetMinCreateRevision():
		default:
			keep = append(keep, kv)
		}
	}
	return keep
}

// sortKVs sorts as etcd's sortRangeResults, with the same sort.Sort (not
// stable: ties come out in the order etcd's produces) and Less functions.
func sortKVs(kvs []*mvccpb.KeyValue, r *pb.RangeRequest) {
	order := r.GetSortOrder()
	if r.GetSortTarget() != pb.RangeRequest_KEY && order == pb.RangeRequest_NONE {
		order = pb.RangeRequest_ASCEND
	}
	if isDefaultOrdering(r.GetSortTarget(), order) {
		return
	}
	var sorter sort.Interface
	switch r.GetSortTarget() {
	case pb.RangeRequest_KEY:
		sorter = kvSort{kvs, func(a, b *mvccpb.KeyValue) bool { return bytes.Compare(a.Key, b.Key) < 0 }}
	case pb.RangeRequest_VERSION:
		sorter = kvSort{kvs, func(a, b *mvccpb.KeyValue) bool { return a.Version-b.Version < 0 }}
	case pb.RangeRequest_CREATE:
		sorter = kvSort{kvs, func(a, b *mvccpb.KeyValue) bool { return a.CreateRevision-b.CreateRevision < 0 }}
	case pb.RangeRequest_MOD:
		sorter = kvSort{kvs, func(a, b *mvccpb.KeyValue) bool { return a.ModRevision-b.ModRevision < 0 }}
	case pb.RangeRequest_VALUE:
		sorter = kvSort{kvs, func(a, b *mvccpb.KeyValue) bool { return bytes.Compare(a.Value, b.Value) < 0 }}
	default:
		return // refused by checkRangeRequest
	}
	switch order {
	case pb.RangeRequest_ASCEND:
		sort.Sort(sorter)
	case pb.RangeRequest_DESCEND:
		sort.Sort(sort.Reverse(sorter))
	}
}

type kvSort struct {
	kvs  []*mvccpb.KeyValue
	less func(a, b *mvccpb.KeyValue) bool
}

func (s kvSort) Len() int           { return len(s.kvs) }
func (s kvSort) Swap(i, j int)      { s.kvs[i], s.kvs[j] = s.kvs[j], s.kvs[i] }
func (s kvSort) Less(i, j int) bool { return s.less(s.kvs[i], s.kvs[j]) }

// Put writes one key: one change with one put op.
func (s *State) Put(now time.Time, req *pb.PutRequest) (*pb.PutResponse, *Applied, error) {
	if err := checkPutRequest(req); err != nil {
		return nil, nil, err
	}
	if err := s.checkPut(req); err != nil {
		return nil, nil, err
	}
	w := s.newWriter()
	resp := s.put(w, req)
	return resp, w.commit(now), nil
}

// checkPut is etcd's checkPut against the state before the change: the
// lease exists; ignore_value and ignore_lease need a previous value.
func (s *State) checkPut(req *pb.PutRequest) error {
	if id := req.GetLease(); id != 0 && s.leases[id] == nil {
		return rpctypes.ErrGRPCLeaseNotFound
	}
	if req.GetIgnoreValue() || req.GetIgnoreLease() {
		if k := s.keys[string(req.GetKey())]; k == nil || k.live() == nil {
			return rpctypes.ErrGRPCKeyNotFound
		}
	}
	return nil
}

// put is etcd's put inside a change: the previous value is read at the
// change's current view (a Txn's earlier writes included).
func (s *State) put(w *writer, req *pb.PutRequest) *pb.PutResponse {
	resp := &pb.PutResponse{Header: &pb.ResponseHeader{}}
	var prev *mvccpb.KeyValue
	if req.GetIgnoreValue() || req.GetIgnoreLease() || req.GetPrevKv() {
		if k := s.keys[string(req.GetKey())]; k != nil {
			if v := k.at(w.rev()); v != nil {
				prev = v.kv(k.key)
			}
		}
	}
	value, lease := req.GetValue(), req.GetLease()
	if prev != nil {
		// etcd would dereference a missing previous value here and crash;
		// checkPut makes that unreachable but for a Txn deleting the key
		// first, where keeping the request's own fields is the sane choice.
		if req.GetIgnoreValue() {
			value = prev.Value
		}
		if req.GetIgnoreLease() {
			lease = prev.Lease
		}
		if req.GetPrevKv() {
			resp.PrevKv = prev
		}
	}
	if s.vm.IsJSON(req.GetKey()) {
		w.jsonLocalPut(req.GetKey(), value, lease)
	} else {
		w.put(req.GetKey(), value, lease)
	}
	resp.Header.Revision = w.begin + 1
	return resp
}

// DeleteRange deletes the keys of a range that exist: one change with a
// delete op per key (none when nothing matched: a change without a
// revision, as etcd applies it without bumping its revision).
func (s *State) DeleteRange(now time.Time, req *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, *Applied, error) {
	if err := checkDeleteRequest(req); err != nil {
		return nil, nil, err
	}
	w := s.newWriter()
	resp := s.deleteRange(w, req)
	return resp, w.commit(now), nil
}

func (s *State) deleteRange(w *writer, req *pb.DeleteRangeRequest) *pb.DeleteRangeResponse {
	resp := &pb.DeleteRangeResponse{Header: &pb.ResponseHeader{}}
	key, single := req.GetKey(), len(req.GetRangeEnd()) == 0
	end := mkGteRange(req.GetRangeEnd())
	if req.GetPrevKv() {
		resp.PrevKvs = []*mvccpb.KeyValue{}
		s.visit(key, end, single, w.rev(), func(k *keyRec, v *val) { resp.PrevKvs = append(resp.PrevKvs, v.kv(k.key)) })
	}
	touched := len(w.evs) > 0
	resp.Deleted = w.deleteRange(key, end, single)
	if resp.Deleted != 0 || touched {
		resp.Header.Revision = w.begin + 1
	} else {
		resp.Header.Revision = w.begin
	}
	return resp
}

// Txn evaluates a transaction as etcd: the compares (nested ones too)
// against the state before it, the taken branch's checks, then its ops in
// order, each seeing the earlier ones. A Txn whose branches only read is
// not a change (Applied nil); any other Txn is one change with the ops of
// the branch taken (maybe none: a change without a revision).
func (s *State) Txn(now time.Time, req *pb.TxnRequest) (*pb.TxnResponse, *Applied, error) {
	if err := CheckTxn(req, s.maxTxnOps); err != nil {
		return nil, nil, err
	}
	plan := s.planTxn(req)
	if err := s.checkPlan(plan); err != nil {
		return nil, nil, err
	}
	w := s.newWriter()
	resp := s.execTxn(w, plan)
	resp.Header.Revision = w.rev()
	if isTxnReadonly(req) {
		return resp, nil, nil
	}
	return resp, w.commit(now), nil
}

// txnPlan is one (nested) Txn's decided branch: etcd's txnPath as a tree.
type txnPlan struct {
	ok   bool
	reqs []*pb.RequestOp
	subs []*txnPlan // per req: the nested Txn's plan, nil for other ops
}

func (s *State) planTxn(rt *pb.TxnRequest) *txnPlan {
	p := &txnPlan{ok: s.applyCompares(rt.GetCompare())}
	p.reqs = rt.GetSuccess()
	if !p.ok {
		p.reqs = rt.GetFailure()
	}
	p.subs = make([]*txnPlan, len(p.reqs))
	for i, op := range p.reqs {
		// A nested Txn that is nil (only possible in-process: on the wire
		// it is an empty message) plans as the empty Txn.
		if tv, ok := op.GetRequest().(*pb.RequestOp_RequestTxn); ok {
			p.subs[i] = s.planTxn(tv.RequestTxn)
		}
	}
	return p
}

func (s *State) checkPlan(p *txnPlan) error {
	for i, op := range p.reqs {
		var err error
		switch tv := op.GetRequest().(type) {
		case *pb.RequestOp_RequestRange:
			r := tv.RequestRange
			switch {
			case r.GetRevision() == 0:
			case r.GetRevision() > s.rev:
				err = rpctypes.ErrGRPCFutureRev
			case r.GetRevision() < s.compactRev:
				err = rpctypes.ErrGRPCCompacted
			}
		case *pb.RequestOp_RequestPut:
			err = s.checkPut(tv.RequestPut)
		case *pb.RequestOp_RequestTxn:
			if p.subs[i] != nil {
				err = s.checkPlan(p.subs[i])
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (s *State) execTxn(w *writer, p *txnPlan) *pb.TxnResponse {
	resp := &pb.TxnResponse{Header: &pb.ResponseHeader{}, Succeeded: p.ok, Responses: make([]*pb.ResponseOp, len(p.reqs))}
	for i, op := range p.reqs {
		switch tv := op.GetRequest().(type) {
		case *pb.RequestOp_RequestRange:
			rr, err := s.rangeAt(tv.RequestRange, w.rev())
			if err != nil {
				// checkPlan refused every range that could fail.
				panic("core: txn range failed after its check: " + err.Error())
			}
			resp.Responses[i] = &pb.ResponseOp{Response: &pb.ResponseOp_ResponseRange{ResponseRange: rr}}
		case *pb.RequestOp_RequestPut:
			resp.Responses[i] = &pb.ResponseOp{Response: &pb.ResponseOp_ResponsePut{ResponsePut: s.put(w, tv.RequestPut)}}
		case *pb.RequestOp_RequestDeleteRange:
			resp.Responses[i] = &pb.ResponseOp{Response: &pb.ResponseOp_ResponseDeleteRange{ResponseDeleteRange: s.deleteRange(w, tv.RequestDeleteRange)}}
		case *pb.RequestOp_RequestTxn:
			// A nested Txn's header stays empty, as etcd leaves it.
			resp.Responses[i] = &pb.ResponseOp{Response: &pb.ResponseOp_ResponseTxn{ResponseTxn: s.execTxn(w, p.subs[i])}}
		default:
			resp.Responses[i] = nil
		}
	}
	return resp
}

func (s *State) applyCompares(cmps []*pb.Compare) bool {
	for _, c := range cmps {
		if !s.applyCompare(c) {
			return false
		}
	}
	return true
}

// applyCompare is etcd's: a compare over a range holds when it holds for
// every key; with no key, a VALUE compare fails and the others compare
// against the zero KeyValue (version, revisions and lease 0).
func (s *State) applyCompare(c *pb.Compare) bool {
	var kvs []*mvccpb.KeyValue
	s.visit(c.GetKey(), mkGteRange(c.GetRangeEnd()), len(c.GetRangeEnd()) == 0, s.rev, func(k *keyRec, v *val) { kvs = append(kvs, v.kv(k.key)) })
	if len(kvs) == 0 {
		if c.GetTarget() == pb.Compare_VALUE {
			return false
		}
		return compareKV(c, &mvccpb.KeyValue{})
	}
	for _, kv := range kvs {
		if !compareKV(c, kv) {
			return false
		}
	}
	return true
}

func compareKV(c *pb.Compare, kv *mvccpb.KeyValue) bool {
	var result int
	switch c.GetTarget() {
	case pb.Compare_VALUE:
		var v []byte
		if tv, _ := c.GetTargetUnion().(*pb.Compare_Value); tv != nil {
			v = tv.Value
		}
		result = bytes.Compare(kv.Value, v)
	case pb.Compare_CREATE:
		var r int64
		if tv, _ := c.GetTargetUnion().(*pb.Compare_CreateRevision); tv != nil {
			r = tv.CreateRevision
		}
		result = compareInt64(kv.CreateRevision, r)
	case pb.Compare_MOD:
		var r int64
		if tv, _ := c.GetTargetUnion().(*pb.Compare_ModRevision); tv != nil {
			r = tv.ModRevision
		}
		result = compareInt64(kv.ModRevision, r)
	case pb.Compare_VERSION:
		var r int64
		if tv, _ := c.GetTargetUnion().(*pb.Compare_Version); tv != nil {
			r = tv.Version
		}
		result = compareInt64(kv.Version, r)
	case pb.Compare_LEASE:
		var r int64
		if tv, _ := c.GetTargetUnion().(*pb.Compare_Lease); tv != nil {
			r = tv.Lease
		}
		result = compareInt64(kv.Lease, r)
	}
	switch c.GetResult() {
	case pb.Compare_EQUAL:
		return result == 0
	case pb.Compare_NOT_EQUAL:
		return result != 0
	case pb.Compare_GREATER:
		return result > 0
	case pb.Compare_LESS:
		return result < 0
	}
	return true
}

func compareInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// isTxnReadonly is etcd's IsTxnReadonly: every op of both branches is a
// Range (a nested Txn counts as a write).
func isTxnReadonly(r *pb.TxnRequest) bool {
	for _, u := range r.GetSuccess() {
		if u.GetRequestRange() == nil {
			return false
		}
	}
	for _, u := range r.GetFailure() {
		if u.GetRequestRange() == nil {
			return false
		}
	}
	return true
}
