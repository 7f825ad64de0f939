// Package difftest is a differential test of an etcd-compatible server
// against real etcd: one seeded random sequence of requests is sent to two
// endpoints, A (the reference, real etcd) and B (the server under test), one
// request at a time to both, and their responses and errors must be equal
// after normalisation. It is how aether edge is held to etcd's semantics
// (issue 15): every Range option, Put and DeleteRange with prev_kv and
// ranges, Txn with every compare target and result on present and missing
// keys and nested txns, compactions (and the compacted and future-revision
// errors), leases (grant, revoke, keepalive, time-to-live, list), HashKV,
// watches opened at past revisions, and bad input (empty keys, too many
// txn ops, oversized requests, enum values the protos do not name; etcd
// refuses the first three and accepts some of the last).
//
// Normalisation (what is allowed to differ, and why):
//
//   - Every ResponseHeader's cluster_id, member_id and raft_term: identities
//     and raft state of the two servers. Revisions are compared: the two
//     must number the same sequence of writes the same way.
//   - HashKV's hash: etcd hashes its bbolt encoding, which another store
//     need not share. Its revisions are compared.
//   - LeaseTimeToLive's remaining TTL within one second: the two servers
//     are asked a moment apart.
//   - The order of LeaseLeases' list and of LeaseTimeToLive's keys (etcd's
//     come from Go maps).
//   - How a watch's events are split into WatchResponses (etcd groups the
//     events of catch-up by timing): the events are compared as one list,
//     with the created response and the final progress or cancel response.
//
// The generator chooses its next request from the state A reported (the
// current revision, the compacted revision, the live leases), so the
// sequence depends on the seed and on A only. Lease IDs are chosen by the
// generator (etcd would pick one from its member id and clock), and lease
// TTLs are long enough that no lease expires during a run: expiry is timed
// by each server's clock and is not a request. Watches start at past
// revisions only, so a progress request proves the watch caught up (etcd
// answers one only when its watchers are synced).
package difftest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Config is one differential run.
type Config struct {
	// Seed makes the sequence; a mismatch names it so the run can be
	// repeated.
	Seed uint64
	// Ops is the number of requests sent to each side.
	Ops int
	// A is the reference (real etcd), B the server under test. Both are
	// connections to one member, e.g. clientv3.Client.ActiveConnection().
	A, B grpc.ClientConnInterface
	// OpTimeout bounds one request to one side (default 10s).
	OpTimeout time.Duration
	// Trace, if set, is told each request before it is sent (to find the
	// request that took a server down).
	Trace func(step int, kind, request string)
}

// Mismatch is the first request whose responses differed.
type Mismatch struct {
	Seed    uint64
	Step    int // 0-based index of the request in the sequence
	Kind    string
	Request string
	A, B    string // the normalised responses (or errors)
}

func (m *Mismatch) Error() string {
	return fmt.Sprintf("difftest: seed %d, request %d (%s): responses differ\nrequest:\n%s\nA (reference):\n%s\nB (under test):\n%s",
		m.Seed, m.Step, m.Kind, indent(m.Request), indent(m.A), indent(m.B))
}

func indent(s string) string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return "  (empty)"
	}
	return "  " + strings.ReplaceAll(s, "\n", "\n  ")
}

// Stats counts what a run sent, by kind, and ("<kind> (refused)") how many
// of each A answered with an error.
type Stats map[string]int

// Run sends cfg.Ops requests to both sides and returns the first *Mismatch,
// or an error that stopped the run (a side that could not be reached is a
// mismatch if the other side answered).
func Run(ctx context.Context, cfg Config) (Stats, error) {
	if cfg.OpTimeout <= 0 {
		cfg.OpTimeout = 10 * time.Second
	}
	g := &generator{rnd: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))}
	a, b := newSide(cfg.A), newSide(cfg.B)
	stats := Stats{}
	for step := 0; step < cfg.Ops; step++ {
		if err := ctx.Err(); err != nil {
			return stats, fmt.Errorf("difftest: seed %d: stopped at request %d: %w", cfg.Seed, step, err)
		}
		o := g.next()
		stats[o.kind]++
		if cfg.Trace != nil {
			cfg.Trace(step, o.kind, o.String())
		}
		var ra, rb result
		var wg sync.WaitGroup
		wg.Add(2)
		// The two sides are independent servers: asking both at once
		// halves the run's time and changes nothing either sees.
		go func() { defer wg.Done(); ra = a.do(ctx, cfg.OpTimeout, o) }()
		go func() { defer wg.Done(); rb = b.do(ctx, cfg.OpTimeout, o) }()
		wg.Wait()
		tolerateTTL(ra, rb)
		if !ra.equal(rb) {
			return stats, &Mismatch{Seed: cfg.Seed, Step: step, Kind: o.kind, Request: o.String(), A: ra.String(), B: rb.String()}
		}
		if ra.err != "" {
			stats[o.kind+" (refused)"]++
		}
		g.observe(o, ra)
	}
	return stats, nil
}

