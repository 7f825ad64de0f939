package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/registry"
)

// ErrClosed is returned by calls on a closed Client.
var ErrClosed = errors.New("client: closed")

// ErrWatchingAll is returned by Subscribe and Unsubscribe on a client that
// watches all services (Config.Services was empty).
var ErrWatchingAll = errors.New("client: this client watches all services (Config.Services was empty); to choose services, create it with a service list")

// Client is an agent's connection to the registrars. It is safe for
// concurrent use.
type Client struct {
	cfg   Config
	log   *slog.Logger
	conns []*grpc.ClientConn
	rpc   []registrarv1.RegistrarClient
	// addr is the index of the registrar in use: the stream's, and so the
	// writer's and the fallback reads' first choice. Only the stream loop
	// moves it, so one failing component cannot make the others skip a
	// healthy registrar.
	addr atomic.Uint32

	view atomic.Pointer[view] // what reads see; never nil

	mu    sync.Mutex
	st    *state
	acked chan struct{} // closed and replaced whenever a write completes (Flush)

	// staleSince is nil while the stream is connected and synced, else
	// when it last was (or New, before the first sync).
	staleSince atomic.Pointer[time.Time]
	synced     chan struct{} // closed at the first sync
	syncOnce   sync.Once

	subKick   chan struct{} // subscriptions changed: update the live stream
	writeKick chan struct{} // a write was queued
	syncKick  chan struct{} // the stream synced: the writer may stop backing off

	notify  *notifier
	metrics *metrics
	stats   stats

	ctx       context.Context // ends at Close
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// stats are counters for tests and debugging; they are not part of the API.
type stats struct {
	fullSnapshots atomic.Int64 // complete FULL_SNAPSHOTs applied
	resumes       atomic.Int64 // streams that resumed (synced by PROGRESS, no snapshot)
	fallbacks     atomic.Int64 // reads served by ListAllEndpoints
	reasserted    atomic.Int64 // writes sent on the client's own to restore its registrations
}

// New validates cfg, starts the stream and the writer in the background and
// returns at once; reads work immediately (through the fallback until the
// first snapshot, see WaitSynced).
func New(cfg Config) (*Client, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	c := &Client{
		cfg:       cfg,
		log:       cfg.Logger.With("component", "registrar-client", "node", cfg.Node),
		st:        newState(cfg.Services, cfg.OnChange != nil),
		acked:     make(chan struct{}),
		synced:    make(chan struct{}),
		subKick:   make(chan struct{}, 1),
		writeKick: make(chan struct{}, 1),
		syncKick:  make(chan struct{}, 1),
	}
	c.st.node = cfg.Node
	if cfg.OnlySubscribed {
		c.st.all = false // an empty Services is nothing, not everything
	}
	c.st.reassertDelay = c.backoff
	// An endpoint re-asserted again within this long is being fought over
	// or keeps being dropped; past it, a loss is a new incident.
	c.st.reassertQuiet = 2 * cfg.BackoffMax
	c.view.Store(&view{all: c.st.all, services: map[string][]*registryv1.ServiceEndpoint{}, wanted: cfg.Services})
	now := time.Now()
	c.staleSince.Store(&now)

	// The client's own reconnect policy is the stream loop's; gRPC's
	// per-connection backoff (default up to two minutes) is kept within
	// the same bounds so it never holds a restarted registrar back longer.
	// Keepalive finds a dead peer on an otherwise silent stream (the
	// registrar allows pings every 5s).
	opts := []grpc.DialOption{
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: cfg.BackoffBase, Multiplier: 1.6, Jitter: 0.2, MaxDelay: cfg.BackoffMax},
			MinConnectTimeout: 5 * time.Second,
		}),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second}),
	}
	opts = append(opts, FlowControl()...)
	if cfg.DialOptions == nil {
		opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	} else {
		opts = append(opts, cfg.DialOptions...)
	}
	for _, addr := range cfg.Addrs {
		// NewClient does not connect; an unreachable registrar only shows
		// as failed calls, which the loops handle.
		conn, err := grpc.NewClient(addr, opts...)
		if err != nil {
			c.closeConns()
			return nil, fmt.Errorf("client: registrar address %q: %w", addr, err)
		}
		c.conns = append(c.conns, conn)
		c.rpc = append(c.rpc, registrarv1.NewRegistrarClient(conn))
	}
	c.metrics = newMetrics(c)
	if cfg.Registerer != nil {
		if err := c.metrics.register(cfg.Registerer); err != nil {
			c.closeConns()
			return nil, err
		}
	}

	c.ctx, c.cancel = context.WithCancel(context.Background())
	n := 2
	if cfg.OnChange != nil {
		c.notify = newNotifier(cfg.OnChange)
		n++
	}
	c.wg.Add(n)
	go c.runStream(c.ctx)
	go c.runWriter(c.ctx)
	if c.notify != nil {
		go func() { defer c.wg.Done(); c.notify.run(c.ctx) }()
	}
	return c, nil
}

