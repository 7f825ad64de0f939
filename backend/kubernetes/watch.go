package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"

	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/registry"
)

// The change feed.
//
// Watch is an informer's list+watch without the list: a watch of each
// resource (AetherEndpoints, AetherNodes) from afterRev with bookmarks,
// re-established from the last resourceVersion it delivered whenever the
// API server ends it (its own timeout, a dropped connection), until a 410
// Gone says the revision it would resume from is compacted away.
//
// Two resources are two streams, each in resourceVersion order but not
// ordered against each other, while the contract's feed is one: a batch's
// Revision promises that every change up to it has been delivered, of
// either kind. So an event is held until both streams are known to have
// reached its revision, and the stream that is idle is made to report how
// far it has come by a write of its own: a fence, one small object per
// Store and resource (label aether.dev/fence), rewritten when the other
// stream holds events it has not caught up with. Its resourceVersion is
// later than every event held (it was written after they were seen), so
// once the idle stream delivers the fence, the held events go out. A
// fence costs one write, at most every minFenceGap per stream, and only
// while one kind changes and the other does not; the API server's own
// bookmarks (about once a minute) would bound the hold too, but far too
// late for propagation. Other replicas' fences advance this feed as well.

// minFenceGap spaces one stream's fences, so that a steady flow of one kind
// costs at most this many fence writes a second per watch rather than one
// per event; it is also the most a held event waits beyond the fence's
// round trip.
const minFenceGap = 20 * time.Millisecond

// watchRetry is the first pause before re-establishing a failed watch; it
// doubles to maxWatchRetry.
const (
	watchRetry    = 100 * time.Millisecond
	maxWatchRetry = 5 * time.Second
)

// maxHeld bounds the events a watch holds for a consumer that has not
// read them yet.
const maxHeld = 10000

// annotationFencedAt dates a fence's last write, so that collection can
// tell the fences of replicas that are gone.
const annotationFencedAt = "aether.dev/fenced-at"

const (
	streamEndpoints = iota
	streamNodes
	nStreams
)

// item is what a stream reports: progress to rev, maybe with a change.
type item struct {
	stream    int
	rev       int64
	ev        *backend.Event
	node      *backend.NodeEvent
	compacted bool
}

// Watch streams the changes after afterRev (backend.Watcher).
func (s *Store) Watch(ctx context.Context, afterRev int64) <-chan backend.WatchBatch {
	out := make(chan backend.WatchBatch)
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	if s.closed {
		close(out)
		return out
	}
	s.watches.Add(1)
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.base, cancel)
	go func() {
		defer s.watches.Done()
		defer cancel()
		defer stop()
		s.watch(ctx, afterRev, out)
	}()
	return out
}

