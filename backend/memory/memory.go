// Package memory is an in-memory model of a backend.Full: a map of keys to
// their histories, one revision counter, the history of changes for Watch
// and compaction, and leases expired by an injected clock. It is a second
// implementation of the contract in package backend, checked by the same
// conformance suite (backend/backendtest) as the etcd backend, so that the
// suite states the contract rather than one store's habits, and so that
// tests of a consumer can run on a store whose every step they control.
//
// It decides each write in one step under one lock, so it never needs the
// caller's revision guesses (Mutation.KeyRev and TombRev): it reports the
// revisions it holds, as the contract asks, and ignores the guesses. It
// keeps tombstones for as long as it lives, which is the strict end of
// what the contract allows. Nothing is persisted.
package memory

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/registry"
)

// ErrInvalidMutation marks a mutation refused before anything was written.
var ErrInvalidMutation = backend.ErrInvalidMutation

// Options configure a Backend.
type Options struct {
	// Now is the clock leases run out by (default time.Now). A test that
	// injects one moves time with it and calls Expire, or any other
	// method, to let the leases that ran out lapse.
	Now func() time.Time
}

// Backend is the model store. Its methods are safe for concurrent use.
type Backend struct {
	now func() time.Time

	mu        sync.Mutex
	rev       int64 // the current revision; 1 when empty, as a new etcd
	compacted int64 // revisions below it are forgotten (0: none)
	eps       map[string]*history[*registryv1.ServiceEndpoint]
	nodes     map[string]*history[*registryv1.Node]
	tombs     map[string]tombstone
	leases    map[int64]*lease
	lastLease int64
	members   map[string]memberRec // by members prefix + epoch
	changes   []backend.WatchBatch // one per revision that changed a key under registry.Root
	changed   chan struct{}        // closed, and replaced, at every commit
}

type write[V any] struct {
	rev   int64
	v     V     // zero: deleted
	lease int64 // the lease a node record is attached to
}

// history is one key's writes, oldest first.
type history[V any] struct {
	id     any // registry.EndpointID or registry.NodeID
	writes []write[V]
}

// at is the write in force at rev (ok false: absent).
func (h *history[V]) at(rev int64) (write[V], bool) {
	for i := len(h.writes) - 1; i >= 0; i-- {
		if w := h.writes[i]; w.rev <= rev {
			return w, w.rev != 0 && !isZero(w.v)
		}
	}
	return write[V]{}, false
}

func isZero[V any](v V) bool {
	switch x := any(v).(type) {
	case *registryv1.ServiceEndpoint:
		return x == nil
	case *registryv1.Node:
		return x == nil
	}
	return false
}

type tombstone struct {
	stamp *registryv1.WriteStamp
	rev   int64
}

type lease struct {
	ttl     time.Duration
	expires time.Time
}

// New returns an empty Backend at revision 1.
func New(opts Options) *Backend {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Backend{
		now:     opts.Now,
		rev:     1,
		eps:     make(map[string]*history[*registryv1.ServiceEndpoint]),
		nodes:   make(map[string]*history[*registryv1.Node]),
		tombs:   make(map[string]tombstone),
		leases:  make(map[int64]*lease),
		members: make(map[string]memberRec),
		changed: make(chan struct{}),
	}
}

var _ backend.Full = (*Backend)(nil)

// Revision is the current revision.
func (b *Backend) Revision() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.rev
}

// commit ends a write: a new revision, and the change for watchers. It is
// called only for writes that change something.
func (b *Backend) commit(batch backend.WatchBatch) int64 {
	b.rev++
	if len(batch.Events)+len(batch.Nodes) > 0 {
		batch.Revision = b.rev
		b.changes = append(b.changes, batch)
	}
	close(b.changed)
	b.changed = make(chan struct{})
	return b.rev
}

func cloneEP(ep *registryv1.ServiceEndpoint) *registryv1.ServiceEndpoint {
	if ep == nil {
		return nil
	}
	return proto.Clone(ep).(*registryv1.ServiceEndpoint)
}

func cloneNode(n *registryv1.Node) *registryv1.Node {
	if n == nil {
		return nil
	}
	return proto.Clone(n).(*registryv1.Node)
}

func cloneStamp(s *registryv1.WriteStamp) *registryv1.WriteStamp {
	if s == nil {
		return nil
	}
	return proto.Clone(s).(*registryv1.WriteStamp)
}

