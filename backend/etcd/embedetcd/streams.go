package embedetcd

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// streamEnder ends the member's open gRPC streams (watches, lease
// keep-alives) when Close begins.
//
// etcd's Close stops its gRPC server gracefully, and a graceful stop waits
// for every open stream to finish. Watch streams never finish on their own,
// so Close would sit out etcd's full request timeout (5s plus two election
// timeouts) whenever any client still had a watch open, which is the normal
// state of a registrar. Ending the streams first lets the graceful stop
// complete at once. They end with UNAVAILABLE, which is what a client would
// see after the timeout anyway, and which clientv3 treats as transient: its
// watches resume on their own once a member is back.
type streamEnder struct {
	mu      sync.Mutex
	closing bool
	next    uint64
	cancels map[uint64]context.CancelFunc
}

func newStreamEnder() *streamEnder {
	return &streamEnder{cancels: make(map[uint64]context.CancelFunc)}
}

// errShuttingDown is what a stream ended by Close returns to its client.
var errShuttingDown = status.Error(codes.Unavailable, "embedded etcd is shutting down")

func (e *streamEnder) intercept(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx, cancel := context.WithCancel(ss.Context())
	e.mu.Lock()
	if e.closing {
		e.mu.Unlock()
		cancel()
		return errShuttingDown
	}
	id := e.next
	e.next++
	e.cancels[id] = cancel
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		delete(e.cancels, id)
		e.mu.Unlock()
		cancel()
	}()

	err := handler(srv, &ctxStream{ServerStream: ss, ctx: ctx})
	if ctx.Err() != nil && ss.Context().Err() == nil {
		// We ended it, not the client: report a server going away rather
		// than the cancellation etcd maps it to, which clients treat as final.
		return errShuttingDown
	}
	return err
}

// endAll ends every open stream and refuses new ones.
func (e *streamEnder) endAll() {
	e.mu.Lock()
	e.closing = true
	cancels := make([]context.CancelFunc, 0, len(e.cancels))
	for _, c := range e.cancels {
		cancels = append(cancels, c)
	}
	e.mu.Unlock()
	for _, c := range cancels {
		c()
	}
}

// ctxStream substitutes a cancellable context for a stream's own.
type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *ctxStream) Context() context.Context { return s.ctx }
