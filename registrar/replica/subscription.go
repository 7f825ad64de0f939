package replica

import (
	"context"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/registry"
)

// Start is what a subscription begins with, current as of At: either a
// snapshot of the endpoints of its services (Resumed false), or, when the
// subscriber resumed from a version of this replica's incarnation that is
// still inside the replica's retention window, exactly the events it
// missed since that version (Resumed true; possibly none). Applying the
// start and then every batch from Next in order reproduces the replica's
// view of the subscribed services.
type Start struct {
	Resumed  bool
	Snapshot []*registryv1.ServiceEndpoint // when !Resumed
	Missed   []*registrarv1.EndpointEvent  // when Resumed, in sequence order
	At       registry.Position
}

// Source is the replica's end of a subscription. The registrar implements
// it; a front end never calls it, only the Subscription that wraps it.
type Source interface {
	// Ready holds a token while batches may be waiting.
	Ready() <-chan struct{}
	// Take takes the oldest waiting batch; false when none waits.
	Take() ([]*registrarv1.EndpointEvent, bool)
	// Cut is closed once the replica has stopped delivering to the
	// subscription; Reason then says why.
	Cut() <-chan struct{}
	Reason() error
	// Update changes the subscribed services (see Subscription.Update).
	Update(add, remove []string) error
	// Close stops delivery with Reason ErrClosed; idempotent.
	Close()
}

// Subscription is one subscriber's view of a replica: a start, then the
// events of its services, in sequence order, batch by batch.
//
// Ordering: every event reaches a subscription in the order of its
// sequence number, and a batch is a change set the replica applied
// together (a sync diff, say), never interleaved with others. A PROGRESS
// event is a bookmark: every event up to its sequence that the
// subscription should see has been delivered before it.
//
// Delivery never blocks the replica: batches wait in a buffer of
// Limits.WatchBuffer batches, and a subscription whose buffer is full is
// cut (Done closes, Err is ErrSlowConsumer), so a slow consumer cannot
// stall the replica or grow its memory. A cut subscription delivers
// nothing more, not even what was buffered: the subscriber resumes (a new
// Subscribe with the version of the last event it processed), and gets
// exactly what it missed if that is still retained, else a snapshot.
// Shutdown cuts every subscription with ErrShuttingDown.
//
// The methods may be called from different goroutines, but Next and
// Update each from one goroutine at a time.
type Subscription struct {
	start Start
	src   Source
}

// NewSubscription is for the replica: a subscription that starts with
// start and reads its events from src.
func NewSubscription(start Start, src Source) *Subscription {
	return &Subscription{start: start, src: src}
}

// TakeStart returns the start and lets the subscription forget it: a
// snapshot of every endpoint a long-lived subscription follows, kept for
// its whole life, would be marked again by every garbage collection. Later
// calls return a Start with At alone.
func (s *Subscription) TakeStart() Start {
	st := s.start
	s.start = Start{At: st.At}
	return st
}

// Next waits for the next batch of events and returns it. It returns an
// error when ctx ends (ctx's error) or once the subscription is cut or
// closed (Err's error).
func (s *Subscription) Next(ctx context.Context) ([]*registrarv1.EndpointEvent, error) {
	for {
		// A cut wins over waiting batches: they were never delivered, and
		// the subscriber resumes from what it did receive.
		select {
		case <-s.src.Cut():
			return nil, s.src.Reason()
		default:
		}
		if b, ok := s.src.Take(); ok {
			return b, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.src.Cut():
			return nil, s.src.Reason()
		case <-s.src.Ready():
		}
	}
}

// Done is closed when the subscription is cut or closed.
func (s *Subscription) Done() <-chan struct{} { return s.src.Cut() }

// Err is nil while the subscription is live; once Done is closed it says
// why: ErrSlowConsumer, ErrShuttingDown or ErrClosed.
func (s *Subscription) Err() error {
	select {
	case <-s.src.Cut():
		return s.src.Reason()
	default:
		return nil
	}
}

// Update adds and removes services of a subscription that was started
// with a service list (one that watches all services has nothing to
// choose: ErrWatchesAll). For the services it adds, a SERVICES_SNAPSHOT of them, as of
// the replica's current version, is delivered through Next in order with
// the other events, so the subscriber holds them as of that version and
// applies later events on top; it is not returned here because it must
// follow the batches already waiting. A service both added and removed is
// removed and added again (a fresh snapshot of it). The update is refused,
// and nothing changed, when a name is invalid (*registry.FieldError, field
// "add" or "remove") or the subscription would watch more than
// Limits.MaxWatchServices services (*ServiceLimitError).
func (s *Subscription) Update(add, remove []string) error { return s.src.Update(add, remove) }

// Close ends the subscription and releases its place in the replica. It
// is idempotent; Next then returns ErrClosed.
func (s *Subscription) Close() { s.src.Close() }