func (s *Store) watch(ctx context.Context, after int64, out chan<- backend.WatchBatch) {
	defer close(out)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	send := func(b backend.WatchBatch) bool {
		select {
		case out <- b:
			return true
		case <-ctx.Done():
			return false
		}
	}
	if after <= 0 {
		// No revision of the API server is 0: there is no history to
		// replay from it, as after a compaction; list first.
		send(backend.WatchBatch{Revision: after, Compacted: true})
		return
	}
	compacted, err := s.compactedAt(ctx, after)
	for err != nil {
		// Cannot tell yet; the watch itself would fail the same way.
		s.log.Warn("watch: checking the start revision", "after", after, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(watchRetry):
		}
		compacted, err = s.compactedAt(ctx, after)
	}
	if compacted {
		send(backend.WatchBatch{Revision: after, Compacted: true})
		return
	}

	items := make(chan item)
	done := make(chan struct{})
	streams := [nStreams]dynamic.ResourceInterface{s.eps, s.nodes}
	running := nStreams
	for i, r := range streams {
		go func() {
			defer func() { done <- struct{}{} }()
			s.stream(ctx, i, r, after, items)
		}()
	}
	defer func() {
		cancel()
		for running > 0 {
			select {
			case <-items:
			case <-done:
				running--
			}
		}
	}()

	var (
		prog      [nStreams]int64
		pendEv    []backend.Event     // endpoint events held, in revision order
		pendNode  []backend.NodeEvent // node events held, in revision order
		delivered = after
		ready     *backend.WatchBatch
		fencing   [nStreams]bool
		lastFence [nStreams]time.Time
		fenceDone = make(chan int, nStreams)
		fenceWake *time.Timer
	)
	for i := range prog {
		prog[i] = after
	}
	defer func() {
		if fenceWake != nil {
			fenceWake.Stop()
		}
		for i := range fencing {
			if fencing[i] {
				<-fenceDone
			}
		}
	}()
	for {
		safe := min(prog[streamEndpoints], prog[streamNodes])
		// Move what both streams have passed into the batch to send.
		var evs []backend.Event
		var nodes []backend.NodeEvent
		for len(pendEv) > 0 && pendEv[0].Revision <= safe {
			evs, pendEv = append(evs, pendEv[0]), pendEv[1:]
		}
		for len(pendNode) > 0 && pendNode[0].Revision <= safe {
			nodes, pendNode = append(nodes, pendNode[0]), pendNode[1:]
		}
		if len(evs)+len(nodes) > 0 || (safe > delivered && (ready == nil || safe > ready.Revision)) {
			if ready == nil {
				ready = &backend.WatchBatch{}
			}
			ready.Events = append(ready.Events, evs...)
			ready.Nodes = append(ready.Nodes, nodes...)
			ready.Revision = safe
		}
		// Fence the stream that holds the other back.
		var wake <-chan time.Time
		for st := range nStreams {
			other := 1 - st
			var oldest int64
			if other == streamEndpoints && len(pendEv) > 0 {
				oldest = pendEv[0].Revision
			} else if other == streamNodes && len(pendNode) > 0 {
				oldest = pendNode[0].Revision
			}
			if oldest == 0 || prog[st] >= oldest || fencing[st] {
				continue
			}
			if gap := time.Since(lastFence[st]); gap < minFenceGap {
				if fenceWake == nil {
					fenceWake = time.NewTimer(minFenceGap - gap)
				} else {
					fenceWake.Reset(minFenceGap - gap)
				}
				wake = fenceWake.C
				continue
			}
			fencing[st], lastFence[st] = true, time.Now()
			go func() {
				if _, err := s.fence(ctx, st); err != nil && ctx.Err() == nil {
					s.log.Warn("watch: writing a fence", "err", err)
				}
				fenceDone <- st
			}()
		}
		var outc chan<- backend.WatchBatch
		var next backend.WatchBatch
		itemsC := items
		if ready != nil {
			outc, next = out, *ready
			if len(ready.Events)+len(ready.Nodes)+len(pendEv)+len(pendNode) >= maxHeld {
				// The consumer is behind: stop reading the streams, so
				// the API server's watch backs up rather than this
				// process's memory.
				itemsC = nil
			}
		}
		select {
		case <-ctx.Done():
			return
		case it := <-itemsC:
			if it.compacted {
				send(backend.WatchBatch{Revision: delivered, Compacted: true})
				return
			}
			if it.rev > prog[it.stream] {
				prog[it.stream] = it.rev
			}
			if it.ev != nil && it.ev.Revision > delivered {
				pendEv = append(pendEv, *it.ev)
			}
			if it.node != nil && it.node.Revision > delivered {
				pendNode = append(pendNode, *it.node)
			}
		case outc <- next:
			delivered, ready = next.Revision, nil
		case st := <-fenceDone:
			fencing[st] = false
		case <-wake:
		}
	}
}

// compactedAt reports whether rev has been compacted away, by reading one
// object at exactly rev. The watch cache would serve a watch from its own
// history even after etcd compacted it, but the contract promises a
// watch from a compacted revision fails like a read at it.
func (s *Store) compactedAt(ctx context.Context, rev int64) (bool, error) {
	if err := s.acquire(ctx); err != nil {
		return false, err
	}
	defer s.release()
	_, err := s.eps.List(ctx, metav1.ListOptions{Limit: 1, ResourceVersion: formatRV(rev), ResourceVersionMatch: metav1.ResourceVersionMatchExact})
	switch {
	case err == nil:
		return false, nil
	case apierrors.IsResourceExpired(err) || apierrors.IsGone(err):
		return true, nil
	}
	return false, classify(err)
}