// op is one request of the sequence.
type op struct {
	kind string
	req  proto.Message // the request, as sent (for keepalive: LeaseKeepAliveRequest)
}

func (o op) String() string {
	s := prototext.Format(o.req)
	if len(s) > 4000 { // the oversized put
		s = fmt.Sprintf("%s... (%d characters in all)", s[:2000], len(s))
	}
	return s
}

// result is a side's normalised answer to one op: its messages, or the
// gRPC status of its error.
type result struct {
	msgs []proto.Message
	err  string
}

func (r result) equal(o result) bool {
	if r.err != o.err || len(r.msgs) != len(o.msgs) {
		return false
	}
	for i := range r.msgs {
		if !proto.Equal(r.msgs[i], o.msgs[i]) {
			return false
		}
	}
	return true
}

func (r result) String() string {
	var b strings.Builder
	for i, m := range r.msgs {
		if len(r.msgs) > 1 {
			fmt.Fprintf(&b, "[%d] %T\n", i, m)
		}
		b.WriteString(prototext.Format(m))
	}
	if r.err != "" {
		fmt.Fprintf(&b, "error: %s\n", r.err)
	}
	return b.String()
}

// tolerateTTL makes B's remaining lease TTL A's when they are at most a
// second apart: the two servers are asked a moment apart.
func tolerateTTL(a, b result) {
	if len(a.msgs) != 1 || len(b.msgs) != 1 {
		return
	}
	ta, ok1 := a.msgs[0].(*pb.LeaseTimeToLiveResponse)
	tb, ok2 := b.msgs[0].(*pb.LeaseTimeToLiveResponse)
	if ok1 && ok2 && ta.TTL > 0 && tb.TTL > 0 && ta.TTL-tb.TTL <= 1 && tb.TTL-ta.TTL <= 1 {
		tb.TTL = ta.TTL
	}
}

func errResult(err error) result {
	s := status.Convert(err)
	return result{err: fmt.Sprintf("code=%s desc=%q", s.Code(), s.Message())}
}

// side is one endpoint's clients.
type side struct {
	kv    pb.KVClient
	lease pb.LeaseClient
	watch pb.WatchClient
	maint pb.MaintenanceClient
}

func newSide(cc grpc.ClientConnInterface) *side {
	return &side{kv: pb.NewKVClient(cc), lease: pb.NewLeaseClient(cc), watch: pb.NewWatchClient(cc), maint: pb.NewMaintenanceClient(cc)}
}

func (s *side) do(ctx context.Context, timeout time.Duration, o op) result {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var (
		resp proto.Message
		err  error
	)
	switch r := o.req.(type) {
	case *pb.RangeRequest:
		resp, err = s.kv.Range(ctx, r)
	case *pb.PutRequest:
		resp, err = s.kv.Put(ctx, r)
	case *pb.DeleteRangeRequest:
		resp, err = s.kv.DeleteRange(ctx, r)
	case *pb.TxnRequest:
		resp, err = s.kv.Txn(ctx, r)
	case *pb.CompactionRequest:
		resp, err = s.kv.Compact(ctx, r)
	case *pb.LeaseGrantRequest:
		resp, err = s.lease.LeaseGrant(ctx, r)
	case *pb.LeaseRevokeRequest:
		resp, err = s.lease.LeaseRevoke(ctx, r)
	case *pb.LeaseTimeToLiveRequest:
		resp, err = s.lease.LeaseTimeToLive(ctx, r)
	case *pb.LeaseLeasesRequest:
		var lr *pb.LeaseLeasesResponse
		lr, err = s.lease.LeaseLeases(ctx, r)
		if err == nil {
			slices.SortFunc(lr.Leases, func(x, y *pb.LeaseStatus) int { return cmpInt(x.ID, y.ID) })
			resp = lr
		}
	case *pb.HashKVRequest:
		var hr *pb.HashKVResponse
		hr, err = s.maint.HashKV(ctx, r)
		// etcd compacts in the background after answering Compact, and
		// stores the hash at the compaction revision (with the compaction
		// before it as CompactRevision) only when done; asked for that
		// revision before then, it hashes afresh and reports the new
		// compaction itself. A kept hash never reports its own revision as
		// compacted, so that answer means "not done yet": ask again until
		// the compaction is (the edge store compacts before it answers).
		for deadline := time.Now().Add(10 * time.Second); err == nil && r.Revision != 0 &&
			hr.CompactRevision == hr.HashRevision && hr.HashRevision == r.Revision && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
			hr, err = s.maint.HashKV(ctx, r)
		}
		if err == nil {
			hr.Hash = 0
			resp = hr
		}
	case *pb.LeaseKeepAliveRequest:
		resp, err = s.keepAlive(ctx, r)
	case *pb.WatchCreateRequest:
		return s.watchOnce(ctx, r)
	default:
		panic(fmt.Sprintf("difftest: no request kind %T", o.req))
	}
	if err != nil {
		return errResult(err)
	}
	normalize(resp)
	return result{msgs: []proto.Message{resp}}
}

