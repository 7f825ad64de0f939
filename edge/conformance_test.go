package edge

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/backend/backendtest"
	etcdbackend "github.com/aethermesh/aether/backend/etcd"
)

// The registrar's etcd backend, unchanged, passes its own conformance
// suite against the edge store: the same factory as backend/etcd's test
// against real etcd, with lease time moved by the server's injected clock
// instead of waited for.
func TestRegistrarBackendConformance(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	s := startServer(t, "", func(c *Config) { c.Now = clk.Now })
	cli := newClient(t, s)
	backendtest.RunAll(t, backendtest.Factory{
		New: func(t backendtest.T) backend.Store {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, err := cli.Delete(ctx, "\x00", clientv3.WithFromKey()); err != nil {
				t.Fatalf("wiping the edge store for a fresh store: %v", err)
			}
			return etcdbackend.New(cli, etcdbackend.Options{})
		},
		Compact: func(t backendtest.T, _ backend.Store, rev int64) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, err := cli.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil {
				t.Fatalf("compact at %d: %v", rev, err)
			}
		},
		Advance: func(t backendtest.T, _ backend.Store, d time.Duration) {
			clk.Add(d)
			s.kickLeases()
		},
	})
}
