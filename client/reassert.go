package client

import (
	"time"

	"google.golang.org/grpc/codes"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/registry"
)

// Re-assertion: the owner restores what it owns.
//
// A registrar acknowledges a write once it is in its snapshot, before it is
// persisted (write-behind), so a registrar that crashes can come back
// without writes it acknowledged; someone else may also change or remove an
// endpoint. The client keeps its own registrations as the registrar
// acknowledged them (owned) and, whenever the stream tells it something
// about one of them (a FULL_SNAPSHOT or SERVICES_SNAPSHOT covering its
// service, an event about it, or its own write settling), compares what the
// registrar holds with the intent and registers the intent again when they
// differ. The rule:
//
//   - Presence and attributes (registry.SameAttributes) are re-asserted.
//   - A DRAINING set by someone else while the intent is SERVING is
//     respected: an operator's drain holds until the agent registers the
//     endpoint again on its own (a changed endpoints file, a restart). If
//     the registrar then loses the endpoint altogether, it comes back
//     DRAINING, the drain being the last thing acknowledged.
//   - An intent of DRAINING (the client's own Drain) is re-asserted as
//     DRAINING.
//   - The client's Unregister ends the intent, and so does a write the
//     registrar rejects for good: re-sending what the registrar refuses
//     could only be refused again.
//   - Only endpoints of services the client watches are compared; of the
//     others it knows nothing.
//
// A write of the client's that a registrar acknowledged but the stream has
// not shown yet is compared too, once a snapshot of another incarnation of
// the registrar (another epoch) covers it: that snapshot is complete, so a
// write missing from it was lost in a restart or is on its way from another
// replica, and sending it again is right in the first case and harmless in
// the second.
//
// Re-assertions go through the ordinary writer: queued, sent in order,
// retried with backoff until acknowledged. The first re-assertion of an
// endpoint after a quiet spell goes out at once (the stream's reconnect
// backoff already spreads agents that lost the same registrar); repeated
// ones back off with full jitter per endpoint, so two owners fighting over
// one endpoint, or a registrar that keeps dropping it, cost a few writes
// rather than a loop. A re-assertion waiting out its backoff is shown in
// the cache like a queued write: it is the client's intent, and showing the
// gap would make consumers of the cache drop and re-add the endpoint.

// ownership is one endpoint the client owns.
type ownership struct {
	ep      *registryv1.ServiceEndpoint // the intent, as acknowledged
	drained *registryv1.ServiceEndpoint // ep, DRAINING (ep itself when it is)
	// heldDrain: the registrar last showed the endpoint DRAINING while the
	// intent is SERVING, a drain someone else asked for.
	heldDrain bool
	tries     int       // re-assertions since the last quiet spell
	last      time.Time // of the last re-assertion
}

func (o *ownership) set(ep *registryv1.ServiceEndpoint) {
	o.ep, o.drained, o.heldDrain = ep, drained(ep), false
}

// target is what the registrar should hold, given what it holds (nil:
// nothing).
func (o *ownership) target(held *registryv1.ServiceEndpoint) *registryv1.ServiceEndpoint {
	if o.ep.GetState() == registryv1.State_STATE_DRAINING {
		return o.ep
	}
	if held != nil {
		o.heldDrain = held.GetState() == registryv1.State_STATE_DRAINING
	}
	if o.heldDrain {
		return o.drained
	}
	return o.ep
}

// acknowledged records that a registrar acknowledged the client's intent w.
func (s *state) acknowledged(w *write) {
	switch w.op {
	case opRegister:
		if w.reassert {
			return // restored the ownership as it stands
		}
		o := s.owned[w.id]
		if o == nil {
			o = &ownership{}
			s.owned[w.id] = o
		}
		o.set(w.ep)
	case opDrain:
		if o := s.owned[w.id]; o != nil {
			o.set(o.drained)
		}
	}
}

// lostOnDrain reports whether a permanently rejected write was a Drain of
// an owned endpoint, of a watched service, that the registrar does not
// hold (NotFound): the intent becomes DRAINING and stays owned, for
// reconcile to register.
func (s *state) lostOnDrain(w *write, code codes.Code) bool {
	o := s.owned[w.id]
	if w.op != opDrain || o == nil || code != codes.NotFound || !s.cached(w.id.Service) {
		return false
	}
	o.set(o.drained)
	return true
}

// reconcile compares the registrar's state of an owned endpoint with the
// client's intent and queues the intent again when they differ. It leaves
// alone an endpoint with a write of the client's outstanding (that write
// is the intent, and is shown over any snapshot until it settles). fromDue
// is a re-assertion whose backoff is over: it goes out without waiting
// again.
func (s *state) reconcile(id registry.EndpointID, now time.Time, fromDue bool) {
	o := s.owned[id]
	if o == nil || s.writes[id] != nil || !s.cached(id.Service) {
		return
	}
	held := s.auth[id.Service][id]
	want := o.target(held)
	if held != nil && registry.SameAttributes(held, want) {
		delete(s.due, id)
		return
	}
	if !fromDue {
		if _, waiting := s.due[id]; waiting {
			return
		}
		if now.Sub(o.last) >= s.reassertQuiet {
			o.tries = 0
		}
		if o.tries > 0 {
			if d := s.reassertDelay(o.tries - 1); d > 0 {
				s.due[id] = now.Add(d)
				s.dueChanged = true
				return
			}
		}
	}
	o.tries++
	o.last = now
	s.intend(id, opRegister, want)
	s.writes[id].reassert = true
	s.reasserted = append(s.reasserted, id)
}

// resendLost handles the acknowledged writes a snapshot just covered (see
// replace): one the snapshot does not show, from another incarnation than
// the one that acknowledged it, is sent again. A register is handed to
// reconcile, which applies the drain rule; a drain or unregister is queued
// again as it is. Runs after the snapshot's version is recorded, so the
// incarnations compare.
func (s *state) resendLost(now time.Time) {
	for id := range s.resend {
		delete(s.resend, id)
		w := s.writes[id]
		if w == nil || w.state != writeAcked || s.sameIncarnation(w) || s.authMatches(w) {
			continue
		}
		if w.op == opRegister {
			delete(s.writes, id)
			s.reconcile(id, now, false)
			s.recompute(id)
			continue
		}
		w.state = writeQueued
		s.queue = append(s.queue, id)
		s.reasserted = append(s.reasserted, id)
	}
}

// fireDue re-asserts the endpoints whose backoff is over.
func (s *state) fireDue(now time.Time) {
	for id, t := range s.due {
		if t.After(now) {
			continue
		}
		delete(s.due, id)
		s.reconcile(id, now, true)
		s.recompute(id)
	}
}

// nextDue is when the next re-assertion's backoff is over; zero if none
// waits.
func (s *state) nextDue() time.Time {
	var next time.Time
	for _, t := range s.due {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	return next
}

// takeReasserted hands over the endpoints re-asserted since the last call.
func (s *state) takeReasserted() []registry.EndpointID {
	r := s.reasserted
	s.reasserted = nil
	return r
}

// Reasserted counts the writes the client sent on its own to restore its
// registrations (see the package doc), as agent_registrar_reasserted_total
// does.
func (c *Client) Reasserted() int64 { return c.stats.reasserted.Load() }