func cmpInt(x, y int64) int {
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

// keepAlive sends one keepalive on a stream of its own.
func (s *side) keepAlive(ctx context.Context, r *pb.LeaseKeepAliveRequest) (proto.Message, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := s.lease.LeaseKeepAlive(ctx)
	if err != nil {
		return nil, err
	}
	if err := st.Send(r); err != nil {
		return nil, err
	}
	resp, err := st.Recv()
	if err != nil {
		return nil, err
	}
	_ = st.CloseSend()
	return resp, nil
}

// watchOnce opens one watch on a stream of its own, reads until the watch is
// canceled or a progress response shows it caught up with the store, and
// closes the stream. Its result: the created response, every event as one
// list, and the final response (without events).
func (s *side) watchOnce(ctx context.Context, r *pb.WatchCreateRequest) result {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := s.watch.Watch(ctx)
	if err != nil {
		return errResult(err)
	}
	if err := st.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: r}}); err != nil {
		return errResult(err)
	}
	// One reader goroutine, joined before return (cancel ends its Recv).
	msgs := make(chan *pb.WatchResponse)
	recvErr := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			m, err := st.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case msgs <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	defer wg.Wait()
	defer cancel()

	var created, final *pb.WatchResponse
	var events []*mvccpb.Event
	// etcd (v3.7) answers a progress request only when every watcher of
	// the stream is synced, and ignores it otherwise, so it is repeated
	// until answered; the answer comes after every event up to its
	// revision, on the same stream.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for final == nil {
		select {
		case m := <-msgs:
			switch {
			case m.Created:
				if created != nil {
					return result{err: "second created response on one watch"}
				}
				created = proto.Clone(m).(*pb.WatchResponse)
				created.Events = nil
				if m.Canceled {
					final = created
				}
			case m.Canceled:
				final = m
			case len(m.Events) == 0 && m.WatchId == clientv3.InvalidWatchID:
				final = m
			default:
				events = append(events, m.Events...)
			}
		case err := <-recvErr:
			return errResult(err)
		case <-tick.C:
			if created == nil {
				continue
			}
			if err := st.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_ProgressRequest{ProgressRequest: &pb.WatchProgressRequest{}}}); err != nil {
				return errResult(err)
			}
		case <-ctx.Done():
			return result{err: fmt.Sprintf("watch did not catch up: %v (created %v, %d events so far)", ctx.Err(), created != nil, len(events))}
		}
	}
	if created == nil {
		created = &pb.WatchResponse{}
	}
	final = proto.Clone(final).(*pb.WatchResponse)
	final.Events = nil
	all := &pb.WatchResponse{Events: events}
	for _, m := range []proto.Message{created, all, final} {
		normalize(m)
	}
	return result{msgs: []proto.Message{created, all, final}}
}

// normalize clears what may differ between two servers in every
// ResponseHeader in m, and sorts LeaseTimeToLive's keys.
func normalize(m proto.Message) {
	if ttl, ok := m.(*pb.LeaseTimeToLiveResponse); ok {
		// etcd lists a lease's keys from a Go map.
		slices.SortFunc(ttl.Keys, bytes.Compare)
	}
	walk(m.ProtoReflect())
}

var headerName = (&pb.ResponseHeader{}).ProtoReflect().Descriptor().FullName()

