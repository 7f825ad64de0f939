package watchcheck

import (
	"context"
	"errors"
	"sync"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
)

// Update is a change of a Subscribe stream's services as its client sent it.
// The registrar applies it at some point after it arrives; Check works out
// where (see Check, "Subscribe streams").
type Update struct {
	Add, Remove []string
	// After is how many messages the stream had received when the client
	// sent the update.
	After int
}

// RecordUpdate records that the stream's client sends an update now, after
// the messages recorded so far. Record it before sending, so that every
// message counted before it was really received before the update left.
func (r *Recorder) RecordUpdate(add, remove []string) {
	r.mu.Lock()
	r.updates = append(r.updates, Update{Add: append([]string(nil), add...), Remove: append([]string(nil), remove...), After: len(r.msgs)})
	r.mu.Unlock()
}

// Updates returns a copy of the updates recorded so far.
func (r *Recorder) Updates() []Update {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Update(nil), r.updates...)
}

// Update records and sends a service update on a stream opened by
// Subscribe.
func (r *Recorder) Update(add, remove []string) error {
	if r.send == nil {
		return errors.New("watchcheck: Update on a stream not opened by Subscribe")
	}
	r.RecordUpdate(add, remove)
	return r.send(&registrarv1.SubscribeRequest{Request: &registrarv1.SubscribeRequest_Update{
		Update: &registrarv1.SubscriptionUpdate{Add: add, Remove: remove},
	}})
}

// Subscribe opens a Subscribe stream that starts with start and records it
// until ctx is done or the stream ends; change its services with Update.
func Subscribe(ctx context.Context, c registrarv1.RegistrarClient, name string, start *registrarv1.WatchEndpointsRequest) (*Recorder, error) {
	ctx, cancel := context.WithCancel(ctx)
	stream, err := c.Subscribe(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	if err := stream.Send(&registrarv1.SubscribeRequest{Request: &registrarv1.SubscribeRequest_Start{Start: start}}); err != nil {
		cancel()
		return nil, err
	}
	r := NewRecorder(name, start)
	r.cancel = cancel
	var sendMu sync.Mutex // gRPC allows one sender at a time
	r.send = func(m *registrarv1.SubscribeRequest) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return stream.Send(m)
	}
	go r.recordFrom(stream)
	return r, nil
}
