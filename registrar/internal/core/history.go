package core

import (
	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
)

// history is a fixed-size ring of the most recent change events, the
// retention window for resume. Events are immutable once appended and are
// shared with every stream that receives them.
type history struct {
	buf   []*registrarv1.EndpointEvent
	start int // index of the oldest event
	n     int // number of events held
}

func newHistory(size int) *history {
	if size < 1 {
		size = 1
	}
	return &history{buf: make([]*registrarv1.EndpointEvent, size)}
}

func (h *history) append(ev *registrarv1.EndpointEvent) {
	if h.n < len(h.buf) {
		h.buf[(h.start+h.n)%len(h.buf)] = ev
		h.n++
		return
	}
	h.buf[h.start] = ev
	h.start = (h.start + 1) % len(h.buf)
}

func (h *history) at(i int) *registrarv1.EndpointEvent { return h.buf[(h.start+i)%len(h.buf)] }

// since returns the retained events with sequence > seq, given that cur is
// the newest sequence issued. ok is false when the window no longer reaches
// back to seq+1 (events were evicted) or seq is from the future; the caller
// must then send a full snapshot.
func (h *history) since(seq, cur uint64) (evs []*registrarv1.EndpointEvent, ok bool) {
	if seq > cur {
		return nil, false
	}
	if seq == cur {
		return nil, true
	}
	if h.n == 0 || h.at(0).Sequence > seq+1 {
		return nil, false
	}
	// Sequences in the ring are contiguous, so the first wanted event sits at
	// a computable offset.
	off := int(seq + 1 - h.at(0).Sequence)
	evs = make([]*registrarv1.EndpointEvent, 0, h.n-off)
	for i := off; i < h.n; i++ {
		evs = append(evs, h.at(i))
	}
	return evs, true
}