func walk(m protoreflect.Message) {
	if m.Descriptor().FullName() == headerName {
		h := m.Interface().(*pb.ResponseHeader)
		h.ClusterId, h.MemberId, h.RaftTerm = 0, 0, 0
		return
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			l := v.List()
			for i := 0; i < l.Len(); i++ {
				walk(l.Get(i).Message())
			}
		case fd.IsMap():
		case fd.Message() != nil:
			walk(v.Message())
		}
		return true
	})
}

// generator makes the sequence.
type generator struct {
	rnd        *rand.Rand
	rev        int64 // A's current revision, from its last header
	compactRev int64 // A's last successful compaction (0: none)
	leases     []int64
}

// keys is the key space: small, so ranges, compares and overwrites meet,
// with prefixes ("a", "a/", "b/") and neighbours ("ab" after "a/2").
var keys = []string{"a", "a/1", "a/2", "ab", "b", "b/x", "b/y", "c", "d", "e", "f", "zz"}

var values = []string{"", "v", "value-1", "value-2", "x", "0123456789abcdef"}

func (g *generator) key() []byte { return []byte(keys[g.rnd.IntN(len(keys))]) }

// keyRange is a key and range end: one key, a prefix, [key, other), from
// key, or everything.
func (g *generator) keyRange() (key, end []byte) {
	k := g.key()
	switch g.rnd.IntN(10) {
	case 0, 1, 2, 3:
		return k, nil
	case 4, 5:
		return k, []byte(clientv3.GetPrefixRangeEnd(string(k)))
	case 6, 7:
		// Either order: an end at or before the key is an empty range.
		return k, g.key()
	case 8:
		return k, []byte{0}
	default:
		return []byte{0}, []byte{0}
	}
}

// pastRev is a revision around the window [compactRev, rev]: mostly
// inside, sometimes compacted or in the future.
func (g *generator) pastRev() int64 {
	lo := max(g.compactRev-1, 1)
	hi := g.rev + 2
	return lo + g.rnd.Int64N(hi-lo+1)
}

func (g *generator) chance(percent int) bool { return g.rnd.IntN(100) < percent }

func (g *generator) liveLease() int64 {
	if len(g.leases) == 0 {
		return 0
	}
	return g.leases[g.rnd.IntN(len(g.leases))]
}

// someLease is a live lease mostly, else one that does not exist.
func (g *generator) someLease() int64 {
	if l := g.liveLease(); l != 0 && g.chance(85) {
		return l
	}
	return 1 + g.rnd.Int64N(1<<40)
}

func (g *generator) rangeReq() *pb.RangeRequest {
	k, e := g.keyRange()
	r := &pb.RangeRequest{Key: k, RangeEnd: e}
	if g.chance(30) {
		r.Revision = g.pastRev()
	}
	if g.chance(30) {
		r.Limit = 1 + g.rnd.Int64N(4)
	}
	if g.chance(35) {
		r.SortOrder = pb.RangeRequest_SortOrder(g.rnd.IntN(3))
		r.SortTarget = pb.RangeRequest_SortTarget(g.rnd.IntN(5))
	}
	r.Serializable = g.chance(20)
	r.KeysOnly = g.chance(15)
	r.CountOnly = g.chance(10)
	if g.chance(10) {
		r.MinModRevision = g.rnd.Int64N(g.rev + 2)
	}
	if g.chance(10) {
		r.MaxModRevision = g.rnd.Int64N(g.rev + 2)
	}
	if g.chance(10) {
		r.MinCreateRevision = g.rnd.Int64N(g.rev + 2)
	}
	if g.chance(10) {
		r.MaxCreateRevision = g.rnd.Int64N(g.rev + 2)
	}
	return r
}

func (g *generator) putReq(inTxn bool) *pb.PutRequest {
	r := &pb.PutRequest{Key: g.key(), Value: []byte(values[g.rnd.IntN(len(values))]), PrevKv: g.chance(40)}
	switch {
	case g.chance(20):
		r.Lease = g.liveLease()
	case !inTxn && g.chance(4):
		r.Lease = g.someLease()
	}
	// In a txn too: no txn here puts a key after deleting it (see
	// requestOps), on which real etcd v3.7.3 would panic for these two
	// (txn/put.go, index out of range: it checks them against the state
	// before the txn).
	if g.chance(8) {
		r.IgnoreValue = true
		if g.chance(70) {
			r.Value = nil
		}
	}
	if g.chance(8) {
		r.IgnoreLease = true
		if g.chance(70) {
			r.Lease = 0
		}
	}
	return r
}

