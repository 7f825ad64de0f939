package xds

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	clusterservice "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointservice "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	listenerservice "github.com/envoyproxy/go-control-plane/envoy/service/listener/v3"
	routeservice "github.com/envoyproxy/go-control-plane/envoy/service/route/v3"
	sotw "github.com/envoyproxy/go-control-plane/pkg/server/sotw/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/aethermesh/aether/internal/retry"
)

// Config configures a Server.
type Config struct {
	// Source is what the feed subscribes to (a *registrar.Registrar);
	// nil for a feed driven by Feed().Apply (the agent's).
	Source Source
	// Locality is the serving process's own (its region and zone): a node
	// that sends no locality in its xDS Node is served as if it were here.
	Locality Locality
	// MaxLocalities bounds the per-locality EDS caches (FeedConfig).
	MaxLocalities int
	Logger        *slog.Logger
	// Registerer takes the xds_ metrics; nil registers none.
	Registerer prometheus.Registerer
	// Backoff spaces resubscriptions (FeedConfig).
	Backoff retry.Backoff
	// Demand, if set, is told the services the streams name (see Demand):
	// the agent's way to watch only what its proxies ask for.
	Demand Demand
}

// Server is an xDS control plane over a Feed: go-control-plane's server
// with callbacks that count clients, pushes and NACKs, keep every
// stream's status (Status) and hold a NACKed version back (holdRejected).
type Server struct {
	feed   *Feed
	xds    serverv3.Server
	log    *slog.Logger
	m      *metrics
	status *tracker
	dmd    *demand // nil without Config.Demand

	ctx    context.Context // go-control-plane's servers end their streams with it
	cancel context.CancelFunc

	mu   sync.Mutex
	open map[int64]prometheus.Gauge // stream → its xds_connected_clients
}

// New builds a server and its feed; neither runs until Start.
func New(cfg Config) (*Server, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	m := newMetrics()
	if cfg.Registerer != nil {
		if err := m.register(cfg.Registerer); err != nil {
			return nil, fmt.Errorf("xds: register metrics: %w", err)
		}
	}
	feed, err := NewFeed(FeedConfig{
		Source: cfg.Source, Own: cfg.Locality, MaxLocalities: cfg.MaxLocalities,
		Logger: cfg.Logger, Backoff: cfg.Backoff, metrics: m,
	})
	if err != nil {
		return nil, err
	}
	s := &Server{feed: feed, log: cfg.Logger, m: m, status: newTracker(), dmd: newDemand(cfg.Demand), open: map[int64]prometheus.Gauge{}}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	// Ordered ADS: a state-of-the-world ADS stream sends its responses in
	// the order the caches answered them (one FIFO for all types), which
	// is the order the feed writes them in (Feed: endpoints before the
	// Cluster that needs them). Without it each type has a channel of its
	// own and the stream picks among the ready ones at random.
	s.xds = serverv3.NewServer(s.ctx, feed.Cache(), s.callbacks(), sotw.WithOrderedADS())
	return s, nil
}

// Feed is the server's feed.
func (s *Server) Feed() *Feed { return s.feed }

// Start starts the feed. A server serves before it (clients' watches wait
// for the feed's first start), so the listener can be bound first and the
// feed started once the registrar has loaded.
func (s *Server) Start() { s.feed.Start() }

// Register registers the aggregated service (ADS) and the per-type
// services (CDS, EDS, LDS, RDS), each with its state-of-the-world and
// delta methods, on g.
func (s *Server) Register(g *grpc.Server) {
	discoverygrpc.RegisterAggregatedDiscoveryServiceServer(g, s.xds)
	clusterservice.RegisterClusterDiscoveryServiceServer(g, s.xds)
	endpointservice.RegisterEndpointDiscoveryServiceServer(g, s.xds)
	listenerservice.RegisterListenerDiscoveryServiceServer(g, s.xds)
	routeservice.RegisterRouteDiscoveryServiceServer(g, s.xds)
}

// Serve serves xDS on lis with a grpc.Server of its own built from opts
// (credentials, keepalive), with the feed started, until ctx ends (nil)
// or the server fails (its error); either way the grpc.Server is stopped
// and the feed closed before it returns.
func (s *Server) Serve(ctx context.Context, lis net.Listener, opts ...grpc.ServerOption) error {
	g := grpc.NewServer(opts...)
	s.Register(g)
	s.Start()
	defer s.Close()
	errc := make(chan error, 1)
	go func() { errc <- g.Serve(lis) }()
	select {
	case <-ctx.Done():
		g.Stop()
		<-errc // Serve returns nil once stopped
		return nil
	case err := <-errc:
		g.Stop()
		return fmt.Errorf("xds: serve %s: %w", lis.Addr(), err)
	}
}

