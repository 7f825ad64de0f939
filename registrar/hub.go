package registrar

import (
	"sync"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
)

// hub fans events out to streams, demand-scoped: a stream that watches a few
// services is only ever handed events of those services. All methods are
// called with the Registrar's lock held, in the same critical section that
// assigned the events' sequence numbers, so every stream receives its events
// in sequence order and a stream added under the lock misses nothing.
//
// A stream's buffer is bounded. Delivery never blocks: a stream whose buffer
// is full is evicted (its evicted channel closes, reason ErrSlowConsumer)
// and must resume, so one slow consumer cannot stall the registrar or grow
// its memory. Shutdown and the subscriber's own Close end a watcher the same
// way (cut), with their own reason.
type hub struct {
	all   map[*watcher]struct{}
	bySvc map[string]map[*watcher]struct{}
	count int
	// onDeliver counts deliveries by event type (metrics), if set.
	onDeliver func(typ registrarv1.EndpointEvent_EventType, n int)
}

// watcher is one stream's end of the hub.
//
// Its buffer is a queue that grows as batches wait and shrinks to nothing
// when the stream catches up, not a buffered channel: a channel allocates
// its whole capacity up front, which at the default --watch-buffer of 4096
// is 96 KiB per stream, half a gigabyte for 5000 idle streams.
type watcher struct {
	f       filter
	limit   int           // batches that may wait before the stream is evicted
	ready   chan struct{} // holds a token while the queue may be non-empty
	evicted chan struct{} // closed by cut, after reason is set
	reason  error         // why the watcher was cut; read after evicted closes

	mu    sync.Mutex
	queue [][]*registrarv1.EndpointEvent

	// active is set when the watcher was handed anything since the last
	// progress tick; idle watchers get a bookmark. active and gone are
	// the hub's, under the Registrar's lock.
	active bool
	gone   bool
}

func newHub() *hub {
	return &hub{all: map[*watcher]struct{}{}, bySvc: map[string]map[*watcher]struct{}{}}
}

func newWatcher(f filter, buffer int) *watcher {
	return &watcher{f: f, limit: buffer, ready: make(chan struct{}, 1), evicted: make(chan struct{})}
}

// offer queues a batch, or reports false if limit batches already wait.
func (w *watcher) offer(batch []*registrarv1.EndpointEvent) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.queue) >= w.limit {
		return false
	}
	w.queue = append(w.queue, batch)
	select {
	case w.ready <- struct{}{}:
	default: // a token is already there
	}
	return true
}

// next takes the oldest waiting batch; false when none waits. The stream's
// sender calls it until false after each token from ready.
func (w *watcher) next() ([]*registrarv1.EndpointEvent, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.queue) == 0 {
		return nil, false
	}
	b := w.queue[0]
	w.queue[0] = nil
	w.queue = w.queue[1:]
	if len(w.queue) == 0 {
		w.queue = nil // caught up: let the backing array go
	}
	return b, true
}

func (h *hub) len() int { return h.count }

func (h *hub) add(w *watcher) {
	h.count++
	if w.f.all() {
		h.all[w] = struct{}{}
		return
	}
	for svc := range w.f {
		ws := h.bySvc[svc]
		if ws == nil {
			ws = map[*watcher]struct{}{}
			h.bySvc[svc] = ws
		}
		ws[w] = struct{}{}
	}
}

func (h *hub) remove(w *watcher) {
	if w.gone {
		return
	}
	w.gone = true
	h.count--
	if w.f.all() {
		delete(h.all, w)
		return
	}
	for svc := range w.f {
		if ws := h.bySvc[svc]; ws != nil {
			delete(ws, w)
			if len(ws) == 0 {
				delete(h.bySvc, svc)
			}
		}
	}
}

// cut removes a watcher for good and tells its subscriber why. A watcher
// is cut once: later cuts keep the first reason (an eviction stays an
// eviction when the subscriber then closes).
func (h *hub) cut(w *watcher, reason error) {
	select {
	case <-w.evicted:
		return
	default:
	}
	h.remove(w)
	w.reason = reason
	close(w.evicted)
}

// cutAll cuts every watcher, for shutdown.
func (h *hub) cutAll(reason error) {
	for w := range h.all {
		h.cut(w, reason)
	}
	for _, ws := range h.bySvc {
		for w := range ws {
			h.cut(w, reason) // removes w from ws: deleting during range is allowed
		}
	}
}

// send hands one batch to a watcher, evicting it if its buffer is full.
func (h *hub) send(w *watcher, batch []*registrarv1.EndpointEvent) {
	if !w.offer(batch) {
		h.cut(w, ErrSlowConsumer)
		return
	}
	w.active = true
	if h.onDeliver != nil {
		for _, ev := range batch {
			h.onDeliver(ev.Type, 1)
		}
	}
}

// publish delivers events, in order, as one batch per watcher, so a change
// set applied together (a sync diff, say) is never interleaved with others.
func (h *hub) publish(evs []*registrarv1.EndpointEvent) {
	if len(evs) == 0 {
		return
	}
	for w := range h.all {
		h.send(w, evs)
	}
	if len(h.bySvc) == 0 {
		return
	}
	if len(evs) == 1 {
		for w := range h.bySvc[evs[0].GetEndpoint().GetService()] {
			h.send(w, evs)
		}
		return
	}
	per := map[*watcher][]*registrarv1.EndpointEvent{}
	var order []*watcher
	for _, ev := range evs {
		for w := range h.bySvc[ev.GetEndpoint().GetService()] {
			if _, ok := per[w]; !ok {
				order = append(order, w)
			}
			per[w] = append(per[w], ev)
		}
	}
	for _, w := range order {
		if !w.gone {
			h.send(w, per[w])
		}
	}
}

// progress hands a bookmark to every watcher that was idle since the last
// call. Because it is issued under the same lock as events, a bookmark at
// sequence n follows every event up to n that the watcher should see.
func (h *hub) progress(ev *registrarv1.EndpointEvent) {
	batch := []*registrarv1.EndpointEvent{ev}
	visit := func(w *watcher) {
		if !w.active && !w.gone {
			h.send(w, batch)
		}
		w.active = false
	}
	for w := range h.all {
		visit(w)
	}
	seen := map[*watcher]struct{}{}
	for _, ws := range h.bySvc {
		for w := range ws {
			if _, ok := seen[w]; !ok {
				seen[w] = struct{}{}
				visit(w)
			}
		}
	}
}
