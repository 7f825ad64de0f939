package registrar

import (
	"time"

	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/registry"
)

// Accessors that only the tests need, compiled into the test binary alone so
// the package's API carries nothing a caller could come to depend on.

// pending is how many batches wait.
func (w *watcher) pending() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.queue)
}

// ghosts is ghostsIn over every service.
func (s *state) ghosts(region, cluster string, now time.Time, grace time.Duration) []registry.EndpointID {
	services := make([]string, 0, len(s.endpoints))
	for svc := range s.endpoints {
		services = append(services, svc)
	}
	return s.ghostsIn(services, region, cluster, now, grace)
}

// batchDone records that a whole batch landed at revision rev.
func (s *state) batchDone(b []backend.Mutation, rev int64) {
	outs := make([]backend.Outcome, len(b))
	for i, m := range b {
		outs[i] = backend.Outcome{Landed: true, Revision: rev}
		if m.Endpoint != nil {
			outs[i].KeyRev = rev
		} else {
			outs[i].TombRev = rev
		}
	}
	s.batchSettled(b, outs, time.Time{})
}
