package core

import (
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/registry"
)

// Errors the state machine returns. They are the replica's exported
// errors (package replica re-exports them), so a caller in process and the
// gRPC layer match them with errors.Is.
var (
	ErrNotFound  = errors.New("endpoint is not registered")
	ErrQueueFull = errors.New("write queue is full")
	ErrNodeFull  = errors.New("node has its limit of endpoints")
)

// NodeFullError refuses a registration that would give a node more than
// --max-endpoints-per-node endpoints.
type NodeFullError struct {
	Node  registry.NodeID
	Count int
	Limit int
}

// Is makes a per-node limit refusal ErrNodeFull.
func (e *NodeFullError) Is(target error) bool { return target == ErrNodeFull }

func (e *NodeFullError) Error() string {
	return fmt.Sprintf("node %q of region %q cluster %q already has %d endpoints, the limit (--max-endpoints-per-node %d); unregister one first (updates of existing endpoints are always allowed)",
		e.Node.Name, e.Node.Region, e.Node.Cluster, e.Count, e.Limit)
}

// State is the registrar's functional core: the endpoint snapshot, the event
// sequence and its history, and the bookkeeping that reconciles local writes
// with what the backend reports. It does no I/O and takes no locks; the
// Registrar serializes calls to it and performs the I/O its results call for.
//
// Invariants:
//   - Every change to the snapshot produces exactly one event, with the next
//     sequence number, appended to history. A change that alters nothing
//     (same attributes) produces no event.
//   - A local write wins until it is persisted: while an endpoint has a write
//     pending or in flight, or the backend has not yet reported the revision
//     our write landed at, nothing the backend reports about that endpoint
//     may change the snapshot. A slow or failing backend therefore never
//     reverts a registration (or resurrects an unregistration).
//   - backendRev only grows; a report older than what the snapshot already
//     reflects is ignored.
type State struct {
	epoch   string
	seq     uint64
	hist    *history
	byCount map[string]int // endpoints per cluster, for the gauge

	// byNode counts the endpoints of each node (endpoints without a node
	// are not counted), for --max-endpoints-per-node: register refuses to
	// add an endpoint to a node holding maxPerNode (0: unlimited) already.
	byNode     map[registry.NodeID]int
	maxPerNode int
	// batchSize is --write-batch-size: a queue of this many pending writes
	// asks for a flush at once (Effects.Flush).
	batchSize int
	// byNodeServing counts the SERVING ones among them, for the held
	// counts ListNodes reports.
	byNodeServing map[registry.NodeID]int

	// endpoints by service, then identity. Stored values are immutable:
	// an update replaces the pointer, so snapshots handed to streams need
	// no copying.
	endpoints map[string]map[registry.EndpointID]*registryv1.ServiceEndpoint

	queue     writeQueue
	flushed   map[registry.EndpointID]int64 // revision our last write of a key landed at
	backendRv int64                         // the backend revision the snapshot reflects

	// epRev is, for an endpoint whose stored value is known to be the
	// backend's value as of some write, that write's mod revision; absent
	// when not known (a local write not yet flushed). The backstop
	// re-list compares it with a keys-only listing and fetches only the
	// values that differ (digest.go), so it must never name a revision
	// whose value differs from the stored one: every change to the
	// snapshot drops it, and only a backend report or a landed flush of
	// exactly the stored value sets it (at the revision of the Txn that
	// carried it: a large flush spans several).
	epRev   map[registry.EndpointID]int64
	nodeRev map[registry.NodeID]int64

	// Node records, as etcd has them. Ours are written synchronously, so the
	// only guard needed is against a listing older than our own put.
	nodes       map[registry.NodeID]*registryv1.Node
	nodeFlushed map[registry.NodeID]int64

	// track notes the watch's changes while a background re-list is out
	// (relist.go); nil otherwise.
	track *relistTrack

	// clock stamps every acknowledged write (registry.HLC); it observes
	// every stamp the backend reports, so a write acknowledged after this
	// replica saw another's is ordered after it.
	clock registry.HLC
	// base is, per key, the mod revisions of the key and of its tombstone
	// in the backend as last seen: the guesses an ordered flush swaps
	// against (backend.Store.ApplyOrdered). A wrong guess costs the flush a
	// round trip, never correctness, so it is kept only where cheap to
	// know.
	base map[registry.EndpointID]baseRev

	// peer are provisional writes from peer-watch, not yet confirmed by
	// the backend (peer.go); peerFloor, per key, the stamp of a value a
	// backend deletion removed since the last backstop listing: a peer
	// write no newer than it is stale. peerGrace is how long a peer write is
	// given to reach the backend before a listing may judge it.
	peer      map[registry.EndpointID]peerWrite
	peerFloor map[registry.EndpointID]*registryv1.WriteStamp
	// peerFloorOld are the floors of the previous backstop interval.
	peerFloorOld map[registry.EndpointID]*registryv1.WriteStamp
	peerGrace    time.Duration
}

