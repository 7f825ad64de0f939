package core

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"

	"github.com/aethermesh/aether/internal/testutil/etcdtest"
)

var (
	diffOps  = flag.Int("core.diff-ops", 2000, "requests per differential run against real etcd")
	diffSeed = flag.Uint64("core.diff-seed", 0, "seed of the differential run (0: a new one, printed)")
)

// TestDifferentialAgainstEtcd sends the same seeded random request
// sequence to a State and to a real single-member etcd (embedded, through
// its gRPC API) and requires equal answers: responses with headers
// normalised to their revision, errors by code and message, watch
// catch-up as Events. On a mismatch it prints the seed and the first
// differing request; rerun with -core.diff-seed to reproduce.
func TestDifferentialAgainstEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real etcd")
	}
	seed := *diffSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun: go test -run TestDifferentialAgainstEtcd -core.diff-seed %d)", seed, seed)
	cl := etcdtest.Start(t)
	cli := cl.Client(t)
	conn := cli.ActiveConnection()
	e := &etcdSide{kv: pb.NewKVClient(conn), lease: pb.NewLeaseClient(conn), conn: conn}

	s := New(7)
	// The embedded etcd runs a 250ms election timeout: its minimum lease
	// TTL is ceil(1.5 × 250ms) = 1s.
	s.SetMinLeaseTTL(1)
	g := newGen(seed)
	ctx := t.Context()
	// What the run exercised, so a reader can see it is not all errors.
	stats := map[string]int{}
	for i := range *diffOps {
		req := g.next(true)
		now := time.Now()
		want, werr := e.do(ctx, t, req)
		got, gerr := coreDo(s, now, req)
		if msg := diffResult(want, werr, got, gerr); msg != "" {
			t.Fatalf("seed %d, request %d: %s\n%s", seed, i, req, msg)
		}
		kind, _, _ := strings.Cut(req.String(), " ")
		if werr != nil {
			kind += " error"
		} else if tr, ok := want.(*pb.TxnResponse); ok {
			kind += fmt.Sprintf(" succeeded=%v", tr.Succeeded)
		}
		stats[kind]++
		g.observe(s.Rev(), s.CompactRev(), s.leaseIDs())
	}
	t.Logf("%d requests, final revision %d, compacted at %d, %d changes; %v", *diffOps, s.Rev(), s.CompactRev(), s.Index(), stats)
}

// coreDo runs one request on the core; responses are what the gRPC shell
// would send before it fills the header's cluster, member and term.
func coreDo(s *State, now time.Time, r request) (proto.Message, error) {
	switch {
	case r.Range != nil:
		return s.Range(r.Range)
	case r.Put != nil:
		resp, _, err := s.Put(now, r.Put)
		return resp, err
	case r.Delete != nil:
		resp, _, err := s.DeleteRange(now, r.Delete)
		return resp, err
	case r.Txn != nil:
		resp, _, err := s.Txn(now, r.Txn)
		return resp, err
	case r.Compact != nil:
		if err := s.Compact(r.Compact.Revision); err != nil {
			return nil, err
		}
		return &pb.CompactionResponse{Header: &pb.ResponseHeader{Revision: s.Rev()}}, nil
	case r.Grant != nil:
		resp, _, err := s.LeaseGrant(now, r.Grant)
		return resp, err
	case r.Revoke != nil:
		resp, _, err := s.LeaseRevoke(now, r.Revoke.ID)
		return resp, err
	case r.TTL != nil:
		return s.LeaseTimeToLive(now, r.TTL)
	case r.Leases:
		return s.Leases(), nil
	case r.Watch != nil:
		evs, err := s.Events(r.Watch.From, r.Watch.Key, r.Watch.End)
		if err != nil {
			return nil, err
		}
		return &pb.WatchResponse{Events: evs}, nil
	}
	return nil, errors.New("empty request")
}

type etcdSide struct {
	kv    pb.KVClient
	lease pb.LeaseClient
	conn  *grpc.ClientConn
}