func (g *generator) deleteReq() *pb.DeleteRangeRequest {
	k, e := g.keyRange()
	return &pb.DeleteRangeRequest{Key: k, RangeEnd: e, PrevKv: g.chance(50)}
}

func (g *generator) compare() *pb.Compare {
	c := &pb.Compare{Key: g.key(), Result: pb.Compare_CompareResult(g.rnd.IntN(4)), Target: pb.Compare_CompareTarget(g.rnd.IntN(5))}
	switch c.Target {
	case pb.Compare_VERSION:
		c.TargetUnion = &pb.Compare_Version{Version: g.rnd.Int64N(4)}
	case pb.Compare_CREATE:
		c.TargetUnion = &pb.Compare_CreateRevision{CreateRevision: g.rnd.Int64N(g.rev + 2)}
	case pb.Compare_MOD:
		c.TargetUnion = &pb.Compare_ModRevision{ModRevision: g.rnd.Int64N(g.rev + 2)}
	case pb.Compare_VALUE:
		c.TargetUnion = &pb.Compare_Value{Value: []byte(values[g.rnd.IntN(len(values))])}
	case pb.Compare_LEASE:
		l := int64(0)
		if g.chance(60) {
			l = g.liveLease()
		}
		c.TargetUnion = &pb.Compare_Lease{Lease: l}
	}
	if g.chance(15) {
		_, c.RangeEnd = g.keyRange()
		if c.RangeEnd == nil {
			c.RangeEnd = []byte(clientv3.GetPrefixRangeEnd(string(c.Key)))
		}
	}
	return c
}

// requestOps is one branch of a txn at depth (0: the request's own).
//
// A branch that deletes writes nothing else (no put, no nested txn), and a
// nested txn deletes nothing: real etcd v3.7.3 accepts a txn that deletes a
// key and puts it again in the same revision (after a from-key or
// whole-space delete, etcd-io/etcd#22445, or in a nested txn), and a
// compaction at that revision then drops the put from its backend while its
// index keeps it; the next read of the key kills etcd (lg.Fatal "range
// failed to find revision pair", etcd-io/etcd#22376). So a revision never
// both deletes and puts one key here.
func (g *generator) requestOps(depth int) []*pb.RequestOp {
	n := g.rnd.IntN(4)
	ops := make([]*pb.RequestOp, 0, n)
	deletes := false
	for range n {
		switch x := g.rnd.IntN(10); {
		case x < 4:
			ops = append(ops, &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: g.putReq(true)}})
		case x < 7 || x < 9 && depth >= 1 || depth >= 2:
			ops = append(ops, &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: g.rangeReq()}})
		case x < 9:
			deletes = true
			ops = append(ops, &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: g.deleteReq()}})
		default:
			ops = append(ops, &pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: g.txnReq(depth + 1)}})
		}
	}
	if deletes {
		ops = slices.DeleteFunc(ops, func(o *pb.RequestOp) bool { return o.GetRequestPut() != nil || o.GetRequestTxn() != nil })
	}
	return ops
}

func (g *generator) txnReq(depth int) *pb.TxnRequest {
	r := &pb.TxnRequest{}
	for range g.rnd.IntN(4) {
		r.Compare = append(r.Compare, g.compare())
	}
	r.Success = g.requestOps(depth)
	r.Failure = g.requestOps(depth)
	return r
}

