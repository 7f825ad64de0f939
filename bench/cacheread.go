package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/client"
)

// CacheReadResult is the cost of an agent's read of a cached service.
type CacheReadResult struct {
	Services     int     `json:"services"`
	PerService   int     `json:"endpoints_per_service"`
	NsPerRead    float64 `json:"ns_per_read"`
	AllocsPerOp  int64   `json:"allocs_per_read"`
	ParallelNsOp float64 `json:"parallel_ns_per_read"`
}

// CacheRead syncs a client library instance to a real registrar holding
// services×perService endpoints and times Client.Endpoints on one service
// (the Go benchmark in client/bench_test.go measures the same).
func CacheRead(ctx context.Context, services, perService int) (CacheReadResult, error) {
	res := CacheReadResult{Services: services, PerService: perService}
	e, err := newEnv(ctx, 1, nil)
	if err != nil {
		return res, err
	}
	defer e.close()
	rc, err := e.client(0)
	if err != nil {
		return res, err
	}
	for s := 0; s < services; s++ {
		for i := 0; i < perService; i++ {
			_, err := rc.RegisterEndpoint(ctx, &registrarv1.RegisterEndpointRequest{Endpoint: &registryv1.ServiceEndpoint{
				Service: fmt.Sprintf("svc-%d", s), Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: benchIP(s*perService + i),
				Ports: []*registryv1.Port{{Name: "http", Port: 8080}},
			}})
			if err != nil {
				return res, err
			}
		}
	}
	c, err := client.New(client.Config{Addrs: []string{e.registrars[0].GRPCAddr()}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return res, err
	}
	defer c.Close()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := c.WaitSynced(wctx); err != nil {
		return res, err
	}
	svc := fmt.Sprintf("svc-%d", services-1)
	for {
		eps, err := c.Endpoints(wctx, svc)
		if err != nil {
			return res, err
		}
		if len(eps) == perService {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	var failed error
	serial := testing.Benchmark(func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if eps, err := c.Endpoints(ctx, svc); err != nil || len(eps) != perService {
				failed = fmt.Errorf("Endpoints(%s) = %d endpoints, %v", svc, len(eps), err)
				return
			}
		}
	})
	parallel := testing.Benchmark(func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				_, _ = c.Endpoints(ctx, svc)
			}
		})
	})
	if failed != nil {
		return res, failed
	}
	res.NsPerRead = float64(serial.NsPerOp())
	res.AllocsPerOp = serial.AllocsPerOp()
	res.ParallelNsOp = float64(parallel.T.Nanoseconds()) / float64(max(parallel.N, 1))
	return res, nil
}