// baseRev is what the backend was last seen to hold for a key: the key's
// and its tombstone's mod revisions (0: absent), learned at revision seen.
type baseRev struct{ key, tomb, seen int64 }

// noteBase records the backend's revisions of a key learned at seen,
// unless something newer is known already.
func (s *State) noteBase(id registry.EndpointID, key, tomb, seen int64) {
	if b, ok := s.base[id]; ok && b.seen > seen {
		return
	}
	if key == 0 && tomb == 0 {
		delete(s.base, id) // what a key with no entry is guessed to be
		return
	}
	s.base[id] = baseRev{key: key, tomb: tomb, seen: seen}
}

// noteWatched takes what the watch says a key holds as the next ordered
// flush's guess, but only where the local write waiting for that flush is
// known to be newer: a swap against a revision succeeds without looking at
// the value there, so the guess must never name a value stamped after the
// write that will swap against it. Where the local write may be older (a
// value stamped later, or a delete, whose stamp is in its tombstone, which
// no watch carries), the old guess stays; it fails, and the flush reads
// the key and decides by the stamps.
func (s *State) noteWatched(e backend.Event) {
	if w, ok := s.queue.latest(e.ID); ok {
		if e.Endpoint == nil || registry.CompareStamps(w.stamp, e.Endpoint.GetStamp()) < 0 {
			return
		}
	}
	if e.Endpoint != nil {
		s.noteBase(e.ID, e.Revision, s.base[e.ID].tomb, e.Revision)
	} else {
		s.noteBase(e.ID, 0, s.base[e.ID].tomb, e.Revision)
	}
}

// NodeStamp is the stamp of a node record written now, after prev.
func (s *State) NodeStamp(prev *registryv1.Node, now time.Time) *registryv1.WriteStamp {
	if st := prev.GetStamp(); st != nil {
		s.clock.Observe(st.GetHlc())
	}
	return &registryv1.WriteStamp{Hlc: s.clock.Next(now), Writer: s.epoch}
}

// observe pulls the clock past a stamp the backend reported.
func (s *State) observe(ep *registryv1.ServiceEndpoint) {
	if st := ep.GetStamp(); st != nil {
		s.clock.Observe(st.GetHlc())
	}
}

// stamp is the order of a write acknowledged now, after prev (the value
// the snapshot holds, nil if none).
func (s *State) stamp(prev *registryv1.ServiceEndpoint, now time.Time) *registryv1.WriteStamp {
	s.observe(prev)
	return &registryv1.WriteStamp{Hlc: s.clock.Next(now), Writer: s.epoch}
}

// Config is what the State needs of the registrar's options.
type Config struct {
	Epoch        string // this incarnation's name in version tokens
	HistorySize  int    // --watch-history: events retained for resume
	QueueLimit   int    // --write-queue-limit: endpoints with unpersisted writes
	MaxPerNode   int    // --max-endpoints-per-node (0: unlimited)
	FlushAtBatch int    // --write-batch-size: pending writes that ask for a flush at once
	// PeerGrace is how long a peer-watch write is given to reach the
	// backend before a backstop listing may remove or correct it.
	PeerGrace time.Duration
}