// stream watches one resource from rev on, re-establishing the watch from
// the last resourceVersion it saw, and reports to items until ctx ends or
// the API server says the revision is gone.
func (s *Store) stream(ctx context.Context, st int, r dynamic.ResourceInterface, rev int64, items chan<- item) {
	report := func(it item) bool {
		it.stream = st
		select {
		case items <- it:
			return true
		case <-ctx.Done():
			return false
		}
	}
	retry := watchRetry
	for first := true; ctx.Err() == nil; first = false {
		if !first {
			// Resuming after a break: the watch cache may still hold
			// history that etcd has compacted, and would serve it; the
			// feed reports the compaction instead, as it does when asked
			// to start there, so that a consumer behaves the same however
			// long its watch was down. (watch checked the start.)
			compacted, err := s.compactedAt(ctx, rev)
			if compacted {
				report(item{compacted: true})
				return
			}
			if err != nil {
				s.log.Warn("watch: checking the resume revision", "resource", streamName(st), "from", rev, "err", err)
				select {
				case <-ctx.Done():
					return
				case <-time.After(retry):
				}
				retry = min(2*retry, maxWatchRetry)
				continue
			}
		}
		w, err := r.Watch(ctx, metav1.ListOptions{ResourceVersion: formatRV(rev), AllowWatchBookmarks: true})
		if err != nil {
			if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
				report(item{compacted: true})
				return
			}
			s.log.Warn("watch: establishing", "resource", streamName(st), "from", rev, "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(retry):
			}
			retry = min(2*retry, maxWatchRetry)
			continue
		}
		gone, progressed := s.drain(ctx, st, w, &rev, report)
		w.Stop()
		if gone {
			report(item{compacted: true})
			return
		}
		if progressed {
			retry = watchRetry
			continue
		}
		// Ended without bringing anything: do not spin on a server
		// that keeps refusing.
		select {
		case <-ctx.Done():
			return
		case <-time.After(retry):
		}
		retry = min(2*retry, maxWatchRetry)
	}
}

// drain reads one watch until it ends. It reports whether the API server
// ended it with 410 Gone, and whether anything came.
func (s *Store) drain(ctx context.Context, st int, w watch.Interface, rev *int64, report func(item) bool) (gone, progressed bool) {
	for {
		var ev watch.Event
		var ok bool
		select {
		case <-ctx.Done():
			return false, progressed
		case ev, ok = <-w.ResultChan():
		}
		if !ok {
			return false, progressed
		}
		if ev.Type == watch.Error {
			err := apierrors.FromObject(ev.Object)
			if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
				return true, progressed
			}
			s.log.Warn("watch: the API server ended the watch", "resource", streamName(st), "from", *rev, "err", err)
			return false, progressed
		}
		u, isU := ev.Object.(*unstructured.Unstructured)
		if !isU {
			s.log.Warn("watch: unexpected object", "resource", streamName(st), "type", fmt.Sprintf("%T", ev.Object))
			continue
		}
		r, err := parseRV(u.GetResourceVersion())
		if err != nil {
			s.log.Warn("watch: event without a usable resource version", "resource", streamName(st), "err", err)
			continue
		}
		if r <= *rev {
			continue // a bookmark that brings nothing new
		}
		it := item{rev: r}
		if ev.Type != watch.Bookmark {
			if st == streamEndpoints {
				it.ev = endpointEvent(s, ev.Type, u, r)
			} else {
				it.node = nodeEvent(s, ev.Type, u, r)
			}
		}
		if !report(it) {
			return false, progressed
		}
		*rev, progressed = r, true
	}
}

func streamName(st int) string {
	if st == streamEndpoints {
		return EndpointsResource.Resource
	}
	return NodesResource.Resource
}

