// Package grpcapi is the registrar's gRPC adapter: the Registrar service
// (api/registrar/v1) on top of a replica's in-process API, with the
// authentication and authorization guard (mTLS mode), the per-caller limit
// of open watch streams, the bounded decoding of requests (ingress.go) and
// the shared wire encoding of events (wire.go).
//
// It depends only on the methods it calls (Replica and the interfaces it is
// made of), spoken in the types of package replica, never on
// *registrar.Registrar, which satisfies them; so another implementation of
// a replica (or a test double of one) can be served as well, and this
// package does not import the registrar.
package grpcapi

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/registrar/replica"
	"github.com/aethermesh/aether/registry"
)

// Endpoints are the endpoint calls of a replica.
type Endpoints interface {
	RegisterChecked(ep *registryv1.ServiceEndpoint, check replica.WriteCheck) (*registryv1.ServiceEndpoint, string, error)
	UnregisterStamped(id registry.EndpointID, check replica.WriteCheck) (string, replica.Written, error)
	DrainChecked(id registry.EndpointID, check replica.WriteCheck) (*registryv1.ServiceEndpoint, string, error)
	// OwnerCheck is the check that keeps a live node's endpoints its own
	// (for an unregister made for node owner by a caller authenticated as
	// node identity).
	OwnerCheck(owner, identity string) (replica.WriteCheck, error)
	WaitPersisted(ctx context.Context, id registry.EndpointID, stamp *registryv1.WriteStamp) error
	List(services []string) ([]*registryv1.ServiceEndpoint, string, error)
}

// Watcher starts subscriptions (WatchEndpoints and Subscribe streams).
type Watcher interface {
	Subscribe(services []string, fromVersion string) (*replica.Subscription, error)
}

// Nodes are the node calls of a replica.
type Nodes interface {
	AnnounceNode(ctx context.Context, n *registryv1.Node) (*registryv1.Node, error)
	Heartbeat(ctx context.Context, name, region, cluster string) (time.Duration, error)
	LeaveNode(ctx context.Context, name, region, cluster string) error
	ListNodes(ctx context.Context) []*registrarv1.NodeStatus
	// HeartbeatInterval is what AnnounceNode tells a node to keep to.
	HeartbeatInterval() time.Duration
}

// Replica is everything the service calls on the replica it serves.
type Replica interface {
	Endpoints
	Watcher
	Nodes
	Identity() replica.Identity
	Limits() replica.Limits
}

// Config is what the service needs besides its replica; the composition
// root fills it from the process's options.
type Config struct {
	// Logger logs refusals and stream ends; nil discards.
	Logger *slog.Logger
	// Registerer receives the service's metrics:
	// registrar_requests_rejected_total{reason},
	// registrar_authz_denied_total{rule} and
	// registrar_watch_evictions_total. Nil keeps them unexported.
	Registerer prometheus.Registerer
	// Authz, when set, authenticates every call by its client certificate
	// and authorizes it per identity (the process requires client
	// certificates: --tls-client-ca). Nil checks nothing: plaintext or
	// server-only TLS, where every caller may do everything.
	Authz *Authz
	// MaxStreamsPerIdentity bounds the open WatchEndpoints and Subscribe
	// streams of one caller (--max-streams-per-identity); <= 0: unlimited.
	MaxStreamsPerIdentity int
	// Replication reports the multi-region replicator's peers for
	// ReplicationStatus; enabled false (or a nil func) when the process
	// runs no replicator. Called per request, so it may start reporting
	// once the replicator is up.
	Replication func() (peers []*registrarv1.PeerReplicationStatus, enabled bool)
	// SharedEncoding encodes each event once for all the streams it goes
	// to. Only for a server built with ServerCodec(), whose codec sends the
	// shared bytes as they are; any other codec would marshal them as a
	// message they are not.
	SharedEncoding bool
}

// Authz is the identity scheme of mTLS mode: SPIFFE IDs of TrustDomain,
// operators under OperatorPrefix (see package authz).
type Authz struct {
	TrustDomain    string
	OperatorPrefix string
}

// Service is the Registrar service as registered on a server.
type Service struct {
	svc *service
}

// Register registers the Registrar service for replica on srv.
func Register(srv grpc.ServiceRegistrar, r Replica, cfg Config) (*Service, error) {
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &service{r: r, log: log, m: m, replication: cfg.Replication}
	if cfg.Authz != nil {
		if s.g, err = newGuard(*cfg.Authz, m, log); err != nil {
			return nil, err
		}
	}
	if cfg.SharedEncoding {
		s.wire = newWireCache()
	}
	s.streams = newStreamLimiter(cfg.MaxStreamsPerIdentity, func() { m.rejected.WithLabelValues("stream_limit").Inc() })
	registerIngress(srv, s, func() { m.rejected.WithLabelValues("malformed").Inc() }) // ingress.go
	return &Service{svc: s}, nil
}

// RegisterGRPC registers the Registrar service for r on a server of the
// caller's, as (*registrar.Registrar).RegisterGRPC did: no authorization,
// no stream limit, gRPC's own codec, and the metrics on r's registry when
// it has one (MetricsRegistry, as *registrar.Registrar does).
func RegisterGRPC(srv grpc.ServiceRegistrar, r Replica) *Service {
	cfg := Config{}
	if mr, ok := r.(interface{ MetricsRegistry() *prometheus.Registry }); ok {
		cfg.Registerer = mr.MetricsRegistry()
	}
	s, err := Register(srv, r, cfg)
	if err != nil {
		panic("grpcapi: " + err.Error()) // only Authz can fail, and it is not set
	}
	return s
}

// Wait returns once every stream's sender goroutine has ended. A sender
// normally ends before its handler returns; one blocked in a Send to a
// client that stopped reading can only be released by the end of the RPC,
// that is after its handler returned (gRPC offers no way to abort a Send),
// and it then ends at once. Wait is for the process's shutdown, after the
// gRPC server has stopped, so that no goroutine of the service outlives it.
func (s *Service) Wait() { s.svc.senders.Wait() }

// metrics are the service's counters: refusals at the API edge and cuts of
// streams.
type metrics struct {
	rejected    *prometheus.CounterVec
	authzDenied *prometheus.CounterVec
	evictions   prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "registrar_requests_rejected_total",
			Help: "Requests refused, by reason.",
		}, []string{"reason"}),
		authzDenied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "registrar_authz_denied_total",
			Help: "Calls refused by authentication or authorization (mTLS mode), by the rule they broke.",
		}, []string{"rule"}),
		evictions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "registrar_watch_evictions_total",
			Help: "Watch streams cut off because they did not keep up.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	// A second service on the same registry (a test's second server, say)
	// shares the counters already there rather than failing.
	var err error
	if m.rejected, err = register(reg, m.rejected); err != nil {
		return nil, err
	}
	if m.authzDenied, err = register(reg, m.authzDenied); err != nil {
		return nil, err
	}
	if m.evictions, err = register(reg, m.evictions); err != nil {
		return nil, err
	}
	return m, nil
}

func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing, nil
			}
		}
		return c, err
	}
	return c, nil
}

// bothChecks runs a, then b; either may be nil.
func bothChecks(a, b replica.WriteCheck) replica.WriteCheck {
	if a == nil || b == nil {
		if a == nil {
			return b
		}
		return a
	}
	return func(ep, stored *registryv1.ServiceEndpoint) error {
		if err := a(ep, stored); err != nil {
			return err
		}
		return b(ep, stored)
	}
}
