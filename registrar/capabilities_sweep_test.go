package registrar

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/backend/memory"
	"github.com/aethermesh/aether/internal/testutil/wait"
	"github.com/aethermesh/aether/registry"
)

// withoutLeases hides the model store's leases.
type withoutLeases struct {
	backend.Store
	backend.Watcher
	backend.Digester
}

// The ghost sweep removes an endpoint whose node has no record once the
// grace has passed, but only where node records are the store's leases:
// on a store without leases no node has a record, and sweeping would
// remove every endpoint that names its node, so the sweep's loop ends at
// once. The registrar is not started: the test runs the loop itself.
func TestGhostSweepOnlyWithLeases(t *testing.T) {
	for _, tc := range []struct {
		name  string
		store func(*memory.Backend) backend.Store
		swept bool
	}{
		{"full store", func(m *memory.Backend) backend.Store { return m }, true},
		{"store without leases", func(m *memory.Backend) backend.Store { return withoutLeases{m, m, m} }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := memory.New(memory.Options{})
			r, err := New(Options{ClusterName: "c1", Region: "r1", NodeTTL: 2 * time.Second,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, tc.store(m))
			if err != nil {
				t.Fatal(err)
			}
			// Set before the loop starts, so it reads the clock without a
			// race; moving it on ends every grace.
			var ahead atomic.Int64
			r.now = func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) }
			stored, _, err := r.Register(&registryv1.ServiceEndpoint{
				Service: "web", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: "10.0.0.1",
				Ports: []*registryv1.Port{{Name: "http", Port: 80}}, Node: "n1", Zone: "z1",
			})
			if err != nil {
				t.Fatal(err)
			}
			held := func() bool {
				r.mu.Lock()
				defer r.mu.Unlock()
				return r.st.Get(registry.IDOf(stored)) != nil
			}
			ahead.Store(int64(time.Hour))

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan struct{})
			go func() { defer close(done); r.runSweep(ctx) }()
			ended := func() bool {
				select {
				case <-done:
					return true
				default:
					return false
				}
			}
			r.kickSweep()
			if tc.swept {
				wait.For(t, "the sweep removes the ghost", 5*time.Second, func() bool { return !held() })
				if ended() {
					t.Error("the sweep loop ended with its context still live")
				}
				cancel()
				<-done
				return
			}
			wait.For(t, "the sweep loop ends", 5*time.Second, ended)
			if !held() {
				t.Error("an endpoint was swept on a store without leases")
			}
		})
	}
}