func (g *generator) next() op {
	switch x := g.rnd.IntN(100); {
	case x < 30:
		return op{"put", g.putReq(false)}
	case x < 52:
		return op{"range", g.rangeReq()}
	case x < 60:
		return op{"delete", g.deleteReq()}
	case x < 74:
		return op{"txn", g.txnReq(0)}
	case x < 78:
		// Mostly ahead of the last compaction; sometimes at or behind
		// it (compacted) or past the current revision (future).
		return op{"compact", &pb.CompactionRequest{Revision: g.pastRev(), Physical: g.chance(50)}}
	case x < 83:
		id := 1 + g.rnd.Int64N(math.MaxInt64-1)
		if l := g.liveLease(); l != 0 && g.chance(10) {
			id = l // lease exists
		}
		ttl := 300 + g.rnd.Int64N(600)
		if g.chance(4) {
			ttl = 9_000_000_001 // over etcd's MaxLeaseTTL
		}
		return op{"lease-grant", &pb.LeaseGrantRequest{ID: id, TTL: ttl}}
	case x < 85:
		return op{"lease-revoke", &pb.LeaseRevokeRequest{ID: g.someLease()}}
	case x < 88:
		return op{"lease-ttl", &pb.LeaseTimeToLiveRequest{ID: g.someLease(), Keys: g.chance(60)}}
	case x < 89:
		return op{"lease-leases", &pb.LeaseLeasesRequest{}}
	case x < 91:
		return op{"lease-keepalive", &pb.LeaseKeepAliveRequest{ID: g.someLease()}}
	case x < 92:
		return g.badReq()
	case x < 94:
		r := &pb.HashKVRequest{}
		if g.chance(50) {
			r.Revision = g.pastRev()
		}
		return op{"hashkv", r}
	default:
		if g.rev < 2 {
			return op{"range", g.rangeReq()}
		}
		// A past revision only (see the package doc); sometimes a
		// compacted one.
		lo := max(g.compactRev-1, 1)
		k, e := g.keyRange()
		r := &pb.WatchCreateRequest{Key: k, RangeEnd: e, StartRevision: lo + g.rnd.Int64N(g.rev-lo+1), PrevKv: g.chance(30)}
		if g.chance(10) {
			r.Filters = append(r.Filters, pb.WatchCreateRequest_NOPUT)
		}
		if g.chance(10) {
			r.Filters = append(r.Filters, pb.WatchCreateRequest_NODELETE)
		}
		return op{"watch", r}
	}
}

// badReq is bad input: an empty key, an enum value the protos do not name,
// too many txn ops, a request over the size limit. Both must answer as etcd
// does: the same error code and message where etcd refuses it (all but
// some unknown enum values), the same response where it does not.
func (g *generator) badReq() op {
	switch g.rnd.IntN(8) {
	case 0:
		return op{"bad", &pb.PutRequest{Value: []byte("v")}}
	case 1:
		return op{"bad", &pb.RangeRequest{}}
	case 2:
		return op{"bad", &pb.DeleteRangeRequest{}}
	case 3:
		r := &pb.RangeRequest{Key: g.key(), RangeEnd: []byte{0}}
		if g.chance(50) {
			r.SortOrder = pb.RangeRequest_SortOrder(3 + g.rnd.IntN(5))
		} else {
			r.SortOrder, r.SortTarget = pb.RangeRequest_ASCEND, pb.RangeRequest_SortTarget(5+g.rnd.IntN(5))
		}
		return op{"bad", r}
	case 4:
		// etcd's --max-txn-ops default is 128.
		r := &pb.TxnRequest{}
		for i := range 129 {
			r.Success = append(r.Success, &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte(keys[i%len(keys)])}}})
		}
		return op{"bad", r}
	case 5:
		// Over etcd's --max-request-bytes default (1.5 MiB), under the
		// gRPC limit it derives from it (that plus 512 KiB).
		return op{"bad", &pb.PutRequest{Key: g.key(), Value: make([]byte, 1600<<10)}}
	case 6:
		return op{"bad", &pb.TxnRequest{Compare: []*pb.Compare{{Key: g.key(), Target: pb.Compare_CompareTarget(5 + g.rnd.IntN(3)), Result: pb.Compare_EQUAL}}}}
	default:
		return op{"bad", &pb.TxnRequest{Compare: []*pb.Compare{{Key: g.key(), Target: pb.Compare_VERSION, Result: pb.Compare_CompareResult(4 + g.rnd.IntN(3)), TargetUnion: &pb.Compare_Version{Version: 1}}}}}
	}
}

// observe updates the generator's view from A's answer.
func (g *generator) observe(o op, r result) {
	if r.err != "" || len(r.msgs) == 0 {
		return
	}
	for _, m := range r.msgs {
		if h := header(m); h != nil && h.Revision > g.rev {
			g.rev = h.Revision
		}
	}
	switch req := o.req.(type) {
	case *pb.CompactionRequest:
		g.compactRev = max(g.compactRev, req.Revision)
	case *pb.LeaseGrantRequest:
		if !slices.Contains(g.leases, req.ID) {
			g.leases = append(g.leases, req.ID)
		}
	case *pb.LeaseRevokeRequest:
		g.leases = slices.DeleteFunc(g.leases, func(id int64) bool { return id == req.ID })
	}
}

func header(m proto.Message) *pb.ResponseHeader {
	if h, ok := m.(interface{ GetHeader() *pb.ResponseHeader }); ok {
		return h.GetHeader()
	}
	return nil
}

// ErrIsMismatch reports whether err is (or wraps) a *Mismatch.
func ErrIsMismatch(err error) bool {
	var m *Mismatch
	return errors.As(err, &m)
}