// New is an empty State.
func New(c Config) *State {
	return &State{
		epoch:         c.Epoch,
		maxPerNode:    c.MaxPerNode,
		batchSize:     c.FlushAtBatch,
		hist:          newHistory(c.HistorySize),
		byCount:       map[string]int{},
		byNode:        map[registry.NodeID]int{},
		byNodeServing: map[registry.NodeID]int{},
		endpoints:     map[string]map[registry.EndpointID]*registryv1.ServiceEndpoint{},
		queue:         newWriteQueue(c.QueueLimit),
		flushed:       map[registry.EndpointID]int64{},
		epRev:         map[registry.EndpointID]int64{},
		nodeRev:       map[registry.NodeID]int64{},
		nodes:         map[registry.NodeID]*registryv1.Node{},
		nodeFlushed:   map[registry.NodeID]int64{},
		base:          map[registry.EndpointID]baseRev{},
		peer:          map[registry.EndpointID]peerWrite{},
		peerFloor:     map[registry.EndpointID]*registryv1.WriteStamp{},
		peerFloorOld:  map[registry.EndpointID]*registryv1.WriteStamp{},
		peerGrace:     c.PeerGrace,
	}
}

// Epoch names this incarnation in version tokens.
func (s *State) Epoch() string { return s.epoch }

// Version is the position of the latest event.
func (s *State) Version() Version { return Version{Epoch: s.epoch, Seq: s.seq} }

// Get is the endpoint the snapshot holds under id (nil: none).
func (s *State) Get(id registry.EndpointID) *registryv1.ServiceEndpoint {
	return s.endpoints[id.Service][id]
}

// Len counts the snapshot's endpoints.
func (s *State) Len() int {
	n := 0
	for _, m := range s.endpoints {
		n += len(m)
	}
	return n
}

// set stores or removes (ep == nil) an endpoint and records the event. The
// endpoint's backend revision becomes unknown; setAt records it.
func (s *State) set(id registry.EndpointID, ep *registryv1.ServiceEndpoint) *registrarv1.EndpointEvent {
	delete(s.epRev, id)
	prev := s.Get(id)
	var typ registrarv1.EndpointEvent_EventType
	switch {
	case prev == nil && ep == nil:
		return nil
	case prev == nil:
		typ = registrarv1.EndpointEvent_ENDPOINT_ADDED
		m := s.endpoints[id.Service]
		if m == nil {
			m = map[registry.EndpointID]*registryv1.ServiceEndpoint{}
			s.endpoints[id.Service] = m
		}
		m[id] = ep
		s.byCount[id.Cluster]++
		s.countNode(id, ep, 1)
	case ep == nil:
		typ = registrarv1.EndpointEvent_ENDPOINT_REMOVED
		ep = prev
		m := s.endpoints[id.Service]
		delete(m, id)
		if len(m) == 0 {
			delete(s.endpoints, id.Service)
		}
		if s.byCount[id.Cluster]--; s.byCount[id.Cluster] == 0 {
			delete(s.byCount, id.Cluster)
		}
		s.countNode(id, prev, -1)
	default:
		if registry.SameAttributes(prev, ep) {
			return nil
		}
		typ = registrarv1.EndpointEvent_ENDPOINT_UPDATED
		s.endpoints[id.Service][id] = ep
		if prev.Node != ep.Node || prev.State != ep.State {
			s.countNode(id, prev, -1)
			s.countNode(id, ep, 1)
		}
	}
	s.seq++
	ev := &registrarv1.EndpointEvent{
		Type:     typ,
		Endpoint: ep,
		Sequence: s.seq,
		Version:  s.Version().String(),
	}
	s.hist.append(ev)
	return ev
}

// setAt is set with what the backend holds for id as of its write at
// revision rev (0: not known).
func (s *State) setAt(id registry.EndpointID, ep *registryv1.ServiceEndpoint, rev int64) *registrarv1.EndpointEvent {
	ev := s.set(id, ep)
	if ep != nil && rev > 0 {
		s.epRev[id] = rev
		s.noteBase(id, rev, s.base[id].tomb, rev)
	}
	s.observe(ep)
	return ev
}

// NodeOf is the node an endpoint belongs to; ok is false for an endpoint
// without a node.
func NodeOf(id registry.EndpointID, ep *registryv1.ServiceEndpoint) (registry.NodeID, bool) {
	if ep.GetNode() == "" {
		return registry.NodeID{}, false
	}
	return registry.NodeID{Region: id.Region, Cluster: id.Cluster, Name: ep.GetNode()}, true
}