// ApplyOrdered writes, per key, the newest stamp (backend.Store). All the
// mutations of one call that land share one revision.
func (b *Backend) ApplyOrdered(ctx context.Context, muts []backend.Mutation) ([]backend.Outcome, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ps, outs, err := backend.Prepare(muts)
	if err != nil {
		return nil, err
	}
	keys := make([]string, len(muts))
	for i := range ps {
		keys[i] = ps[i].Key
	}

	b.mu.Lock()
	defer b.mu.Unlock()
	b.expireLocked()
	rev := b.rev + 1 // the revision of this call's writes, if any lands
	var batch backend.WatchBatch
	landed := false
	for i, m := range muts {
		if outs[i].Err != nil {
			continue
		}
		key, stamp := keys[i], m.StampOf()
		h := b.eps[key]
		var cur *registryv1.ServiceEndpoint
		var curStamp *registryv1.WriteStamp
		var keyRev int64
		if h != nil {
			if w, ok := h.at(b.rev); ok {
				cur, curStamp, keyRev = w.v, w.v.GetStamp(), w.rev
			}
		}
		tomb := b.tombs[key]
		if cur == nil && tomb.rev != 0 {
			curStamp = tomb.stamp
		}
		o := &outs[i]
		o.KeyRev, o.TombRev = keyRev, tomb.rev
		if registry.CompareStamps(stamp, curStamp) <= 0 {
			o.Superseded, o.Current, o.CurrentStamp = true, cloneEP(cur), cloneStamp(curStamp)
			continue
		}
		landed = true
		o.Landed, o.Revision = true, rev
		if h == nil {
			h = &history[*registryv1.ServiceEndpoint]{id: m.ID}
			b.eps[key] = h
		}
		if m.Endpoint != nil {
			h.writes = append(h.writes, write[*registryv1.ServiceEndpoint]{rev: rev, v: cloneEP(m.Endpoint)})
			o.KeyRev = rev
			batch.Events = append(batch.Events, backend.Event{ID: m.ID, Endpoint: cloneEP(m.Endpoint), Revision: rev})
			continue
		}
		b.tombs[key] = tombstone{stamp: cloneStamp(stamp), rev: rev}
		o.KeyRev, o.TombRev = 0, rev
		if cur != nil { // deleting what is absent changes no endpoint
			h.writes = append(h.writes, write[*registryv1.ServiceEndpoint]{rev: rev})
			batch.Events = append(batch.Events, backend.Event{ID: m.ID, Revision: rev})
		}
	}
	if landed {
		b.commit(batch)
	}
	return outs, nil
}