// Endpoints returns the endpoints of a service. For a cached service this
// is a lock-free lookup returning a slice shared with other readers: do not
// modify it or the endpoints in it. Before the first snapshot, and for a
// service this client does not subscribe to, it asks a registrar
// (ListAllEndpoints) and overlays the agent's own pending writes, so it
// never answers "none" for a service it knows nothing about.
func (c *Client) Endpoints(ctx context.Context, service string) ([]*registryv1.ServiceEndpoint, error) {
	v := c.view.Load()
	if eps, ok := v.services[service]; ok {
		return eps, nil
	}
	if v.all && v.synced {
		// Cached, and the service has no endpoints (or is not a name).
		if err := registry.ValidateName("service", service); err != nil {
			return nil, fmt.Errorf("client: %w", err)
		}
		return nil, nil
	}
	return c.fallback(ctx, []string{service})
}

// AllEndpoints returns the endpoints of every watched service (all services,
// or the subscribed ones), ordered by service and identity. The slice is the
// caller's; the endpoints are shared and must not be modified. Services not
// cached yet are fetched as in Endpoints.
func (c *Client) AllEndpoints(ctx context.Context) ([]*registryv1.ServiceEndpoint, error) {
	v := c.view.Load()
	var out []*registryv1.ServiceEndpoint
	if v.all {
		if !v.synced {
			return c.fallback(ctx, nil)
		}
		for _, svc := range slices.Sorted(maps.Keys(v.services)) {
			out = append(out, v.services[svc]...)
		}
		return out, nil
	}
	var missing []string
	for _, svc := range v.wanted {
		if eps, ok := v.services[svc]; ok {
			out = append(out, eps...)
		} else {
			missing = append(missing, svc)
		}
	}
	if len(missing) > 0 {
		more, err := c.fallback(ctx, missing)
		if err != nil {
			return nil, err
		}
		out = append(out, more...)
		slices.SortStableFunc(out, compareEndpoints)
	}
	return out, nil
}

