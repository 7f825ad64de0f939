package edge

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/aethermesh/aether/edge/internal/core"
)

// recvWatch reads one watch response or fails after a deadline.
func recvWatch(t *testing.T, ch clientv3.WatchChan) clientv3.WatchResponse {
	t.Helper()
	select {
	case wr, ok := <-ch:
		if !ok {
			t.Fatal("watch channel closed")
		}
		return wr
	case <-time.After(10 * time.Second):
		t.Fatal("no watch response within 10s")
	}
	return clientv3.WatchResponse{}
}

func TestWatchPastRevisionPrevKVFilters(t *testing.T) {
	s := startServer(t, "", nil)
	c := newClient(t, s)
	ctx := testCtx(t)

	c.Put(ctx, "w/a", "1")                                                           // 2
	c.Put(ctx, "w/b", "1")                                                           // 3
	c.Put(ctx, "w/a", "2")                                                           // 4
	c.Delete(ctx, "w/b")                                                             // 5
	c.Put(ctx, "other", "x")                                                         // 6
	c.Txn(ctx).Then(clientv3.OpPut("w/c", "1"), clientv3.OpPut("w/d", "1")).Commit() // 7

	wch := c.Watch(ctx, "w/", clientv3.WithPrefix(), clientv3.WithRev(3), clientv3.WithPrevKV())
	var evs []*clientv3.Event
	for len(evs) < 5 {
		wr := recvWatch(t, wch)
		if err := wr.Err(); err != nil {
			t.Fatal(err)
		}
		evs = append(evs, wr.Events...)
	}
	want := []string{"PUT w/b 3 prev=", "PUT w/a 4 prev=1", "DELETE w/b 5 prev=1", "PUT w/c 7 prev=", "PUT w/d 7 prev="}
	for i, ev := range evs {
		prev := ""
		if ev.PrevKv != nil {
			prev = string(ev.PrevKv.Value)
		}
		got := fmt.Sprintf("%s %s %d prev=%s", ev.Type, ev.Kv.Key, ev.Kv.ModRevision, prev)
		if got != want[i] {
			t.Errorf("event %d = %q, want %q", i, got, want[i])
		}
	}

	// Live events after the catch-up, one response per change; NOPUT.
	dch := c.Watch(ctx, "w/", clientv3.WithPrefix(), clientv3.WithFilterPut())
	nch := c.Watch(ctx, "w/a")                 // no prev_kv asked: none sent
	c.Put(ctx, "w/a", "3")                     // 8
	c.Delete(ctx, "w/", clientv3.WithPrefix()) // 9
	wr := recvWatch(t, wch)
	if len(wr.Events) != 1 || wr.Events[0].Kv.ModRevision != 8 || wr.Header.Revision != 8 {
		t.Fatalf("live put: %+v", wr)
	}
	wr = recvWatch(t, wch)
	if len(wr.Events) != 3 || wr.Header.Revision != 9 {
		t.Fatalf("atomic delete of 3 keys: %+v", wr.Events)
	}
	wr = recvWatch(t, dch)
	if len(wr.Events) != 3 || wr.Events[0].Type != mvccpb.DELETE {
		t.Fatalf("NOPUT watcher got %+v", wr.Events)
	}
	wr = recvWatch(t, nch)
	if len(wr.Events) != 1 || wr.Events[0].PrevKv != nil {
		t.Fatalf("watcher without prev_kv got %+v", wr.Events)
	}
}

func TestWatchProgress(t *testing.T) {
	s := startServer(t, "", func(c *Config) { c.WatchProgressNotifyInterval = 100 * time.Millisecond })
	c := newClient(t, s)
	ctx := testCtx(t)
	c.Put(ctx, "k", "v") // 2

	wch := c.Watch(ctx, "k", clientv3.WithProgressNotify())
	// Progress on request, once the watcher is synced.
	eventually(t, 10*time.Second, "a requested progress notification", func() bool {
		if err := c.RequestProgress(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case wr := <-wch:
			return wr.IsProgressNotify() && wr.Header.Revision == 2
		case <-time.After(200 * time.Millisecond):
			return false
		}
	})
	// And on the interval, with no request.
	c.Put(ctx, "unrelated", "v") // 3
	eventually(t, 10*time.Second, "a periodic progress notification at revision 3", func() bool {
		wr := recvWatch(t, wch)
		return wr.IsProgressNotify() && wr.Header.Revision == 3
	})
}

