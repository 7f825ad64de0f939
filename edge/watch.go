package edge

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/aethermesh/aether/edge/internal/core"
)

// The watch implementation follows etcd's v3rpc/watch.go and
// storage/mvcc/watchable_store.go in everything a client can observe:
//
//   - A watcher created with start_revision 0 or in the future is "synced":
//     it gets each later change as its own response, header revision = the
//     change's revision. One created at a past revision catches up first
//     with responses of up to 1000 revisions each, header revision = the
//     revision it caught up to, then continues synced.
//   - A watcher whose start revision is below the compaction revision is
//     cancelled with CompactRevision set (Created is sent first).
//   - Watch ids: 0 asks for the next free id of the stream; any other id is
//     used as given, a duplicate is refused.
//   - A progress request is answered (watch id -1, header revision) when
//     every watcher of the stream has been sent everything up to that
//     revision; per-watcher progress_notify fires each interval in which the
//     watcher had no events.
//
// Where etcd's internals differ, the difference is invisible to clients or
// strictly safer:
//
//   - Every watcher is a cursor (minRev) over the published history, read
//     from a ring of recent revisions or, when a watcher fell behind the
//     ring, from the core's history. A slow watcher therefore never loses
//     events and never blocks writers: gRPC flow control holds back its
//     own stream only. (etcd parks it as a "victim" and may cancel it with
//     a compaction response; we cancel only when the history it needs has
//     really been compacted.)
//   - A progress request that arrives while watchers are catching up is
//     answered once they have caught up, instead of being dropped.

// ringRevisions and ringBytes bound the recent revisions the hub keeps for
// synced watchers; a watcher further behind reads the core's history
// instead. The entries share their bytes with the core, but they keep
// compacted values alive, hence the byte bound too.
const (
	ringRevisions = 4096
	ringBytes     = 64 << 20
)

// watchBatchMaxRevs is etcd's cap on the revisions in one catch-up response.
const watchBatchMaxRevs = 1000

// published is one durable revision and its events.
type published struct {
	rev    int64
	events []*mvccpb.Event
	size   int // bytes of keys and values the events reference
}

func eventsSize(evs []*mvccpb.Event) int {
	n := 0
	for _, ev := range evs {
		n += len(ev.Kv.Key) + len(ev.Kv.Value)
		if ev.PrevKv != nil {
			n += len(ev.PrevKv.Value)
		}
	}
	return n
}

// hub holds the durable revision, recent history, and the open streams.
type hub struct {
	s *Server

	mu        sync.Mutex
	rev       int64 // highest durable revision
	compacted int64
	ring      []published // consecutive revisions, oldest first
	ringMax   int         // ringRevisions; tests shrink it
	ringSize  int         // sum of the entries' sizes
	streams   map[*watchStream]struct{}
	// catchUps counts reads of the core's history by watchers (created in
	// the past or fallen behind the ring); tests use it to prove a path ran.
	catchUps atomic.Int64
}

func newHub(s *Server, rev int64) *hub {
	return &hub{s: s, rev: rev, compacted: s.st.CompactRev(), ringMax: ringRevisions, streams: map[*watchStream]struct{}{}}
}

// publish makes a durable batch visible to watchers, in revision order.
func (h *hub) publish(aps []*core.Applied) {
	h.mu.Lock()
	changed := false
	for _, ap := range aps {
		if ap.Rev == 0 {
			continue
		}
		e := published{rev: ap.Rev, events: ap.Events, size: eventsSize(ap.Events)}
		h.ring = append(h.ring, e)
		h.ringSize += e.size
		h.rev = ap.Rev
		changed = true
	}
	for len(h.ring) > 1 && (len(h.ring) > h.ringMax || h.ringSize > ringBytes) {
		h.ringSize -= h.ring[0].size
		h.ring[0] = published{} // release the events before reslicing
		h.ring = h.ring[1:]
	}
	if cap(h.ring) > 4*len(h.ring)+1024 {
		// Move to a fresh array so the dropped prefix can be freed.
		h.ring = append(make([]published, 0, 2*len(h.ring)), h.ring...)
	}
	var wake []*watchStream
	if changed {
		wake = make([]*watchStream, 0, len(h.streams))
		for ws := range h.streams {
			wake = append(wake, ws)
		}
	}
	h.mu.Unlock()
	for _, ws := range wake {
		ws.notify()
	}
}