// Close stops the feed (joining its goroutine) and ends the streams
// go-control-plane holds; the grpc.Server is its owner's to stop.
func (s *Server) Close() {
	s.feed.Close()
	s.cancel()
}

func (s *Server) callbacks() serverv3.Callbacks {
	return serverv3.CallbackFuncs{
		StreamOpenFunc: func(_ context.Context, id int64, typeURL string) error {
			s.opened(id, "sotw", typeURL)
			return nil
		},
		StreamClosedFunc: func(id int64, _ *corev3.Node) { s.closed(id) },
		DeltaStreamOpenFunc: func(_ context.Context, id int64, typeURL string) error {
			s.opened(id, "delta", typeURL)
			return nil
		},
		DeltaStreamClosedFunc: func(id int64, _ *corev3.Node) { s.closed(id) },
		StreamRequestFunc: func(id int64, req *discoverygrpc.DiscoveryRequest) error {
			// go-control-plane fills in the node from the stream's first
			// request before calling this, and opens the watch after it.
			s.feed.ensure(req.GetNode())
			s.dmd.sotw(id, req)
			d := req.GetErrorDetail()
			nack, rejected := s.status.request(id, req.GetNode(), req.GetTypeUrl(), req.GetVersionInfo(), req.GetResponseNonce(), d.GetMessage(), d != nil)
			if nack != nil {
				s.nack("sotw", req.GetTypeUrl(), nack)
			}
			holdRejected(req, rejected)
			return nil
		},
		StreamResponseFunc: func(_ context.Context, id int64, _ *discoverygrpc.DiscoveryRequest, resp *discoverygrpc.DiscoveryResponse) {
			s.responded(id, resp.GetTypeUrl(), resp.GetVersionInfo(), resp.GetNonce(), len(resp.GetResources()))
		},
		StreamDeltaRequestFunc: func(id int64, req *discoverygrpc.DeltaDiscoveryRequest) error {
			// Here, unlike for state of the world, go-control-plane fills
			// in a missing node only after the callback: the tracker
			// remembers the first one.
			node := req.GetNode()
			if node != nil {
				s.feed.ensure(node)
			}
			s.dmd.delta(id, req)
			nodeID := s.status.node(id, node)
			d := req.GetErrorDetail()
			nack, _ := s.status.request(id, nil, req.GetTypeUrl(), "", req.GetResponseNonce(), d.GetMessage(), d != nil)
			if nack != nil {
				nack.node = nodeID
				s.nack("delta", req.GetTypeUrl(), nack)
			}
			return nil
		},
		StreamDeltaResponseFunc: func(id int64, _ *discoverygrpc.DeltaDiscoveryRequest, resp *discoverygrpc.DeltaDiscoveryResponse) {
			s.responded(id, resp.GetTypeUrl(), resp.GetSystemVersionInfo(), resp.GetNonce(), len(resp.GetResources()))
		},
	}
}

// responded counts a response and records it in the stream's status.
// go-control-plane calls this just before it sends: the push latency
// ends here.
func (s *Server) responded(id int64, typeURL, version, nonce string, resources int) {
	now := time.Now()
	requested := s.status.sent(id, typeURL, version, nonce, now)
	tm := s.m.of(typeURL)
	tm.pushes.Inc()
	tm.sent.Add(float64(resources))
	s.m.pushed(typeURL, version, requested, now)
}

// opened and closed keep xds_connected_clients (go-control-plane tells
// the stream's type only when it opens) and the status's streams.
func (s *Server) opened(id int64, variant, typeURL string) {
	g := s.m.connected.WithLabelValues(variant, serviceLabel(typeURL))
	g.Inc()
	s.mu.Lock()
	s.open[id] = g
	s.mu.Unlock()
	s.status.open(id, variant, typeURL)
}

func (s *Server) closed(id int64) {
	s.mu.Lock()
	g := s.open[id]
	delete(s.open, id)
	s.mu.Unlock()
	if g != nil {
		g.Dec()
	}
	s.status.close(id)
	s.dmd.closed(id)
}

// nack counts every NACK and logs the first of each version on a stream
// and type: a client that asks again NACKs again (each new request for
// names of the type re-sends the rejected version), and one line per
// rejected version says what there is to say.
func (s *Server) nack(variant, typeURL string, n *nackEvent) {
	s.m.nacks.WithLabelValues(typeLabel(typeURL)).Inc()
	if !n.first {
		return
	}
	s.log.Warn("xds: client rejected a configuration (NACK); it keeps its previous one, and the rejected version is not sent again until the configuration changes",
		"variant", variant, "node", n.node, "type", typeURL, "rejected_version", n.version, "accepted_version", n.accepted, "nonce", n.nonce, "error", n.detail)
}
