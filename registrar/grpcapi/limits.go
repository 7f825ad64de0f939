package grpcapi

import (
	"context"
	"fmt"
	"net"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/aethermesh/aether/authz"
)

// streamLimiter counts the open WatchEndpoints and Subscribe streams of each
// caller, for --max-streams-per-identity. A caller is its SPIFFE ID when
// the registrar requires client certificates; without them (plaintext, or
// TLS without --tls-client-ca) nobody is authenticated, so a caller is its
// IP address: every client behind one address (a NAT, a node's agents)
// shares one budget.
type streamLimiter struct {
	max      int    // <= 0: unlimited
	onRefuse func() // counts a refusal (metric)
	mu       sync.Mutex
	open     map[string]int
}

func newStreamLimiter(max int, onRefuse func()) *streamLimiter {
	return &streamLimiter{max: max, onRefuse: onRefuse, open: map[string]int{}}
}

// acquire counts a new stream of the caller of ctx, or refuses it with
// RESOURCE_EXHAUSTED when the caller has max open already. The caller must
// call release exactly once when the stream ends, on every path (defer it).
func (l *streamLimiter) acquire(ctx context.Context, g *guard, method string) (release func(), err error) {
	who := callerKey(ctx, g)
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.open[who]
	if l.max > 0 && n >= l.max {
		l.onRefuse()
		return nil, status.Error(codes.ResourceExhausted, fmt.Sprintf(
			"%s: %s already has %d open watch streams, the limit (--max-streams-per-identity %d); close one, or share a Subscribe stream and change its services with updates",
			method, who, n, l.max))
	}
	l.open[who] = n + 1
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			if l.open[who]--; l.open[who] <= 0 {
				delete(l.open, who)
			}
		})
	}, nil
}

// callerKey names the caller of ctx for per-identity limits: "identity
// <SPIFFE ID>" with mTLS, "address <IP>" otherwise.
func callerKey(ctx context.Context, g *guard) string {
	if g != nil {
		if id, err := authz.FromContext(ctx, g.trustDomain, g.operatorPrefix); err == nil && id.URI != "" {
			return "identity " + id.URI
		}
	}
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		host, _, err := net.SplitHostPort(p.Addr.String())
		if err != nil {
			host = p.Addr.String()
		}
		return "address " + host
	}
	return "address unknown"
}