func (h *hub) setCompacted(rev int64) {
	h.mu.Lock()
	if rev > h.compacted {
		h.compacted = rev
	}
	h.mu.Unlock()
}

func (h *hub) snapshot() (rev, compacted int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.rev, h.compacted
}

// since returns the published revisions in [from, to], or false when the
// ring no longer holds from.
func (h *hub) since(from, to int64) ([]published, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if from > to {
		return nil, true
	}
	if len(h.ring) == 0 || from < h.ring[0].rev {
		return nil, false
	}
	lo := int(from - h.ring[0].rev)
	hi := int(to - h.ring[0].rev + 1)
	hi = min(hi, len(h.ring))
	if lo >= hi {
		return nil, true
	}
	// A copy: publish zeroes entries it drops from the shared array.
	return append([]published(nil), h.ring[lo:hi]...), true
}

func (h *hub) register(ws *watchStream) {
	h.mu.Lock()
	h.streams[ws] = struct{}{}
	h.mu.Unlock()
}

func (h *hub) unregister(ws *watchStream) {
	h.mu.Lock()
	delete(h.streams, ws)
	h.mu.Unlock()
}

type watcher struct {
	id       int64
	key      []byte
	end      []byte // as on the wire: empty = key only, "\x00" = every key >= key
	startRev int64
	minRev   int64 // next revision this watcher has not been sent
	unsynced bool  // must catch up from the core's history first
	// pending holds catch-up events (revisions < minRev) not yet sent, with
	// the revision they were read at.
	pending    []*mvccpb.Event
	pendingRev int64

	noPut, noDelete         bool
	prevKV, fragment        bool
	progress, progressIsDue bool
}

func (w *watcher) matches(k []byte) bool {
	switch {
	case len(w.end) == 0:
		return bytes.Equal(k, w.key)
	case len(w.end) == 1 && w.end[0] == 0:
		return bytes.Compare(k, w.key) >= 0
	default:
		return bytes.Compare(k, w.key) >= 0 && bytes.Compare(k, w.end) < 0
	}
}

func (w *watcher) filtered(ev *mvccpb.Event) bool {
	return (w.noPut && ev.Type == mvccpb.Event_PUT) || (w.noDelete && ev.Type == mvccpb.Event_DELETE)
}

// synced: everything up to rev has been sent.
func (w *watcher) synced(rev int64) bool {
	return !w.unsynced && len(w.pending) == 0 && w.minRev > rev
}

type watchServer struct {
	pb.UnimplementedWatchServer
	s *Server
}

// watchStream is one Watch RPC. All watcher state is owned by the handler
// goroutine; a second goroutine only receives requests.
type watchStream struct {
	s        *Server
	srv      pb.Watch_WatchServer
	wake     chan struct{}
	watchers map[int64]*watcher
	nextID   int64
}

func (ws *watchStream) notify() {
	select {
	case ws.wake <- struct{}{}:
	default:
	}
}

