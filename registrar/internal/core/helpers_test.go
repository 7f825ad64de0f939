package core

import (
	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"time"

	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/registry"
)

// batchDone records that a whole batch landed at revision rev.
func (s *State) batchDone(b []backend.Mutation, rev int64) {
	outs := make([]backend.Outcome, len(b))
	for i, m := range b {
		outs[i] = backend.Outcome{Landed: true, Revision: rev}
		if m.Endpoint != nil {
			outs[i].KeyRev = rev
		} else {
			outs[i].TombRev = rev
		}
	}
	s.BatchSettled(b, outs, time.Time{})
}

// newStateForTest is a State of the given history and queue sizes.
func newStateForTest(epoch string, historySize, queueLimit int) *State {
	return New(Config{Epoch: epoch, HistorySize: historySize, QueueLimit: queueLimit, FlushAtBatch: 100})
}

// The one-event operations as the Go tests read them: the event (nil:
// none) rather than the Effects.
func firstEvent(e Effects) *registrarv1.EndpointEvent {
	if len(e.Events) == 0 {
		return nil
	}
	return e.Events[0]
}

func (s *State) register(ep *registryv1.ServiceEndpoint, now time.Time) (*registryv1.ServiceEndpoint, *registrarv1.EndpointEvent, error) {
	stored, e, err := s.Register(ep, now)
	return stored, firstEvent(e), err
}

func (s *State) drain(id registry.EndpointID, now time.Time) (*registryv1.ServiceEndpoint, *registrarv1.EndpointEvent, error) {
	stored, e, err := s.Drain(id, now)
	return stored, firstEvent(e), err
}

func (s *State) unregister(id registry.EndpointID, now time.Time) (*registrarv1.EndpointEvent, error) {
	_, e, err := s.Unregister(id, now)
	return firstEvent(e), err
}

func (s *State) adopt(id registry.EndpointID, ep *registryv1.ServiceEndpoint, rev, at int64) *registrarv1.EndpointEvent {
	return firstEvent(s.Adopt(id, ep, rev, at))
}