func TestWatchCompactedCancel(t *testing.T) {
	s := startServer(t, "", nil)
	c := newClient(t, s)
	ctx := testCtx(t)
	for i := 0; i < 5; i++ {
		c.Put(ctx, "k", fmt.Sprint(i)) // 2..6
	}
	if _, err := c.Compact(ctx, 5); err != nil {
		t.Fatal(err)
	}
	wr := recvWatch(t, c.Watch(ctx, "k", clientv3.WithRev(3)))
	if !wr.Canceled || wr.CompactRevision != 5 || wr.Err() != rpctypes.ErrCompacted {
		t.Fatalf("watch below compaction: %+v err=%v", wr, wr.Err())
	}
	// At the compaction revision itself the history is still there (etcd
	// refuses only start < compact).
	wr = recvWatch(t, c.Watch(ctx, "k", clientv3.WithRev(5)))
	if wr.Canceled || len(wr.Events) != 2 || wr.Events[0].Kv.ModRevision != 5 {
		t.Fatalf("watch at compaction: %+v", wr)
	}
}

// rawWatch opens a Watch stream with grpc-go directly, to see responses
// clientv3 would hide (fragments, refusals).
func rawWatch(t *testing.T, s *Server, opts ...grpc.DialOption) pb.Watch_WatchClient {
	t.Helper()
	target := strings.TrimPrefix(s.ClientURLs()[0], "http://")
	conn, err := grpc.NewClient(target, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := pb.NewWatchClient(conn).Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return stream
}

func create(t *testing.T, st pb.Watch_WatchClient, cr *pb.WatchCreateRequest) {
	t.Helper()
	if err := st.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: cr}}); err != nil {
		t.Fatal(err)
	}
}