func (w *watchServer) Watch(srv pb.Watch_WatchServer) error {
	s := w.s
	ws := &watchStream{s: s, srv: srv, wake: make(chan struct{}, 1), watchers: map[int64]*watcher{}}
	s.hub.register(ws)
	defer func() {
		s.hub.unregister(ws)
		s.metrics.watchers.Sub(float64(len(ws.watchers)))
	}()

	ctx := srv.Context()
	reqs := make(chan *pb.WatchRequest)
	recvErr := make(chan error, 1)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			req, err := srv.Recv()
			if errors.Is(err, io.EOF) {
				// etcd keeps serving a half-closed stream until the
				// client goes away.
				return
			}
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case reqs <- req:
			case <-ctx.Done():
				return
			}
		}
	}()

	ticker := s.progressTicker()
	defer ticker.Stop()
	for {
		rev, err := ws.flush()
		if err != nil {
			return err
		}
		select {
		case req := <-reqs:
			if err := ws.handle(req, rev); err != nil {
				return err
			}
		case <-ws.wake:
		case <-ticker.C:
			if err := ws.progressTick(rev); err != nil {
				return err
			}
		case err := <-recvErr:
			if ctx.Err() != nil {
				return rpctypes.ErrGRPCWatchCanceled
			}
			return err
		case <-ctx.Done():
			return rpctypes.ErrGRPCWatchCanceled
		case <-s.closing:
			return status.Error(codes.Unavailable, "edge: server is shutting down")
		}
	}
}

func (ws *watchStream) newHeader(rev int64) *pb.ResponseHeader {
	return &pb.ResponseHeader{ClusterId: ws.s.clusterID, MemberId: ws.s.memberID, RaftTerm: raftTerm, Revision: rev}
}

func (ws *watchStream) handle(req *pb.WatchRequest, synced int64) error {
	switch uv := req.RequestUnion.(type) {
	case *pb.WatchRequest_CreateRequest:
		if uv.CreateRequest == nil {
			return nil
		}
		return ws.create(uv.CreateRequest)
	case *pb.WatchRequest_CancelRequest:
		if uv.CancelRequest == nil {
			return nil
		}
		id := uv.CancelRequest.WatchId
		if _, ok := ws.watchers[id]; !ok {
			return nil // etcd answers nothing for an unknown id
		}
		delete(ws.watchers, id)
		ws.s.metrics.watchers.Dec()
		rev, _ := ws.s.hub.snapshot()
		return ws.srv.Send(&pb.WatchResponse{Header: ws.newHeader(rev), WatchId: id, Canceled: true})
	case *pb.WatchRequest_ProgressRequest:
		if uv.ProgressRequest == nil {
			return nil
		}
		// flush ran before this request was taken: every watcher has been
		// sent everything up to `synced` unless a send is still owed.
		if len(ws.watchers) == 0 {
			return nil
		}
		for _, w := range ws.watchers {
			if !w.synced(synced) || synced < w.startRev {
				return nil
			}
		}
		return ws.srv.Send(&pb.WatchResponse{Header: ws.newHeader(synced), WatchId: -1})
	default:
		ws.s.log.Info("invalid watch request type received in gRPC stream", "type", fmt.Sprintf("%T", uv))
		return nil
	}
}

func (ws *watchStream) create(creq *pb.WatchCreateRequest) error {
	s := ws.s
	rev, _ := s.hub.snapshot()
	key := creq.Key
	if len(key) == 0 {
		key = []byte{0} // \x00 is the smallest key
	}
	if creq.StartRevision < 0 {
		return ws.srv.Send(&pb.WatchResponse{Header: ws.newHeader(rev), WatchId: -1, Created: true, Canceled: true,
			CancelReason: rpctypes.ErrCompacted.Error()})
	}
	end := creq.RangeEnd
	if len(end) > 0 && !(len(end) == 1 && end[0] == 0) && bytes.Compare(key, end) >= 0 {
		return ws.srv.Send(&pb.WatchResponse{Header: ws.newHeader(rev), WatchId: -1, Created: true, Canceled: true,
			CancelReason: errEmptyWatcherRange})
	}
	id := creq.WatchId
	if id == 0 { // clientv3.AutoWatchID
		for ws.watchers[ws.nextID] != nil {
			ws.nextID++
		}
		id = ws.nextID
		ws.nextID++
	} else if _, ok := ws.watchers[id]; ok {
		return ws.srv.Send(&pb.WatchResponse{Header: ws.newHeader(rev), WatchId: -1, Created: true, Canceled: true,
			CancelReason: errWatcherDuplicateID})
	}
	w := &watcher{
		id: id, key: key, end: end, startRev: creq.StartRevision,
		prevKV: creq.PrevKv, fragment: creq.Fragment, progress: creq.ProgressNotify, progressIsDue: true,
	}
	for _, f := range creq.Filters {
		switch f {
		case pb.WatchCreateRequest_NOPUT:
			w.noPut = true
		case pb.WatchCreateRequest_NODELETE:
			w.noDelete = true
		}
	}
	if creq.StartRevision == 0 || creq.StartRevision > rev {
		w.minRev = max(rev+1, creq.StartRevision)
	} else {
		w.minRev = creq.StartRevision
		w.unsynced = true
	}
	ws.watchers[id] = w
	ws.s.metrics.watchers.Inc()
	return ws.srv.Send(&pb.WatchResponse{Header: ws.newHeader(rev), WatchId: id, Created: true})
}

