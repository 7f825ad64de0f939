package client

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/aethermesh/aether/internal/testutil/etcdtest"
)

// BenchmarkEndpointsCacheHit measures a read of a cached service on a client
// synced to a real registrar: 20 services of 10 endpoints each. It must stay
// well under a microsecond and allocate nothing.
func BenchmarkEndpointsCacheHit(b *testing.B) {
	etcd := etcdtest.Start(b)
	a := startRegistrar(b, etcd, "")
	ca := dial(b, a.GRPCAddr())
	for s := range 20 {
		for i := range 10 {
			register(b, ca, ep(fmt.Sprintf("svc-%d", s), fmt.Sprintf("10.0.%d.%d", s, i+1), 80))
		}
	}
	c := newClient(b, Config{Addrs: []string{a.GRPCAddr()}, Logger: quietLogger()})
	waitSynced(b, c)
	waitFor(b, "cache filled", 10*time.Second, func() bool { return len(endpointsOf(b, c, "svc-19")) == 10 })
	ctx := context.Background()

	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			eps, err := c.Endpoints(ctx, "svc-7")
			if err != nil || len(eps) != 10 {
				b.Fatalf("Endpoints = %d, %v", len(eps), err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				eps, err := c.Endpoints(ctx, "svc-7")
				if err != nil || len(eps) != 10 {
					b.Errorf("Endpoints = %d, %v", len(eps), err)
					return
				}
			}
		})
	})
}
