package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/registry"
)

// WritesConfig sizes the write-throughput scenario.
type WritesConfig struct {
	Registrations int // per mode
	Concurrency   int // concurrent callers
}

// WritesResult compares registrations per second through the registrar's
// write-behind with one etcd Put per registration, on the same etcd.
type WritesResult struct {
	Registrations int     `json:"registrations"`
	Concurrency   int     `json:"concurrency"`
	WriteBehindPS float64 `json:"write_behind_per_sec"` // until every write is in etcd
	AckPS         float64 `json:"ack_per_sec"`          // until every write is acknowledged
	DirectPutPS   float64 `json:"direct_put_per_sec"`
	Speedup       float64 `json:"speedup"`
	EtcdTxns      int64   `json:"write_behind_etcd_revisions"`
}

// DrainResult is the etcd side of write-behind on its own: how fast a
// registrar persists a backlog of acknowledged registrations (coalesced
// into 1024-operation flushes of 128-operation transactions), next to one
// Put per registration at the same concurrency as the callers.
type DrainResult struct {
	Registrations int     `json:"registrations"`
	DrainPS       float64 `json:"drain_per_sec"`
	Revisions     int64   `json:"etcd_revisions"`
}

// Drain queues n registrations in a registrar whose flusher is held back (a
// batch interval of an hour; only the first write goes at once), then times
// the shutdown flush that persists them all, and checks etcd has them.
func Drain(ctx context.Context, n int) (DrainResult, error) {
	res := DrainResult{Registrations: n}
	e, err := newEnv(ctx, 1, func(o *registrar.Options) {
		o.WriteBatchInterval = time.Hour
		o.WriteBatchSize = 1 << 30
		o.WriteQueueLimit = n + 1
	})
	if err != nil {
		return res, err
	}
	defer e.close()
	c, err := e.client(0)
	if err != nil {
		return res, err
	}
	for i := 0; i < n; i++ {
		if _, err := c.RegisterEndpoint(ctx, &registrarv1.RegisterEndpointRequest{Endpoint: &registryv1.ServiceEndpoint{
			Service: "drain", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: benchIP(i),
			Ports: []*registryv1.Port{{Name: "http", Port: 8080}},
		}}); err != nil {
			return res, err
		}
	}
	before, err := e.cli.Get(ctx, "/")
	if err != nil {
		return res, err
	}
	s := e.registrars[0]
	e.registrars = nil // closed here, not again by e.close
	start := time.Now()
	if err := s.Close(ctx); err != nil {
		return res, err
	}
	res.DrainPS = float64(n-1) / time.Since(start).Seconds()
	cnt, err := e.cli.Get(ctx, registry.ServicePrefix("default", "default", "drain"), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return res, err
	}
	if cnt.Count != int64(n) {
		return res, fmt.Errorf("drain persisted %d of %d registrations", cnt.Count, n)
	}
	res.Revisions = cnt.Header.Revision - before.Header.Revision
	return res, nil
}

// Writes runs both modes in one process against one embedded etcd. The
// write-behind figure counts until etcd holds every registration, not just
// until the acknowledgements, so the comparison is persisted-for-persisted.
func Writes(ctx context.Context, cfg WritesConfig) (WritesResult, error) {
	e, err := newEnv(ctx, 1, nil)
	if err != nil {
		return WritesResult{}, err
	}
	defer e.close()
	c, err := e.client(0)
	if err != nil {
		return WritesResult{}, err
	}
	res := WritesResult{Registrations: cfg.Registrations, Concurrency: cfg.Concurrency}

	mkEP := func(svc string, i int) *registryv1.ServiceEndpoint {
		return &registryv1.ServiceEndpoint{
			Service: svc, Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: benchIP(i),
			Ports: []*registryv1.Port{{Name: "http", Port: 8080}}, Node: benchNode(i),
			Region: "default", Cluster: "default",
		}
	}
	run := func(fn func(i int) error) (time.Duration, error) {
		var next atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, cfg.Concurrency)
		start := time.Now()
		for w := 0; w < cfg.Concurrency; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := int(next.Add(1)) - 1
					if i >= cfg.Registrations {
						return
					}
					if err := fn(i); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		return time.Since(start), <-errs
	}

	rev0, err := e.cli.Get(ctx, "/")
	if err != nil {
		return res, err
	}
	start := time.Now()
	ackTime, err := run(func(i int) error {
		_, err := c.RegisterEndpoint(ctx, &registrarv1.RegisterEndpointRequest{Endpoint: mkEP("wb", i)})
		return err
	})
	if err != nil {
		return res, fmt.Errorf("write-behind: %w", err)
	}
	for e.registrars[0].Registrar().PendingWrites() > 0 {
		time.Sleep(time.Millisecond)
	}
	persisted := time.Since(start)
	cnt, err := e.cli.Get(ctx, registry.ServicePrefix("default", "default", "wb"), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return res, err
	}
	if cnt.Count != int64(cfg.Registrations) {
		return res, fmt.Errorf("write-behind persisted %d of %d registrations", cnt.Count, cfg.Registrations)
	}
	res.EtcdTxns = cnt.Header.Revision - rev0.Header.Revision
	res.AckPS = float64(cfg.Registrations) / ackTime.Seconds()
	res.WriteBehindPS = float64(cfg.Registrations) / persisted.Seconds()

	direct, err := run(func(i int) error {
		ep := mkEP("direct", i)
		k, err := registry.IDOf(ep).Key()
		if err != nil {
			return err
		}
		v, err := registry.EncodeEndpoint(ep)
		if err != nil {
			return err
		}
		_, err = e.cli.Put(ctx, k, string(v))
		return err
	})
	if err != nil {
		return res, fmt.Errorf("direct put: %w", err)
	}
	res.DirectPutPS = float64(cfg.Registrations) / direct.Seconds()
	res.Speedup = res.WriteBehindPS / res.DirectPutPS
	return res, nil
}