// etcd's mvcc errors, which it sends as cancel reasons.
const (
	errEmptyWatcherRange  = "mvcc: watcher range is empty"
	errWatcherDuplicateID = "mvcc: duplicate watch ID provided on the WatchStream"
)

// flush sends every watcher what has been published since its cursor and
// returns the revision all watchers are now synced to.
func (ws *watchStream) flush() (int64, error) {
	rev, _ := ws.s.hub.snapshot()
	for _, w := range ws.watchers {
		if err := ws.flushWatcher(w, rev); err != nil {
			return 0, err
		}
	}
	return rev, nil
}

func (ws *watchStream) flushWatcher(w *watcher, rev int64) error {
	if !w.unsynced && len(w.pending) == 0 && w.minRev <= rev {
		entries, ok := ws.s.hub.since(w.minRev, rev)
		if !ok {
			// Fell behind the ring: catch up from the core like a watcher
			// created in the past.
			w.unsynced = true
		} else {
			for _, e := range entries {
				evs := ws.select_(w, e.events)
				w.minRev = e.rev + 1
				if len(evs) > 0 {
					if err := ws.sendEvents(w, e.rev, evs); err != nil {
						return err
					}
				}
			}
			return nil
		}
	}
	if w.unsynced {
		done, err := ws.catchUp(w, rev)
		if err != nil || done {
			return err
		}
	}
	for len(w.pending) > 0 {
		// Cut at watchBatchMaxRevs distinct revisions, never inside one.
		n, revs := 0, 0
		for n < len(w.pending) {
			if n == 0 || w.pending[n].Kv.ModRevision != w.pending[n-1].Kv.ModRevision {
				revs++
				if revs > watchBatchMaxRevs {
					break
				}
			}
			n++
		}
		evs := w.pending[:n]
		w.pending = w.pending[n:]
		if err := ws.sendEvents(w, w.pendingRev, ws.withPrevKV(w, evs)); err != nil {
			return err
		}
	}
	w.pending = nil
	return nil
}

// catchUp reads the watcher's missed history (revisions minRev..rev) from
// the core. It reports done when the watcher was cancelled for compaction.
func (ws *watchStream) catchUp(w *watcher, rev int64) (bool, error) {
	s := ws.s
	s.hub.catchUps.Add(1)
	s.mu.RLock()
	compacted := s.st.CompactRev()
	var evs []*mvccpb.Event
	var err error
	if w.minRev >= compacted {
		evs, err = s.st.Events(w.minRev, w.key, w.end)
	}
	s.mu.RUnlock()
	if w.minRev < compacted || errors.Is(err, rpctypes.ErrGRPCCompacted) {
		// etcd: the watcher is removed and told the compaction revision;
		// its header carries revision 0.
		delete(ws.watchers, w.id)
		s.metrics.watchers.Dec()
		return true, ws.srv.Send(&pb.WatchResponse{Header: ws.newHeader(0), WatchId: w.id,
			CompactRevision: compacted, Canceled: true})
	}
	if err != nil {
		return true, status.Errorf(codes.Internal, "edge: watch history from revision %d: %v", w.minRev, err)
	}
	var out []*mvccpb.Event
	for _, ev := range evs {
		if ev.Kv.ModRevision < w.minRev || ev.Kv.ModRevision > rev || !w.matches(ev.Kv.Key) || w.filtered(ev) {
			continue
		}
		out = append(out, ev)
	}
	w.pending, w.pendingRev = out, rev
	w.minRev = rev + 1
	w.unsynced = false
	return false, nil
}