func TestWatchIDsAndCancel(t *testing.T) {
	s := startServer(t, "", nil)
	c := newClient(t, s)
	ctx := testCtx(t)
	st := rawWatch(t, s)

	create(t, st, &pb.WatchCreateRequest{Key: []byte("a")})
	create(t, st, &pb.WatchCreateRequest{Key: []byte("b"), WatchId: 7})
	create(t, st, &pb.WatchCreateRequest{Key: []byte("c"), WatchId: 7})
	create(t, st, &pb.WatchCreateRequest{Key: []byte("c")})
	create(t, st, &pb.WatchCreateRequest{Key: []byte("z"), RangeEnd: []byte("a")})
	var got []string
	for range 5 {
		wr, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%d created=%v canceled=%v %s", wr.WatchId, wr.Created, wr.Canceled, wr.CancelReason))
	}
	want := []string{
		"0 created=true canceled=false ",
		"7 created=true canceled=false ",
		"-1 created=true canceled=true mvcc: duplicate watch ID provided on the WatchStream",
		"1 created=true canceled=false ",
		"-1 created=true canceled=true mvcc: watcher range is empty",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("responses:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if err := st.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CancelRequest{CancelRequest: &pb.WatchCancelRequest{WatchId: 7}}}); err != nil {
		t.Fatal(err)
	}
	wr, err := st.Recv()
	if err != nil || wr.WatchId != 7 || !wr.Canceled {
		t.Fatalf("cancel: %+v %v", wr, err)
	}
	c.Put(ctx, "b", "x") // cancelled watcher: nothing
	c.Put(ctx, "a", "x")
	wr, err = st.Recv()
	if err != nil || wr.WatchId != 0 || len(wr.Events) != 1 || string(wr.Events[0].Kv.Key) != "a" {
		t.Fatalf("after cancel: %+v %v", wr, err)
	}
}

func TestWatchFragment(t *testing.T) {
	s := startServer(t, "", nil)
	c := newClient(t, s)
	ctx := testCtx(t)
	// Five 600 KiB values: one catch-up response of 3 MiB, over the
	// fragment limit (MaxRequestBytes + 512 KiB = 2 MiB).
	val := strings.Repeat("v", 600*1024)
	for i := range 5 {
		if _, err := c.Put(ctx, fmt.Sprintf("f/%d", i), val); err != nil {
			t.Fatal(err)
		}
	}
	for _, fragment := range []bool{true, false} {
		st := rawWatch(t, s, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
		create(t, st, &pb.WatchCreateRequest{Key: []byte("f/"), RangeEnd: []byte("f0"), StartRevision: 1, Fragment: fragment})
		if wr, err := st.Recv(); err != nil || !wr.Created {
			t.Fatalf("create: %+v %v", wr, err)
		}
		var sizes []int
		var flags []bool
		for events := 0; events < 5; {
			wr, err := st.Recv()
			if err != nil {
				t.Fatal(err)
			}
			sizes = append(sizes, len(wr.Events))
			flags = append(flags, wr.Fragment)
			events += len(wr.Events)
		}
		if fragment {
			// Each fragment under 2 MiB: 3 + 2 events, the first flagged.
			if fmt.Sprint(sizes, flags) != "[3 2] [true false]" {
				t.Fatalf("fragments: sizes %v flags %v", sizes, flags)
			}
		} else if fmt.Sprint(sizes, flags) != "[5] [false]" {
			t.Fatalf("unfragmented: sizes %v flags %v", sizes, flags)
		}
	}
	// clientv3 reassembles fragments into one response.
	wr := recvWatch(t, c.Watch(ctx, "f/", clientv3.WithPrefix(), clientv3.WithRev(1), clientv3.WithFragment()))
	if len(wr.Events) != 5 {
		t.Fatalf("clientv3 got %d events", len(wr.Events))
	}
}

// A watcher that does not read falls behind the ring of recent revisions:
// it must still get every event, in order, from the core's history.
func TestWatchSlowWatcherLosesNothing(t *testing.T) {
	s := startServer(t, "", nil)
	s.hub.mu.Lock()
	s.hub.ringMax = 8
	s.hub.mu.Unlock()
	c := newClient(t, s)
	ctx := testCtx(t)
	// A fixed 64 KiB window (no BDP growth) so the stream blocks early.
	st := rawWatch(t, s, grpc.WithInitialWindowSize(1<<16), grpc.WithInitialConnWindowSize(1<<16),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(1<<30)))
	create(t, st, &pb.WatchCreateRequest{Key: []byte("s/"), RangeEnd: []byte("s0")})
	if wr, err := st.Recv(); err != nil || !wr.Created {
		t.Fatalf("create: %+v %v", wr, err)
	}
	before := s.hub.catchUps.Load()
	val := strings.Repeat("x", 32*1024)
	const n = 200
	first := int64(0)
	for i := range n {
		resp, err := c.Put(ctx, fmt.Sprintf("s/%d", i%7), val)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = resp.Header.Revision
		}
	}
	next := first
	for next < first+n {
		wr, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range wr.Events {
			if ev.Kv.ModRevision != next {
				t.Fatalf("event at revision %d, want %d", ev.Kv.ModRevision, next)
			}
			next++
		}
	}
	if s.hub.catchUps.Load() == before {
		t.Fatal("the watcher never fell behind the ring: the test did not exercise the catch-up path")
	}
}

// The ring of recent revisions is bounded by bytes as well as revisions,
// since its entries keep values alive after a compaction.
func TestHubRingBounds(t *testing.T) {
	h := newHub(&Server{st: core.New(1)}, 1)
	val := make([]byte, 1<<20)
	for rev := int64(2); rev < 202; rev++ {
		h.publish([]*core.Applied{{Rev: rev, Events: []*mvccpb.Event{{Kv: &mvccpb.KeyValue{Key: []byte("k"), Value: val, ModRevision: rev}}}}})
	}
	if h.ringSize > ringBytes || len(h.ring) != ringBytes/(1<<20+1) {
		t.Fatalf("ring holds %d revisions, %d bytes; want %d revisions under %d bytes", len(h.ring), h.ringSize, ringBytes/(1<<20+1), ringBytes)
	}
	if got, ok := h.since(201, 201); !ok || len(got) != 1 || got[0].rev != 201 {
		t.Fatalf("newest revision: %v %v", got, ok)
	}
	if _, ok := h.since(100, 201); ok {
		t.Fatal("revision 100 should have left the ring")
	}
	for rev := int64(202); rev < 202+2*ringRevisions; rev++ {
		h.publish([]*core.Applied{{Rev: rev, Events: []*mvccpb.Event{{Kv: &mvccpb.KeyValue{Key: []byte("k"), ModRevision: rev}}}}})
	}
	if len(h.ring) != ringRevisions {
		t.Fatalf("ring holds %d small revisions, want %d", len(h.ring), ringRevisions)
	}
}
