package grpcapi

import (
	"log/slog"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	"github.com/aethermesh/aether/registrar/replica"
)

// Handlers and stream loop for the black-box tests, which need a real
// registrar (and so live in package grpcapi_test: this package's own tests
// cannot import the registrar, whose process code imports this package).

// Sender is a stream as the stream loop sends on it.
type Sender = sender

// NewHandler is the service of r with no guard, no stream limit and no
// metrics registry, to call handlers directly (no sockets).
func NewHandler(r Replica) registrarv1.RegistrarServer {
	m, _ := newMetrics(nil)
	return &service{r: r, m: m, log: slog.New(slog.DiscardHandler), streams: newStreamLimiter(0, func() {})}
}

// ServeUntil runs a stream's loop (its start, then its events) on stream
// until stop delivers an error, as a handler of h would.
func ServeUntil(h registrarv1.RegistrarServer, stream Sender, sub *replica.Subscription, stop <-chan error) error {
	s := h.(*service)
	defer s.senders.Wait()
	return s.serveUntil(stream, sub, &registrarv1.WatchEndpointsRequest{}, stop)
}