// select_ picks one revision's events for w, with prev_kv as requested.
func (ws *watchStream) select_(w *watcher, evs []*mvccpb.Event) []*mvccpb.Event {
	var out []*mvccpb.Event
	for _, ev := range evs {
		if w.matches(ev.Kv.Key) && !w.filtered(ev) {
			out = append(out, ev)
		}
	}
	return ws.withPrevKV(w, out)
}

// withPrevKV copies the events (the published ones are shared by every
// watcher) and keeps PrevKv only when the watcher asked for it, the event is
// not a creation, and the previous revision is not compacted: exactly when
// etcd's range at ModRevision-1 would find it.
func (ws *watchStream) withPrevKV(w *watcher, evs []*mvccpb.Event) []*mvccpb.Event {
	_, compacted := ws.s.hub.snapshot()
	out := make([]*mvccpb.Event, len(evs))
	for i, ev := range evs {
		c := &mvccpb.Event{Type: ev.Type, Kv: ev.Kv}
		create := ev.Type == mvccpb.Event_PUT && ev.Kv.CreateRevision == ev.Kv.ModRevision
		if w.prevKV && !create && ev.Kv.ModRevision-1 >= compacted {
			c.PrevKv = ev.PrevKv
		}
		out[i] = c
	}
	return out
}

func (ws *watchStream) sendEvents(w *watcher, rev int64, evs []*mvccpb.Event) error {
	wr := &pb.WatchResponse{Header: ws.newHeader(rev), WatchId: w.id, Events: evs}
	w.progressIsDue = false
	if !w.fragment {
		return ws.srv.Send(wr)
	}
	return sendFragments(wr, uint(ws.s.maxRequestBytes+grpcOverheadBytes), ws.srv.Send)
}

// progressTick is etcd's per-watcher progress_notify: a watcher that had
// no events during the interval hears the revision it is synced to.
func (ws *watchStream) progressTick(rev int64) error {
	for _, w := range ws.watchers {
		if !w.progress {
			continue
		}
		if w.progressIsDue && w.synced(rev) && rev >= w.startRev {
			if err := ws.srv.Send(&pb.WatchResponse{Header: ws.newHeader(rev), WatchId: w.id}); err != nil {
				return err
			}
		}
		w.progressIsDue = true
	}
	return nil
}

// sendFragments is etcd's: a response over the limit with more than one
// event is split into fragments, each flagged but the last.
func sendFragments(wr *pb.WatchResponse, maxRequestBytes uint, send func(*pb.WatchResponse) error) error {
	if uint(proto.Size(wr)) < maxRequestBytes || len(wr.Events) < 2 {
		return send(wr)
	}
	var idx int
	for {
		cur := &pb.WatchResponse{
			Header:          wr.Header,
			WatchId:         wr.WatchId,
			Created:         wr.Created,
			Canceled:        wr.Canceled,
			CompactRevision: wr.CompactRevision,
			CancelReason:    wr.CancelReason,
			Fragment:        true,
			Events:          make([]*mvccpb.Event, 0),
		}
		for _, ev := range wr.Events[idx:] {
			cur.Events = append(cur.Events, ev)
			if len(cur.Events) > 1 && uint(proto.Size(cur)) >= maxRequestBytes {
				cur.Events = cur.Events[:len(cur.Events)-1]
				break
			}
			idx++
		}
		if idx == len(wr.Events) {
			cur.Fragment = false
		}
		if err := send(cur); err != nil {
			return err
		}
		if !cur.Fragment {
			return nil
		}
	}
}