// fallback lists services (all when empty) from a registrar, starting with
// the current one and moving on while they are unavailable.
func (c *Client) fallback(ctx context.Context, services []string) ([]*registryv1.ServiceEndpoint, error) {
	if c.ctx.Err() != nil {
		return nil, ErrClosed
	}
	c.stats.fallbacks.Add(1)
	var out []*registryv1.ServiceEndpoint
	err := c.eachRegistrar(ctx, rpcTimeout, func(ctx context.Context, idx int) error {
		resp, err := c.rpc[idx].ListAllEndpoints(ctx, &registrarv1.ListAllEndpointsRequest{Services: services})
		if err != nil {
			return fmt.Errorf("client: listing services %v from %s: %w", services, c.cfg.Addrs[idx], err)
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		out = c.st.overlay(resp.GetEndpoints(), services)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Subscribe adds services to the watched set, on the live stream (no
// reconnect). Their endpoints are cached, and reported to OnChange as added,
// once the registrar's SERVICES_SNAPSHOT arrives; until then reads of them
// fall back to the RPC.
func (c *Client) Subscribe(services ...string) error {
	if err := c.checkServices(services); err != nil {
		return fmt.Errorf("client: subscribe: %w", err)
	}
	c.mu.Lock()
	c.st.subscribe(services)
	c.commitLocked()
	c.mu.Unlock()
	c.kick(c.subKick)
	return nil
}

// Unsubscribe removes services from the watched set, on the live stream.
// They leave the cache at once and OnChange gets a REMOVED for each of their
// endpoints, so a consumer mirroring OnChange stays equal to the cache.
// Unsubscribing every service is an error, as an empty set would mean
// "all" on the wire, unless the client is Config.OnlySubscribed: then it
// ends the stream.
func (c *Client) Unsubscribe(services ...string) error {
	if err := c.checkServices(services); err != nil {
		return fmt.Errorf("client: unsubscribe: %w", err)
	}
	c.mu.Lock()
	left := 0
	for svc := range c.st.wanted {
		if !slices.Contains(services, svc) {
			left++
		}
	}
	if left == 0 && !c.cfg.OnlySubscribed {
		c.mu.Unlock()
		return errors.New("client: unsubscribe: a client must keep at least one service (an empty list means all services); Close it instead")
	}
	c.st.unsubscribe(services)
	c.commitLocked()
	c.mu.Unlock()
	c.kick(c.subKick)
	return nil
}

func (c *Client) checkServices(services []string) error {
	if c.st.all {
		return ErrWatchingAll
	}
	if c.ctx.Err() != nil {
		return ErrClosed
	}
	for i, svc := range services {
		if err := registry.ValidateName(fmt.Sprintf("services[%d]", i), svc); err != nil {
			return err
		}
	}
	return nil
}

// Services are the services this client watches, sorted: Config.Services
// as changed by Subscribe and Unsubscribe since, or nil for a client that
// watches all services. The slice is the caller's.
func (c *Client) Services() []string {
	v := c.view.Load()
	if v.all {
		return nil
	}
	return append([]string{}, v.wanted...) // empty, not nil: nothing, not all
}

// WaitSynced waits until the first snapshot has been applied, so reads are
// served from the cache.
func (c *Client) WaitSynced(ctx context.Context) error {
	select {
	case <-c.synced:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("client: waiting for the first snapshot from %v: %w", c.cfg.Addrs, ctx.Err())
	case <-c.ctx.Done():
		return ErrClosed
	}
}

// CacheAge is 0 while the stream is connected and synced, and otherwise how
// long the cache has been stale: since the stream was last synced, or since
// New if it never was.
func (c *Client) CacheAge() time.Duration {
	if t := c.staleSince.Load(); t != nil {
		return time.Since(*t)
	}
	return 0
}

// Connected reports whether the stream is connected and synced; for an
// OnlySubscribed client that wants no service, which needs no stream,
// whether it has nothing to fetch.
func (c *Client) Connected() bool { return c.staleSince.Load() == nil }

// Close stops the stream and the writer and closes the connections. It does
// not wait for writes to be acknowledged (call Flush first); if some are
// not, it says how many. OnChange is not called after Close returns.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.cancel()
		c.wg.Wait()
		c.closeConns()
		c.metrics.unregister()
		c.markStale()
		if n := c.PendingWrites(); n > 0 {
			c.closeErr = fmt.Errorf("client: closed with %d writes not acknowledged by a registrar (call Flush before Close)", n)
		}
	})
	return c.closeErr
}

func (c *Client) closeConns() {
	for _, conn := range c.conns {
		_ = conn.Close()
	}
}

// current is the index of the registrar in use.
func (c *Client) current() int { return int(c.addr.Load()) % len(c.rpc) }

// commitLocked publishes the view after a mutation and queues its changes
// for OnChange, under the same lock, so notifications are in view order.
func (c *Client) commitLocked() {
	if nv := c.st.nextView(c.view.Load()); nv != c.view.Load() {
		c.view.Store(nv)
	}
	if chs := c.st.takeChanges(); len(chs) > 0 && c.notify != nil {
		c.notify.push(chs)
	}
	if c.st.dueChanged {
		// The writer sleeps until the next deadline it knows of; a new
		// one may be earlier.
		c.st.dueChanged = false
		c.kick(c.writeKick)
	}
	if ids := c.st.takeReasserted(); len(ids) > 0 {
		c.metrics.reasserted.Add(float64(len(ids)))
		c.stats.reasserted.Add(int64(len(ids)))
		sample := make([]string, 0, min(len(ids), 5))
		for _, id := range ids[:cap(sample)] {
			sample = append(sample, id.String())
		}
		c.log.Info("re-asserting registrations the registrar lacks or changed", "endpoints", len(ids), "first", sample, "version", c.st.version)
		c.kick(c.writeKick)
	}
}

// markSynced records that the stream is current.
func (c *Client) markSynced() {
	c.staleSince.Store(nil)
	c.syncOnce.Do(func() { close(c.synced) })
	c.kick(c.syncKick)
}

// markStale records that the stream stopped being current, keeping the
// earlier time if it already was stale.
func (c *Client) markStale() {
	now := time.Now()
	c.staleSince.CompareAndSwap(nil, &now)
}

func (c *Client) kick(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// FlowControl are the HTTP/2 flow-control settings of the client's
// connections: fixed receive windows (1 MiB per stream, 8 MiB per
// connection) in place of gRPC's default 64 KiB windows grown by
// bandwidth-delay-product probing. A watch stream receives a steady
// trickle of small messages; with probing, nearly every message received
// answers with a BDP ping or a window update, which costs the agent and
// the registrar a write and a read each (AETHER_BENCH_PROFILE shows it in
// the fan-out scenario's load generator). With fixed windows a window
// update goes out once per quarter window consumed. The windows bound what
// a registrar may have in flight to a slow reader, not what is allocated.
func FlowControl() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithInitialWindowSize(1 << 20), grpc.WithInitialConnWindowSize(8 << 20)}
}
