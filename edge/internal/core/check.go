package core

import (
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// The request checks etcd's gRPC layer makes before a request reaches the
// apply loop (server/etcdserver/api/v3rpc/key.go), with its errors. The
// State's operations make them; the server makes them too, through the
// exported Check* functions, before its own size, quota and failure checks,
// so an invalid request gets etcd's error in etcd's order.

// CheckRange is etcd's check of a RangeRequest.
func CheckRange(r *pb.RangeRequest) error { return checkRangeRequest(r) }

// CheckPut is etcd's check of a PutRequest.
func CheckPut(r *pb.PutRequest) error { return checkPutRequest(r) }

// CheckDeleteRange is etcd's check of a DeleteRangeRequest.
func CheckDeleteRange(r *pb.DeleteRangeRequest) error { return checkDeleteRequest(r) }

// CheckTxn is etcd's check of a TxnRequest: the request itself (op count,
// empty keys, every nested op), then the forbidden put/delete overlaps of
// each branch (after the request, to avoid quadratic work on invalid
// input, as etcd does).
func CheckTxn(r *pb.TxnRequest, maxTxnOps int) error {
	if err := checkTxnRequest(r, maxTxnOps); err != nil {
		return err
	}
	if _, _, err := checkIntervals(r.GetSuccess()); err != nil {
		return err
	}
	_, _, err := checkIntervals(r.GetFailure())
	return err
}

func checkRangeRequest(r *pb.RangeRequest) error {
	if len(r.GetKey()) == 0 {
		return rpctypes.ErrGRPCEmptyKey
	}
	if _, ok := pb.RangeRequest_SortOrder_name[int32(r.GetSortOrder())]; !ok {
		return rpctypes.ErrGRPCInvalidSortOption
	}
	if _, ok := pb.RangeRequest_SortTarget_name[int32(r.GetSortTarget())]; !ok {
		return rpctypes.ErrGRPCInvalidSortOption
	}
	return nil
}

func checkPutRequest(r *pb.PutRequest) error {
	if len(r.GetKey()) == 0 {
		return rpctypes.ErrGRPCEmptyKey
	}
	if r.GetIgnoreValue() && len(r.GetValue()) != 0 {
		return rpctypes.ErrGRPCValueProvided
	}
	if r.GetIgnoreLease() && r.GetLease() != 0 {
		return rpctypes.ErrGRPCLeaseProvided
	}
	return nil
}

func checkDeleteRequest(r *pb.DeleteRangeRequest) error {
	if len(r.GetKey()) == 0 {
		return rpctypes.ErrGRPCEmptyKey
	}
	return nil
}

func checkTxnRequest(r *pb.TxnRequest, maxTxnOps int) error {
	opc := len(r.GetCompare())
	if opc < len(r.GetSuccess()) {
		opc = len(r.GetSuccess())
	}
	if opc < len(r.GetFailure()) {
		opc = len(r.GetFailure())
	}
	if opc > maxTxnOps {
		return rpctypes.ErrGRPCTooManyOps
	}
	for _, c := range r.GetCompare() {
		if len(c.GetKey()) == 0 {
			return rpctypes.ErrGRPCEmptyKey
		}
	}
	for _, u := range r.GetSuccess() {
		if err := checkRequestOp(u, maxTxnOps-opc); err != nil {
			return err
		}
	}
	for _, u := range r.GetFailure() {
		if err := checkRequestOp(u, maxTxnOps-opc); err != nil {
			return err
		}
	}
	return nil
}

func checkRequestOp(u *pb.RequestOp, maxTxnOps int) error {
	switch uv := u.GetRequest().(type) {
	case *pb.RequestOp_RequestRange:
		return checkRangeRequest(uv.RequestRange)
	case *pb.RequestOp_RequestPut:
		return checkPutRequest(uv.RequestPut)
	case *pb.RequestOp_RequestDeleteRange:
		return checkDeleteRequest(uv.RequestDeleteRange)
	case *pb.RequestOp_RequestTxn:
		return checkTxnRequest(uv.RequestTxn, maxTxnOps)
	default:
		return rpctypes.ErrGRPCKeyNotFound // etcd's answer to an empty op
	}
}

// interval is a delete's key interval in etcd's "affine" string order,
// where an empty end is +infinity. etcd takes a range_end literally here
// ("\x00" is not "all keys"), so neither do we.
type interval struct{ begin, end string }

func pointInterval(k string) interval { return interval{k, k + "\x00"} }

// affineLess is a < b with "" as +infinity.
func affineLess(a, b string) bool {
	switch {
	case len(a) == 0:
		return false
	case len(b) == 0:
		return true
	}
	return a < b
}

func (iv interval) overlaps(o interval) bool {
	return affineLess(iv.begin, o.end) && affineLess(o.begin, iv.end)
}

func intersects(dels []interval, k string) bool {
	p := pointInterval(k)
	for _, d := range dels {
		if d.overlaps(p) {
			return true
		}
	}
	return false
}

// checkIntervals is etcd's: a key may be put once per branch path, and not
// put where a delete of the same level or above covers it.
func checkIntervals(reqs []*pb.RequestOp) (map[string]struct{}, []interval, error) {
	var dels []interval
	for _, req := range reqs {
		d := req.GetRequestDeleteRange()
		if d == nil {
			continue
		}
		if len(d.GetRangeEnd()) != 0 {
			dels = append(dels, interval{string(d.GetKey()), string(d.GetRangeEnd())})
		} else {
			dels = append(dels, pointInterval(string(d.GetKey())))
		}
	}
	puts := make(map[string]struct{})
	for _, req := range reqs {
		t := req.GetRequestTxn()
		if t == nil {
			continue
		}
		putsThen, delsThen, err := checkIntervals(t.GetSuccess())
		if err != nil {
			return nil, dels, err
		}
		putsElse, delsElse, err := checkIntervals(t.GetFailure())
		if err != nil {
			return nil, dels, err
		}
		for k := range putsThen {
			if _, ok := puts[k]; ok {
				return nil, dels, rpctypes.ErrGRPCDuplicateKey
			}
			if intersects(dels, k) {
				return nil, dels, rpctypes.ErrGRPCDuplicateKey
			}
			puts[k] = struct{}{}
		}
		for k := range putsElse {
			if _, ok := puts[k]; ok {
				if _, isSafe := putsThen[k]; !isSafe {
					return nil, dels, rpctypes.ErrGRPCDuplicateKey
				}
			}
			if intersects(dels, k) {
				return nil, dels, rpctypes.ErrGRPCDuplicateKey
			}
			puts[k] = struct{}{}
		}
		dels = append(dels, delsThen...)
		dels = append(dels, delsElse...)
	}
	for _, req := range reqs {
		p := req.GetRequestPut()
		if p == nil {
			continue
		}
		k := string(p.GetKey())
		if _, ok := puts[k]; ok {
			return nil, dels, rpctypes.ErrGRPCDuplicateKey
		}
		if intersects(dels, k) {
			return nil, dels, rpctypes.ErrGRPCDuplicateKey
		}
		puts[k] = struct{}{}
	}
	return puts, dels, nil
}