// endpointEvent is what a change of an AetherEndpoint is to the registry:
// a put of a live endpoint, a delete when a live endpoint became a
// tombstone or was deleted outright, and nothing for fences, tombstones
// replacing tombstones or collected.
func endpointEvent(s *Store, t watch.EventType, u *unstructured.Unstructured, rev int64) *backend.Event {
	d := decodeEndpointObject(u)
	if d.fence {
		return nil
	}
	id, kerr := registry.ParseEndpointKey(d.key)
	if kerr != nil {
		s.log.Warn("watch: endpoint object without a usable key; ignored", "name", d.name, "err", kerr)
		return nil
	}
	switch {
	case d.tomb && (t == watch.Deleted || !d.deletedLive):
		return nil
	case t == watch.Deleted || d.tomb:
		return &backend.Event{ID: id, Revision: rev}
	case d.err != nil:
		s.log.Warn("watch: undecodable endpoint record; treating it as deleted", "key", d.key, "err", d.err)
		return &backend.Event{ID: id, Revision: rev}
	}
	return &backend.Event{ID: id, Endpoint: d.ep, Revision: rev}
}

// nodeEvent is what a change of an AetherNode is to the registry.
func nodeEvent(s *Store, t watch.EventType, u *unstructured.Unstructured, rev int64) *backend.NodeEvent {
	n, _, _, err := NodeOf(u)
	if errors.Is(err, errFence) {
		return nil
	}
	if err != nil || t == watch.Deleted {
		key, _, _ := unstructured.NestedString(u.Object, "spec", "key")
		id, kerr := registry.ParseNodeKey(key)
		if kerr != nil {
			s.log.Warn("watch: node object without a usable key; ignored", "name", u.GetName(), "err", kerr)
			return nil
		}
		if err != nil {
			s.log.Warn("watch: undecodable node record; treating it as deleted", "key", key, "err", err)
		}
		return &backend.NodeEvent{ID: id, Revision: rev}
	}
	return &backend.NodeEvent{ID: registry.NodeIDOf(n), Node: n, Revision: rev}
}

// fenceName is the name of this store's fence objects.
func (s *Store) fenceName() string { return "aether-fence-" + s.id }

// fence rewrites this store's fence object of stream st (server-side
// apply: created on first use) and returns its new resourceVersion.
func (s *Store) fence(ctx context.Context, st int) (int64, error) {
	r, kind := s.eps, "AetherEndpoint"
	if st == streamNodes {
		r, kind = s.nodes, "AetherNode"
	}
	s.fenceSeq.Add(1)
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": Group + "/" + Version,
		"kind":       kind,
		"metadata": map[string]any{
			"name":        s.fenceName(),
			"labels":      map[string]any{LabelManagedBy: managedBy, LabelFence: s.id},
			"annotations": map[string]any{annotationFencedAt: s.now().UTC().Format(time.RFC3339Nano)},
		},
		"spec": map[string]any{"fence": map[string]any{"writer": s.id, "seq": s.fenceSeq.Load()}},
	}}
	if err := s.acquire(ctx); err != nil {
		return 0, err
	}
	defer s.release()
	s.fenced[st].Store(true)
	got, err := r.Apply(ctx, s.fenceName(), obj, metav1.ApplyOptions{FieldManager: fieldManager, Force: true})
	if err != nil {
		return 0, fmt.Errorf("fence %s/%s: %w", s.ns, s.fenceName(), classify(err))
	}
	return parseRV(got.GetResourceVersion())
}

// dropFences deletes the fence objects this store wrote (best effort: what
// is left is collected once it is TombstoneTTL old).
func (s *Store) dropFences() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for st, r := range [nStreams]dynamic.ResourceInterface{s.eps, s.nodes} {
		if !s.fenced[st].Load() {
			continue
		}
		if err := r.Delete(ctx, s.fenceName(), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			s.log.Debug("removing a watch fence", "name", s.fenceName(), "err", err)
		}
	}
}