func (e *etcdSide) do(ctx context.Context, t *testing.T, r request) (proto.Message, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	switch {
	case r.Range != nil:
		return e.kv.Range(ctx, r.Range)
	case r.Put != nil:
		return e.kv.Put(ctx, r.Put)
	case r.Delete != nil:
		return e.kv.DeleteRange(ctx, r.Delete)
	case r.Txn != nil:
		return e.kv.Txn(ctx, r.Txn)
	case r.Compact != nil:
		resp, err := e.kv.Compact(ctx, r.Compact)
		return resp, err
	case r.Grant != nil:
		return e.lease.LeaseGrant(ctx, r.Grant)
	case r.Revoke != nil:
		return e.lease.LeaseRevoke(ctx, r.Revoke)
	case r.TTL != nil:
		return e.lease.LeaseTimeToLive(ctx, r.TTL)
	case r.Leases:
		return e.lease.LeaseLeases(ctx, &pb.LeaseLeasesRequest{})
	case r.Watch != nil:
		return e.watch(ctx, t, r.Watch)
	}
	return nil, errors.New("empty request")
}

// watch opens a real watch at w.From and collects its catch-up: the
// events before the first progress notification (etcd sends one only once
// the watcher has caught up, so the request is repeated until it does).
func (e *etcdSide) watch(ctx context.Context, t *testing.T, w *watchReq) (proto.Message, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := pb.NewWatchClient(e.conn).Watch(ctx)
	if err != nil {
		return nil, err
	}
	err = st.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{
		Key: w.Key, RangeEnd: w.End, StartRevision: w.From, PrevKv: true}}})
	if err != nil {
		return nil, err
	}
	created, err := st.Recv()
	if err != nil {
		return nil, err
	}
	if created.CompactRevision != 0 {
		return nil, rpctypes.ErrGRPCCompacted
	}
	if created.Canceled {
		return nil, errors.New("watch canceled: " + created.CancelReason)
	}
	out := &pb.WatchResponse{}
	resps := make(chan *pb.WatchResponse)
	errc := make(chan error, 1)
	go func() {
		for {
			r, err := st.Recv()
			if err != nil {
				errc <- err
				return
			}
			select {
			case resps <- r:
			case <-ctx.Done():
				errc <- ctx.Err()
				return
			}
		}
	}()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	progress := func() error {
		return st.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_ProgressRequest{ProgressRequest: &pb.WatchProgressRequest{}}})
	}
	if err := progress(); err != nil {
		return nil, err
	}
	for {
		select {
		case r := <-resps:
			if r.CompactRevision != 0 {
				return nil, rpctypes.ErrGRPCCompacted
			}
			if len(r.Events) == 0 && r.WatchId == -1 {
				cancel()
				<-errc // the receiver has ended: no goroutine outlives the call
				return out, nil
			}
			out.Events = append(out.Events, r.Events...)
		case <-tick.C:
			if err := progress(); err != nil {
				return nil, err
			}
		case err := <-errc:
			return nil, err
		}
	}
}

// diffResult compares etcd's answer (want) with the core's (got).
func diffResult(want proto.Message, werr error, got proto.Message, gerr error) string {
	if werr != nil || gerr != nil {
		ws, gs := status.Convert(werr), status.Convert(gerr)
		if werr == nil || gerr == nil || ws.Code() != gs.Code() || ws.Message() != gs.Message() {
			return "etcd: " + errText(want, werr) + "\ncore: " + errText(got, gerr)
		}
		return ""
	}
	w, g := normalise(want), normalise(got)
	if !proto.Equal(w, g) {
		return "etcd: " + prototext.Format(w) + "\ncore: " + prototext.Format(g)
	}
	return ""
}

func errText(m proto.Message, err error) string {
	if err != nil {
		return "error " + err.Error()
	}
	return prototext.Format(m)
}

// normalise clears what legitimately differs: the top header's cluster,
// member and raft term, a lease's remaining TTL (clocks), the order of
// lease keys and lease lists (etcd iterates maps there).
func normalise(m proto.Message) proto.Message {
	m = proto.Clone(m)
	type header interface{ GetHeader() *pb.ResponseHeader }
	if h, ok := m.(header); ok && h.GetHeader() != nil {
		hd := h.GetHeader()
		hd.ClusterId, hd.MemberId, hd.RaftTerm = 0, 0, 0
	}
	switch r := m.(type) {
	case *pb.LeaseTimeToLiveResponse:
		if r.TTL > 0 {
			r.TTL = 1
		}
		slices.SortFunc(r.Keys, func(a, b []byte) int { return compareBytes(a, b) })
	case *pb.LeaseLeasesResponse:
		slices.SortFunc(r.Leases, func(a, b *pb.LeaseStatus) int { return int(a.ID - b.ID) })
	case *pb.WatchResponse:
		r.Header = nil
	}
	return m
}

func compareBytes(a, b []byte) int {
	switch {
	case string(a) < string(b):
		return -1
	case string(a) > string(b):
		return 1
	}
	return 0
}