// countNode adds d to the endpoint count of ep's node.
func (s *State) countNode(id registry.EndpointID, ep *registryv1.ServiceEndpoint, d int) {
	n, ok := NodeOf(id, ep)
	if !ok {
		return
	}
	if s.byNode[n] += d; s.byNode[n] <= 0 {
		delete(s.byNode, n)
	}
	if ep.GetState() == registryv1.State_STATE_SERVING {
		if s.byNodeServing[n] += d; s.byNodeServing[n] <= 0 {
			delete(s.byNodeServing, n)
		}
	}
}

// Register applies a validated, normalized endpoint from a client. It
// returns the stored endpoint and the effects: its event (none when
// nothing changed) and whether to wake the flusher.
//
// A write that changes no attribute still gets a stamp and is persisted,
// without an event: this replica's snapshot may lag a newer write through
// another replica, and the write acknowledged last must be the one that
// stays.
func (s *State) Register(ep *registryv1.ServiceEndpoint, now time.Time) (*registryv1.ServiceEndpoint, Effects, error) {
	id := registry.IDOf(ep)
	prev := s.Get(id)
	same := prev != nil && registry.SameAttributes(prev, ep)
	if n, ok := NodeOf(id, ep); ok && !same && s.maxPerNode > 0 && (prev == nil || prev.Node != ep.Node) && s.byNode[n] >= s.maxPerNode {
		return nil, Effects{}, &NodeFullError{Node: n, Count: s.byNode[n], Limit: s.maxPerNode}
	}
	if !s.queue.admits(id) {
		return nil, Effects{}, ErrQueueFull
	}
	ts := timestamppb.New(now)
	ep.UpdatedAt = ts
	ep.CreatedAt = ts
	if prev != nil {
		ep.CreatedAt = prev.CreatedAt
	}
	ep.Stamp = s.stamp(prev, now)
	s.queue.put(id, ep, now)
	delete(s.peer, id) // a local write supersedes a provisional one
	peer := []PeerWrite{{Endpoint: ep, Stamp: ep.Stamp}}
	if same {
		ep.UpdatedAt = prev.UpdatedAt
		s.endpoints[id.Service][id] = ep
		delete(s.epRev, id)
		return ep, s.queued(Effects{Peer: peer}), nil
	}
	e := event(s.set(id, ep))
	e.Peer = peer
	return ep, s.queued(e), nil
}

// queued adds to the effects of a write just queued whether the flusher
// must be woken: when the queue stops being empty or reaches a batch.
func (s *State) queued(e Effects) Effects {
	n := len(s.queue.pending)
	e.Flush = n == 1 || n >= s.batchSize
	return e
}