// List returns the registry at the current revision.
func (b *Backend) List(ctx context.Context) (backend.Listing, error) {
	if err := ctx.Err(); err != nil {
		return backend.Listing{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.expireLocked()
	l := backend.Listing{Revision: b.rev}
	for _, k := range sortedKeys(b.eps) {
		if w, ok := b.eps[k].at(b.rev); ok {
			l.Endpoints = append(l.Endpoints, cloneEP(w.v))
			l.EndpointRevs = append(l.EndpointRevs, w.rev)
		}
	}
	for _, k := range sortedKeys(b.nodes) {
		if w, ok := b.nodes[k].at(b.rev); ok {
			l.Nodes = append(l.Nodes, cloneNode(w.v))
			l.NodeRevs = append(l.NodeRevs, w.rev)
		}
	}
	return l, nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// GetEndpoint reads one endpoint as held now.
func (b *Backend) GetEndpoint(ctx context.Context, id registry.EndpointID) (*registryv1.ServiceEndpoint, int64, int64, error) {
	key, err := id.Key()
	if err != nil {
		return nil, 0, 0, err
	}
	if err := ctx.Err(); err != nil {
		return nil, 0, 0, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.expireLocked()
	if h := b.eps[key]; h != nil {
		if w, ok := h.at(b.rev); ok {
			return cloneEP(w.v), w.rev, b.rev, nil
		}
	}
	return nil, 0, b.rev, nil
}

// GetAt reads values as they were at rev.
func (b *Backend) GetAt(ctx context.Context, rev int64, eps []registry.EndpointID, nodes []registry.NodeID) (backend.Listing, error) {
	if rev <= 0 {
		return backend.Listing{}, fmt.Errorf("read at revision %d: a revision must be positive", rev)
	}
	if err := ctx.Err(); err != nil {
		return backend.Listing{}, err
	}
	l := backend.Listing{Revision: rev}
	if len(eps)+len(nodes) == 0 {
		return l, nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.expireLocked()
	if rev < b.compacted {
		return backend.Listing{}, fmt.Errorf("read at revision %d (compacted up to %d): %w", rev, b.compacted, backend.ErrCompacted)
	}
	if rev > b.rev {
		return backend.Listing{}, fmt.Errorf("read at revision %d: the store is at %d", rev, b.rev)
	}
	for _, id := range eps {
		k, err := id.Key()
		if err != nil {
			return backend.Listing{}, fmt.Errorf("endpoint %s: %w", id, err)
		}
		if h := b.eps[k]; h != nil {
			if w, ok := h.at(rev); ok {
				l.Endpoints = append(l.Endpoints, cloneEP(w.v))
				l.EndpointRevs = append(l.EndpointRevs, w.rev)
			}
		}
	}
	for _, id := range nodes {
		k, err := id.Key()
		if err != nil {
			return backend.Listing{}, fmt.Errorf("node %s: %w", id, err)
		}
		if h := b.nodes[k]; h != nil {
			if w, ok := h.at(rev); ok {
				l.Nodes = append(l.Nodes, cloneNode(w.v))
				l.NodeRevs = append(l.NodeRevs, w.rev)
			}
		}
	}
	return l, nil
}

// ListRevisionsInParts returns the keys and mod revisions at the current
// revision; p.Between runs between the parts as it would between reads.
func (b *Backend) ListRevisionsInParts(ctx context.Context, p backend.Parts) (backend.KeyRevisions, error) {
	if err := ctx.Err(); err != nil {
		return backend.KeyRevisions{}, err
	}
	b.mu.Lock()
	b.expireLocked()
	kr := backend.KeyRevisions{Revision: b.rev}
	for _, k := range sortedKeys(b.eps) {
		h := b.eps[k]
		if w, ok := h.at(b.rev); ok {
			kr.Endpoints = append(kr.Endpoints, backend.EndpointRevision{ID: h.id.(registry.EndpointID), ModRevision: w.rev})
		}
	}
	for _, k := range sortedKeys(b.nodes) {
		h := b.nodes[k]
		if w, ok := h.at(b.rev); ok {
			kr.Nodes = append(kr.Nodes, backend.NodeRevision{ID: h.id.(registry.NodeID), ModRevision: w.rev})
		}
	}
	b.mu.Unlock()
	// The snapshot was taken whole, at one revision; the parts only pace
	// the caller, who may rely on Between running between them.
	for range len(p.Ranges()) - 1 {
		if p.Between == nil {
			break
		}
		if err := p.Between(ctx); err != nil {
			return backend.KeyRevisions{}, err
		}
	}
	return kr, nil
}

// Watch streams the changes after afterRev (backend.Watcher).
func (b *Backend) Watch(ctx context.Context, afterRev int64) <-chan backend.WatchBatch {
	out := make(chan backend.WatchBatch)
	go b.watch(ctx, afterRev, out)
	return out
}

func (b *Backend) watch(ctx context.Context, last int64, out chan<- backend.WatchBatch) {
	defer close(out)
	for {
		b.mu.Lock()
		if last+1 < b.compacted {
			b.mu.Unlock()
			select {
			case out <- backend.WatchBatch{Revision: last, Compacted: true}:
			case <-ctx.Done():
			}
			return
		}
		i := sort.Search(len(b.changes), func(i int) bool { return b.changes[i].Revision > last })
		pending := append([]backend.WatchBatch(nil), b.changes[i:]...)
		wake := b.changed
		b.mu.Unlock()
		for _, c := range pending {
			select {
			case out <- copyBatch(c):
				last = c.Revision
			case <-ctx.Done():
				return
			}
		}
		if len(pending) > 0 {
			continue
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return
		}
	}
}

// copyBatch gives each watcher values of its own.
func copyBatch(c backend.WatchBatch) backend.WatchBatch {
	out := backend.WatchBatch{Revision: c.Revision}
	for _, e := range c.Events {
		out.Events = append(out.Events, backend.Event{ID: e.ID, Endpoint: cloneEP(e.Endpoint), Revision: e.Revision})
	}
	for _, n := range c.Nodes {
		out.Nodes = append(out.Nodes, backend.NodeEvent{ID: n.ID, Node: cloneNode(n.Node), Revision: n.Revision})
	}
	return out
}

// Compact forgets the history before rev: reads at and watches from
// earlier revisions then fail with backend.ErrCompacted, as etcd's
// compaction at rev makes them.
func (b *Backend) Compact(rev int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case rev > b.rev:
		return fmt.Errorf("compact at %d: the store is at %d", rev, b.rev)
	case rev <= b.compacted:
		return fmt.Errorf("compact at %d (compacted up to %d): %w", rev, b.compacted, backend.ErrCompacted)
	}
	b.compacted = rev
	i := sort.Search(len(b.changes), func(i int) bool { return b.changes[i].Revision >= rev })
	b.changes = append([]backend.WatchBatch(nil), b.changes[i:]...)
	return nil
}

// Expire lets every lease whose TTL has run out by the clock lapse now,
// deleting its node records; the other methods do the same first.
func (b *Backend) Expire() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.expireLocked()
}

func (b *Backend) expireLocked() {
	now := b.now()
	var ids []int64
	for id, l := range b.leases {
		if !now.Before(l.expires) {
			ids = append(ids, id)
		}
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		b.revokeLocked(id)
	}
}

// revokeLocked ends a lease and deletes its node records in one revision
// (0 when it held none).
func (b *Backend) revokeLocked(id int64) int64 {
	delete(b.leases, id)
	for k, m := range b.members {
		if m.lease == id {
			delete(b.members, k) // outside the registry: no revision, no event
		}
	}
	var batch backend.WatchBatch
	for _, k := range sortedKeys(b.nodes) {
		h := b.nodes[k]
		if w, ok := h.at(b.rev); ok && w.lease == id {
			h.writes = append(h.writes, write[*registryv1.Node]{rev: b.rev + 1})
			batch.Nodes = append(batch.Nodes, backend.NodeEvent{ID: h.id.(registry.NodeID), Revision: b.rev + 1})
		}
	}
	if len(batch.Nodes) == 0 {
		return 0
	}
	return b.commit(batch)
}

// GrantLease creates a lease of ttl rounded up to whole seconds (at least
// one), as etcd grants them.
func (b *Backend) GrantLease(ctx context.Context, ttl time.Duration) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	ttl = max((ttl+time.Second-1)/time.Second, 1) * time.Second
	b.mu.Lock()
	defer b.mu.Unlock()
	b.expireLocked()
	b.lastLease++
	b.leases[b.lastLease] = &lease{ttl: ttl, expires: b.now().Add(ttl)}
	return b.lastLease, nil
}

func (b *Backend) liveLease(id int64) (*lease, error) {
	b.expireLocked()
	l := b.leases[id]
	if l == nil {
		return nil, fmt.Errorf("lease %x: %w", id, backend.ErrLeaseNotFound)
	}
	return l, nil
}

// KeepAliveOnce renews a lease for its TTL.
func (b *Backend) KeepAliveOnce(ctx context.Context, id int64) (time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	l, err := b.liveLease(id)
	if err != nil {
		return 0, err
	}
	l.expires = b.now().Add(l.ttl)
	return l.ttl, nil
}

// LeaseTTL reports a lease's remaining and granted TTL.
func (b *Backend) LeaseTTL(ctx context.Context, id int64) (time.Duration, time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return 0, 0, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	l, err := b.liveLease(id)
	if err != nil {
		return 0, 0, err
	}
	return l.expires.Sub(b.now()), l.ttl, nil
}

// RevokeLease ends a lease now with its node records.
func (b *Backend) RevokeLease(ctx context.Context, id int64) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.expireLocked()
	if b.leases[id] == nil {
		return 0, nil
	}
	if rev := b.revokeLocked(id); rev != 0 {
		return rev, nil
	}
	return b.rev, nil
}

// PutNode writes a node record under a live lease.
func (b *Backend) PutNode(ctx context.Context, n *registryv1.Node, id int64) (int64, error) {
	nid := registry.NodeIDOf(n)
	key, err := nid.Key()
	if err != nil {
		return 0, fmt.Errorf("node record: %w", err)
	}
	if _, err := registry.EncodeNode(n); err != nil {
		return 0, fmt.Errorf("encode %s: %w", key, err)
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, err := b.liveLease(id); err != nil {
		return 0, fmt.Errorf("put %s: %w", key, err)
	}
	h := b.nodes[key]
	if h == nil {
		h = &history[*registryv1.Node]{id: nid}
		b.nodes[key] = h
	}
	rev := b.rev + 1
	h.writes = append(h.writes, write[*registryv1.Node]{rev: rev, v: cloneNode(n), lease: id})
	return b.commit(backend.WatchBatch{Nodes: []backend.NodeEvent{{ID: nid, Node: cloneNode(n), Revision: rev}}}), nil
}

// memberRec is a member record and the lease it lives under.
type memberRec struct {
	m     backend.Member
	lease int64
}

var _ backend.Members = (*Backend)(nil)

// PutMember writes a member record under a live lease; it goes with the
// lease, and, being outside registry.Root, moves no revision.
func (b *Backend) PutMember(ctx context.Context, region, cluster string, m backend.Member, id int64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if m.Epoch == "" {
		return fmt.Errorf("member record without an epoch")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, err := b.liveLease(id); err != nil {
		return fmt.Errorf("put member %s: %w", m.Epoch, err)
	}
	b.members[backend.MembersPrefix(region, cluster)+m.Epoch] = memberRec{m: m, lease: id}
	return nil
}

// ListMembers returns the live member records of (region, cluster), in
// epoch order.
func (b *Backend) ListMembers(ctx context.Context, region, cluster string) ([]backend.Member, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.expireLocked()
	prefix := backend.MembersPrefix(region, cluster)
	var out []backend.Member
	for k, m := range b.members {
		if strings.HasPrefix(k, prefix) {
			out = append(out, m.m)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Epoch < out[j].Epoch })
	return out, nil
}
