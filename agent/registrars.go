package agent

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
)

// registrars sends the agent's node RPCs to one registrar at a time and
// moves to the next when that one is unreachable, so a rolling restart of
// the replicas costs a heartbeat a retry, not the node's lease.
type registrars struct {
	addrs []string
	conns []*grpc.ClientConn

	mu  sync.Mutex
	cur int
}

func newRegistrars(addrs []string, opts []grpc.DialOption) (*registrars, error) {
	r := &registrars{addrs: addrs}
	for _, a := range addrs {
		cc, err := grpc.NewClient(a, opts...)
		if err != nil {
			r.close()
			return nil, fmt.Errorf("--registrar %q: %w", a, err)
		}
		r.conns = append(r.conns, cc)
	}
	return r, nil
}

// call runs fn against the current registrar, then each other one while
// the failure is about reachability.
func (r *registrars) call(ctx context.Context, fn func(context.Context, registrarv1.RegistrarClient) error) error {
	r.mu.Lock()
	start := r.cur
	r.mu.Unlock()
	var err error
	for i := 0; i < len(r.conns); i++ {
		idx := (start + i) % len(r.conns)
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		err = fn(cctx, registrarv1.NewRegistrarClient(r.conns[idx]))
		cancel()
		switch status.Code(err) {
		case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
			if ctx.Err() != nil {
				return err
			}
			continue
		}
		r.mu.Lock()
		r.cur = idx
		r.mu.Unlock()
		return err
	}
	return fmt.Errorf("no registrar reachable (%v): %w", r.addrs, err)
}

func (r *registrars) close() {
	for _, c := range r.conns {
		c.Close()
	}
}
