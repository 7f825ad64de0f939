package dynamodb

import (
	"testing"

	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/backend/backendtest"
)

var (
	_ backend.Store  = (*Store)(nil)
	_ backend.Leases = (*Store)(nil)
)

// TestConformance runs the backend contract's suite against dynalite, a
// fresh table per test. The store has no Watcher and no Digester (the
// registrar polls it), so those parts of the suite do not apply; Leases
// are the expiry records of nodes.go.
func TestConformance(t *testing.T) {
	cli := startDynalite(t)
	backendtest.RunAll(t, backendtest.Factory{
		New: func(t backendtest.T) backend.Store {
			return open(t, cli, newTable(t, cli, 4), Options{})
		},
	})
}

// TestMembers runs peer-watch's membership suite against dynalite: member
// records on the expiry leases.
func TestMembers(t *testing.T) {
	cli := startDynalite(t)
	backendtest.RunMembers(t, backendtest.Factory{
		New: func(t backendtest.T) backend.Store {
			return open(t, cli, newTable(t, cli, 4), Options{})
		},
	})
}