// Drain marks an endpoint DRAINING, keeping every other attribute. Draining
// a draining endpoint changes nothing.
func (s *State) Drain(id registry.EndpointID, now time.Time) (*registryv1.ServiceEndpoint, Effects, error) {
	prev := s.Get(id)
	if prev == nil {
		return nil, Effects{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	// A drain of a draining endpoint changes nothing here, but is stamped
	// and persisted all the same (see register).
	ep := proto.Clone(prev).(*registryv1.ServiceEndpoint)
	ep.State = registryv1.State_STATE_DRAINING
	return s.Register(ep, now)
}

// Unregister removes an endpoint a client named, and returns the
// removal's stamp (for a wait for its persistence).
func (s *State) Unregister(id registry.EndpointID, now time.Time) (*registryv1.WriteStamp, Effects, error) {
	prev := s.Get(id)
	if prev == nil {
		return nil, Effects{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if !s.queue.admits(id) {
		return nil, Effects{}, ErrQueueFull
	}
	st := s.stamp(prev, now)
	s.queue.del(id, st, now)
	delete(s.peer, id)
	e := event(s.set(id, nil))
	e.Peer = []PeerWrite{{Endpoint: prev, Deleted: true, Stamp: st}}
	return st, s.queued(e), nil
}

// Adopt takes into the snapshot a value read from the backend outside the
// watch: ep, written at rev, read at revision at. Nothing changes if the
// snapshot already holds the key, a local write of it is unpersisted, or
// the snapshot is already past at. Older reports of the key (the watch
// catching up) are ignored from now on, as for our own flushes.
func (s *State) Adopt(id registry.EndpointID, ep *registryv1.ServiceEndpoint, rev, at int64) Effects {
	if s.Get(id) != nil || s.guarded(id, at) || at <= s.backendRv {
		return Effects{}
	}
	s.flushed[id] = rev
	return event(s.setAt(id, ep, rev))
}

// guarded reports whether the backend's word on id must be ignored because
// a local write to it is unpersisted, or persisted at a revision later than
// rev.
func (s *State) guarded(id registry.EndpointID, rev int64) bool {
	return s.queue.holds(id) || s.flushed[id] > rev
}

// ApplyWatch folds batches of backend changes, in order, into the
// snapshot. A node record's deletion asks for a sweep.
func (s *State) ApplyWatch(bs ...backend.WatchBatch) Effects {
	var e Effects
	for _, b := range bs {
		e.Add(s.applyWatch(b))
	}
	return e
}

func (s *State) applyWatch(b backend.WatchBatch) Effects {
	var evs []*registrarv1.EndpointEvent
	sweep := false
	echoes := 0
	for _, e := range b.Events {
		s.noteEndpoint(e.ID, e.Revision)
		s.noteWatched(e)
		s.observe(e.Endpoint)
		if e.Revision <= s.backendRv || s.guarded(e.ID, e.Revision) {
			continue
		}
		switch s.peerReport(e) {
		case peerEcho:
			echoes++
			if ev := s.applyEcho(e); ev != nil {
				evs = append(evs, ev)
			}
			continue
		case peerStale:
			continue
		}
		if e.Endpoint == nil {
			if st := s.Get(e.ID).GetStamp(); st != nil {
				s.peerFloor[e.ID] = st
			}
		}
		if ev := s.setAt(e.ID, e.Endpoint, e.Revision); ev != nil {
			evs = append(evs, ev)
		}
	}
	for _, n := range b.Nodes {
		sweep = sweep || n.Node == nil
		s.noteNode(n.ID, n.Revision)
		if n.Revision <= s.backendRv || s.nodeFlushed[n.ID] > n.Revision {
			continue
		}
		s.setNode(n.ID, n.Node, n.Revision)
	}
	s.advance(b.Revision)
	return Effects{Events: evs, Sweep: sweep, Echoes: echoes}
}

// setNode stores or removes (n == nil) a node record written at rev (0:
// not known).
func (s *State) setNode(id registry.NodeID, n *registryv1.Node, rev int64) {
	delete(s.nodeRev, id)
	if n == nil {
		delete(s.nodes, id)
		return
	}
	s.nodes[id] = n
	if rev > 0 {
		s.nodeRev[id] = rev
	}
}

// NodePut records a node record we wrote at rev.
func (s *State) NodePut(n *registryv1.Node, rev int64) {
	id := registry.NodeIDOf(n)
	s.setNode(id, n, rev)
	if rev > s.backendRv {
		s.nodeFlushed[id] = rev
	}
}

// NodeGone records a node record we deleted (revoked) at rev; its
// endpoints are now ghosts, so it asks for a sweep.
func (s *State) NodeGone(id registry.NodeID, rev int64) Effects {
	s.setNode(id, nil, 0)
	if rev > s.backendRv {
		s.nodeFlushed[id] = rev
	}
	return Effects{Sweep: true}
}

// ghostsIn returns, among the given services, the endpoints of (region,
// cluster) whose node has no record and that were registered more than
// grace ago: their node's lease lapsed
// (or the node never announced). The grace keeps a registration that races
// its node's announcement, or a node re-announcing after a lapse, from
// being swept. Endpoints without a node are static and never swept; other
// clusters' and regions' endpoints are never considered.
func (s *State) ghostsIn(services []string, region, cluster string, now time.Time, grace time.Duration) []registry.EndpointID {
	var out []registry.EndpointID
	for _, svc := range services {
		for id, ep := range s.endpoints[svc] {
			if id.Region != region || id.Cluster != cluster || ep.Node == "" {
				continue
			}
			if _, ok := s.nodes[registry.NodeID{Region: region, Cluster: cluster, Name: ep.Node}]; ok {
				continue
			}
			if now.Sub(ep.GetCreatedAt().AsTime()) < grace {
				continue
			}
			out = append(out, id)
		}
	}
	return out
}

// advance records that the snapshot reflects the backend up to rev and
// forgets flush revisions the backend has caught up with.
func (s *State) advance(rev int64) {
	if rev <= s.backendRv {
		return
	}
	s.backendRv = rev
	for id, r := range s.flushed {
		if r <= rev {
			delete(s.flushed, id)
		}
	}
	for id, r := range s.nodeFlushed {
		if r <= rev {
			delete(s.nodeFlushed, id)
		}
	}
}

// TakeBatch hands up to max writes to the flusher, each with the backend
// revisions of its key as last seen (the ordered flush's guesses).
func (s *State) TakeBatch(max int, now time.Time) []backend.Mutation {
	b := s.queue.take(max, now)
	for i := range b {
		base := s.base[b[i].ID]
		b[i].KeyRev, b[i].TombRev = base.key, base.tomb
	}
	return b
}

// BatchSettled records what became of each write of a flushed batch
// (backend.Store.ApplyOrdered's outcomes) and returns the events it caused:
//
//   - Landed: where no newer local write is waiting, the stored value is
//     the one that landed (the watch cannot have changed it while the
//     write was held).
//   - Superseded: the backend holds a write of the key stamped after
//     ours, from another replica; the snapshot takes it, unless a newer
//     local write is waiting (which will be ordered in its turn).
//   - Refused permanently: isolated (writeQueue.isolate).
//   - Not settled: back to pending.
func (s *State) BatchSettled(b []backend.Mutation, outs []backend.Outcome, now time.Time) Effects {
	var evs []*registrarv1.EndpointEvent
	for i, m := range b {
		o := outs[i]
		switch {
		case o.Landed:
			if o.Revision > s.backendRv {
				s.flushed[m.ID] = o.Revision
			}
			s.noteBase(m.ID, o.KeyRev, o.TombRev, o.Revision)
			s.queue.done(m.ID)
			if m.Endpoint != nil && !s.queue.holds(m.ID) && s.Get(m.ID) == m.Endpoint {
				s.epRev[m.ID] = o.Revision
			}
		case o.Superseded:
			at := max(o.KeyRev, o.TombRev)
			s.noteBase(m.ID, o.KeyRev, o.TombRev, at)
			if st := o.CurrentStamp; st != nil {
				s.clock.Observe(st.GetHlc())
			}
			s.queue.done(m.ID)
			if s.queue.holds(m.ID) {
				continue
			}
			// The backend's value is as of revision at; older reports of
			// the key (a watch lagging behind) must not undo it.
			if at > s.backendRv {
				s.flushed[m.ID] = at
			}
			if ev := s.setAt(m.ID, o.Current, o.KeyRev); ev != nil {
				evs = append(evs, ev)
			}
		case o.Err != nil:
			s.queue.isolate(m.ID, o.Err.Error(), now)
		default:
			// The revisions it read are the latest known: guess them next.
			if o.KeyRev == 0 && o.TombRev == 0 {
				delete(s.base, m.ID)
			} else {
				s.base[m.ID] = baseRev{key: o.KeyRev, tomb: o.TombRev, seen: s.base[m.ID].seen}
			}
			s.queue.failed(m.ID)
		}
	}
	return Effects{Events: evs}
}

// BatchFailed returns a batch to the queue; writes made since take priority.
func (s *State) BatchFailed(b []backend.Mutation) {
	for _, m := range b {
		s.queue.failed(m.ID)
	}
}

// Snapshot returns the endpoints that match f, and the sequence they are
// current as of.
func (s *State) Snapshot(f Filter) ([]*registryv1.ServiceEndpoint, uint64) {
	var out []*registryv1.ServiceEndpoint
	add := func(m map[registry.EndpointID]*registryv1.ServiceEndpoint) {
		for _, ep := range m {
			out = append(out, ep)
		}
	}
	if f.All() {
		out = make([]*registryv1.ServiceEndpoint, 0, s.Len())
		for _, m := range s.endpoints {
			add(m)
		}
	} else {
		for svc := range f {
			add(s.endpoints[svc])
		}
	}
	return out, s.seq
}

// Since returns the retained events after seq that match f; ok is false when
// seq is outside the retention window.
func (s *State) Since(seq uint64, f Filter) ([]*registrarv1.EndpointEvent, bool) {
	all, ok := s.hist.since(seq, s.seq)
	if !ok || f.All() {
		return all, ok
	}
	out := all[:0:0]
	for _, ev := range all {
		if f.Matches(ev.GetEndpoint().GetService()) {
			out = append(out, ev)
		}
	}
	return out, true
}
