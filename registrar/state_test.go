package registrar

import (
	"errors"
	"testing"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/registrar/replica"
)

// take is what a stream's sender does: wait for the token, take a batch.
func take(t *testing.T, w *watcher) []*registrarv1.EndpointEvent {
	t.Helper()
	select {
	case <-w.ready:
	default:
		t.Fatal("no batch signalled")
	}
	b, ok := w.next()
	if !ok {
		t.Fatal("signalled, but no batch waits")
	}
	if w.pending() > 0 {
		w.ready <- struct{}{} // as the sender would loop on
	}
	return b
}

func TestHubFilterEvictProgress(t *testing.T) {
	h := newHub()
	fweb, _ := newFilter([]string{"web"})
	all, web, slow := newWatcher(nil, 10), newWatcher(fweb, 10), newWatcher(nil, 1)
	h.add(all)
	h.add(web)
	h.add(slow)
	ev := func(svc string, seq uint64) *registrarv1.EndpointEvent {
		return &registrarv1.EndpointEvent{Type: registrarv1.EndpointEvent_ENDPOINT_ADDED, Sequence: seq, Endpoint: &registryv1.ServiceEndpoint{Service: svc}}
	}
	h.publish([]*registrarv1.EndpointEvent{ev("db", 1), ev("web", 2)})
	if got := take(t, web); len(got) != 1 || got[0].Sequence != 2 {
		t.Fatalf("filtered watcher got %v", got)
	}
	if got := take(t, all); len(got) != 2 {
		t.Fatalf("unfiltered watcher got %d events in its batch, want 2", len(got))
	}
	// slow has a buffer of one message and never reads: the next batch evicts it.
	h.publish([]*registrarv1.EndpointEvent{ev("db", 3)})
	select {
	case <-slow.evicted:
	default:
		t.Fatal("slow watcher not evicted")
	}
	if h.len() != 2 {
		t.Fatalf("hub has %d watchers after eviction, want 2", h.len())
	}
	take(t, all)
	// Progress: the first tick after activity only resets; the next one
	// bookmarks idle watchers.
	bm := &registrarv1.EndpointEvent{Type: registrarv1.EndpointEvent_PROGRESS, Sequence: 3}
	h.progress(bm)
	if web.pending() != 0 || all.pending() != 0 {
		t.Fatal("active watchers were bookmarked")
	}
	h.progress(bm)
	if got := take(t, web); got[0] != bm {
		t.Fatal("idle filtered watcher got no bookmark")
	}
	if got := take(t, all); got[0] != bm {
		t.Fatal("idle watcher got no bookmark")
	}
}

func TestParseVersion(t *testing.T) {
	v, err := replica.ParseVersion("abc:42")
	if err != nil || v.Epoch != "abc" || v.Seq != 42 {
		t.Fatalf("%v %v", v, err)
	}
	for _, bad := range []string{"42", "abc:", ":4", "abc:-1", "abc:x"} {
		if _, err := replica.ParseVersion(bad); !errors.Is(err, replica.ErrBadVersion) {
			t.Errorf("ParseVersion(%q): %v, want ErrBadVersion", bad, err)
		}
	}
	if v, err := replica.ParseVersion(""); err != nil || !v.IsZero() {
		t.Fatalf("empty: %v %v", v, err)
	}
}

// A watcher's queue holds up to its limit, in order, and lets its memory go
// once drained.
func TestWatcherQueue(t *testing.T) {
	w := newWatcher(nil, 3)
	if w.queue != nil {
		t.Fatal("an idle watcher allocated a queue")
	}
	batch := func(seq uint64) []*registrarv1.EndpointEvent {
		return []*registrarv1.EndpointEvent{{Sequence: seq}}
	}
	for i := uint64(1); i <= 3; i++ {
		if !w.offer(batch(i)) {
			t.Fatalf("offer %d refused below the limit", i)
		}
	}
	if w.offer(batch(4)) {
		t.Fatal("offer beyond the limit accepted")
	}
	if len(w.ready) != 1 {
		t.Fatalf("%d tokens, want 1", len(w.ready))
	}
	for i := uint64(1); i <= 3; i++ {
		b, ok := w.next()
		if !ok || b[0].Sequence != i {
			t.Fatalf("next %d: %v %v", i, b, ok)
		}
	}
	if _, ok := w.next(); ok || w.queue != nil {
		t.Fatalf("drained queue: ok %v, queue %v", ok, w.queue)
	}
	if !w.offer(batch(5)) {
		t.Fatal("offer refused after draining")
	}
}
