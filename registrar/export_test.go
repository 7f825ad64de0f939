package registrar

import (
	"testing"
	"time"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/registrar/internal/core"
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

// t0 is the tests' fixed time.
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// mkEP is a normalized HTTP endpoint of service svc at ip, in region r and
// cluster c, changed by mut.
func mkEP(t testing.TB, svc, ip string, mut ...func(*registryv1.ServiceEndpoint)) *registryv1.ServiceEndpoint {
	t.Helper()
	ep := &registryv1.ServiceEndpoint{
		Service: svc, Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: ip,
		Ports: []*registryv1.Port{{Port: 80}}, Region: "r", Cluster: "c",
	}
	for _, m := range mut {
		m(ep)
	}
	n, err := registry.NormalizeEndpoint(ep, registry.DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// mustRegister registers ep straight into a state machine.
func mustRegister(t *testing.T, s *core.State, ep *registryv1.ServiceEndpoint) {
	t.Helper()
	if _, _, err := s.Register(ep, t0); err != nil {
		t.Fatal(err)
	}
}
