package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/registrar"
)

// PropagationConfig sizes the propagation scenario.
type PropagationConfig struct {
	Changes  int           // registrations to time
	Interval time.Duration // pause between registrations (an open-loop churn rate)
	// BatchInterval is the registrars' --write-batch-interval (0: default).
	BatchInterval time.Duration
}

// PropagationResult holds register-to-watcher latencies.
type PropagationResult struct {
	Changes       int       `json:"changes"`
	BatchInterval string    `json:"write_batch_interval"`
	RatePerSec    float64   `json:"rate_per_sec"`
	SameReplica   Latencies `json:"same_replica"`
	CrossReplica  Latencies `json:"cross_replica"`
}

// Propagation registers endpoints through replica A, one at a time, and
// times from just before each RegisterEndpoint call until a watcher on A and
// a watcher on B (a second registrar on the same etcd, which learns of the
// write only through etcd) receive the event.
func Propagation(ctx context.Context, cfg PropagationConfig) (PropagationResult, error) {
	e, err := newEnv(ctx, 2, func(o *registrar.Options) { o.WriteBatchInterval = cfg.BatchInterval })
	if err != nil {
		return PropagationResult{}, err
	}
	defer e.close()
	ca, err := e.client(0)
	if err != nil {
		return PropagationResult{}, err
	}
	cb, err := e.client(1)
	if err != nil {
		return PropagationResult{}, err
	}

	var mu sync.Mutex
	sent := make(map[string]time.Time, cfg.Changes)
	same := make([]time.Duration, 0, cfg.Changes)
	cross := make([]time.Duration, 0, cfg.Changes)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	watchOn := func(c registrarv1.RegistrarClient, out *[]time.Duration) error {
		st, err := c.WatchEndpoints(wctx, &registrarv1.WatchEndpointsRequest{Services: []string{"bench"}})
		if err != nil {
			return err
		}
		if _, err := st.Recv(); err != nil { // the (empty) snapshot
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				ev, err := st.Recv()
				if err != nil {
					return
				}
				if ev.Type != registrarv1.EndpointEvent_ENDPOINT_ADDED {
					continue
				}
				now := time.Now()
				mu.Lock()
				if t0, ok := sent[ev.Endpoint.Ip]; ok {
					*out = append(*out, now.Sub(t0))
				}
				mu.Unlock()
			}
		}()
		return nil
	}
	if err := watchOn(ca, &same); err != nil {
		return PropagationResult{}, err
	}
	if err := watchOn(cb, &cross); err != nil {
		return PropagationResult{}, err
	}

	start := time.Now()
	for i := 0; i < cfg.Changes; i++ {
		ip := benchIP(i)
		mu.Lock()
		sent[ip] = time.Now()
		mu.Unlock()
		_, err := ca.RegisterEndpoint(ctx, &registrarv1.RegisterEndpointRequest{Endpoint: &registryv1.ServiceEndpoint{
			Service: "bench", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: ip,
			Ports: []*registryv1.Port{{Name: "http", Port: 8080}}, Node: benchNode(i),
		}})
		if err != nil {
			return PropagationResult{}, fmt.Errorf("register %s: %w", ip, err)
		}
		time.Sleep(cfg.Interval)
	}
	elapsed := time.Since(start)
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		done := len(same) == cfg.Changes && len(cross) == cfg.Changes
		mu.Unlock()
		if done {
			break
		}
		if time.Now().After(deadline) {
			return PropagationResult{}, fmt.Errorf("watchers saw %d and %d of %d registrations", len(same), len(cross), cfg.Changes)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	return PropagationResult{
		Changes:       cfg.Changes,
		BatchInterval: e.registrars[0].Options().WriteBatchInterval.String(),
		RatePerSec:    float64(cfg.Changes) / elapsed.Seconds(),
		SameReplica:   summarize(same),
		CrossReplica:  summarize(cross),
	}, nil
}
