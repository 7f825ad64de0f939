package watchcheck

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
)

// AckLog collects the acknowledged writes a History is checked against;
// safe for concurrent use by several writers.
type AckLog struct {
	mu   sync.Mutex
	acks []Ack
}

// Add records one acknowledged write.
func (a *AckLog) Add(op Op, e *registryv1.ServiceEndpoint, version string) {
	a.mu.Lock()
	a.acks = append(a.acks, Ack{Op: op, Endpoint: e, Version: version})
	a.mu.Unlock()
}

// All is every write recorded so far.
func (a *AckLog) All() []Ack {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.acks)
}

// Writers churn a registrar through its API the way the guarantee tests
// need: each writer registers, updates and unregisters endpoints of its own
// (so concurrent writers never collide), and every acknowledgement goes to
// an AckLog.
type Writers struct {
	// Region and Cluster are the registrar's origin, which an unregister's
	// acknowledgement does not carry.
	Region, Cluster string
	// Services the writers spread their endpoints over.
	Services []string
	// New makes a fresh endpoint of writer w for a service and an address;
	// Region and Cluster are left to the registrar.
	New func(w int, service, ip string) *registryv1.ServiceEndpoint
}

// Churn runs writer w for n writes: mostly registrations, every fifth an
// update of its newest live endpoint (metadata "rev"), every fifth an
// unregistration of its oldest.
func (ws Writers) Churn(ctx context.Context, c registrarv1.RegistrarClient, w, n int, acks *AckLog) error {
	var live []*registryv1.ServiceEndpoint
	for i := 0; i < n; i++ {
		switch {
		case i%5 == 3 && len(live) > 0:
			e := proto.Clone(live[len(live)-1]).(*registryv1.ServiceEndpoint)
			e.Metadata = maps.Clone(e.Metadata)
			if e.Metadata == nil {
				e.Metadata = map[string]string{}
			}
			e.Metadata["rev"] = fmt.Sprint(i)
			resp, err := c.RegisterEndpoint(ctx, &registrarv1.RegisterEndpointRequest{Endpoint: e})
			if err != nil {
				return fmt.Errorf("writer %d update: %w", w, err)
			}
			live[len(live)-1] = e
			acks.Add(OpRegister, resp.Endpoint, resp.Version)
		case i%5 == 4 && len(live) > 0:
			e := live[0]
			live = live[1:]
			resp, err := c.UnregisterEndpoint(ctx, &registrarv1.UnregisterEndpointRequest{Service: e.Service, Protocol: e.Protocol, Ip: e.Ip})
			if err != nil {
				return fmt.Errorf("writer %d unregister: %w", w, err)
			}
			gone := proto.Clone(e).(*registryv1.ServiceEndpoint)
			gone.Region, gone.Cluster = ws.Region, ws.Cluster
			acks.Add(OpUnregister, gone, resp.Version)
		default:
			e := ws.New(w, ws.Services[(i+w)%len(ws.Services)], fmt.Sprintf("10.%d.%d.%d", 100+w, i/250, i%250+1))
			resp, err := c.RegisterEndpoint(ctx, &registrarv1.RegisterEndpointRequest{Endpoint: e})
			if err != nil {
				return fmt.Errorf("writer %d register: %w", w, err)
			}
			live = append(live, e)
			acks.Add(OpRegister, resp.Endpoint, resp.Version)
		}
	}
	return nil
}

// Run runs writers first..first+count-1 concurrently, n writes each, and
// returns the first error; each writer has 30 s.
func (ws Writers) Run(c registrarv1.RegistrarClient, first, count, n int, acks *AckLog) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, count)
	for w := first; w < first+count; w++ {
		wg.Go(func() {
			if err := ws.Churn(ctx, c, w, n, acks); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}
