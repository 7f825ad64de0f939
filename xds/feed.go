package xds

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/retry"
	"github.com/aethermesh/aether/registrar/replica"
	"github.com/aethermesh/aether/registry"
)

// Source is what the feed subscribes to: the registrar's in-process
// Subscribe (registrar.Registrar has it), named here over package
// replica's types so that xds does not import the registrar.
type Source = replica.Subscriber

// DefaultMaxLocalities bounds the consumer localities the feed keeps an
// EDS cache for (see FeedConfig.MaxLocalities).
const DefaultMaxLocalities = 64

// FeedConfig configures a Feed.
type FeedConfig struct {
	// Source is the registrar's Subscribe, which Start follows. Nil for a
	// feed driven by Apply instead (the agent's, from its client cache's
	// OnChange): Start is then a no-op.
	Source Source
	// Own is the locality of a node that sends none in its xDS Node
	// (neither region nor zone): the locality of the process serving it.
	Own Locality
	// MaxLocalities bounds the EDS caches kept, one per consumer locality:
	// a node's locality is what it claims, so without a bound any client
	// could make the feed build and keep caches without end. A node of
	// a locality beyond the bound is served the cache of Own (and a
	// warning is logged once per locality). Zero means
	// DefaultMaxLocalities.
	MaxLocalities int
	Logger        *slog.Logger
	// Backoff spaces resubscriptions after the subscription could not be
	// started (the registrar not ready yet, shutting down). Zero values
	// take 50ms to 2s.
	Backoff retry.Backoff

	metrics *metrics
}

// Feed keeps per-resource caches current from an in-process
// subscription to all services: one go-control-plane LinearCache each
// for the Listeners, the RouteConfigurations and the Clusters (their
// contents are functions of a target's name, the same for every
// consumer), and one cache of ClusterLoadAssignments per consumer
// locality (the priorities are relative to the consumer), an edsCache:
// the LinearCache's answers, with watches that survive a stream's ACKs
// and resources marshalled once for all streams (see edsCache; the
// endpoints are what changes at 100 changes/s and what every stream
// watches 20 of). Cache (feedCache) dispatches a watch by its
// type, and an EDS watch by its node's locality.
//
// Why per-resource caches: they version each resource apart. A change of
// service S updates S's resources alone, and a cache wakes only the
// watches that name them (and wildcard ones), so a stream that does not
// watch S is sent nothing, and one that does is sent S's
// ClusterLoadAssignment alone: for EDS and RDS a state-of-the-world
// response carries only the changed resources (linear.go computeResponse:
// sotw must send the full state only for LDS and CDS, which it then
// does, every subscribed Listener or Cluster). The SnapshotCache this
// replaced had one version per type per snapshot, so every endpoint
// change anywhere re-sent every state-of-the-world EDS stream all its
// load assignments (issue 14's fan-out benchmark: 28× the native
// stream's CPU at 1k streams). Delta streams compare per-resource hashes
// in both.
//
// Order (issue 14: a cluster is never sent before the endpoints that
// make it usable, nor removed while a route still names it): a rebuild
// writes the caches bottom up for what is new or changed (the load
// assignments, then the Clusters, then the routes, then the Listeners),
// and top down for what goes (Listeners, routes, Clusters, then the load
// assignments). Each cache update answers its waiting watches before the
// next update starts, and the server's ADS streams send in the order
// answered (sotw.WithOrderedADS; go-control-plane's delta server has one
// FIFO per stream anyway), so a client watching all four sees the same
// order on the wire, and one that asks for a Cluster's endpoints after
// receiving it finds them in the cache.
//
// Versions: each cache's version is a sequence prefixed by the feed's
// incarnation (a random token drawn at NewFeed) and the cache's own tag,
// so versions only grow within a feed, never repeat across restarts
// (where a client resuming with "7" must not be told it is up to date by
// a feed whose 7 is another state), and name the cache they come from
// (which the push latency needs: a version maps to the change that made
// it). A cache answers a state-of-the-world request whose version
// lacks its prefix with everything asked for, and a request naming
// resources this stream was never sent, at once.
//
// Until the feed has applied its first start (or first Apply), watches
// are held, not answered (feedCache): an empty Listener answer would tell
// a grpc-go client its target does not exist.
type Feed struct {
	cfg   FeedConfig
	log   *slog.Logger
	epoch string
	cache *feedCache

	// mu orders the rebuilds of the feed's goroutine (or of Apply) with
	// the creation of a new locality's EDS cache; everything below is
	// guarded by it.
	mu       sync.Mutex
	loaded   bool // the first start has been applied
	eps      map[string]map[registry.EndpointID]*registryv1.ServiceEndpoint
	targets  map[string][]Target                                       // by service
	names    map[string]bool                                           // the target names served
	cla      map[Locality]map[string]*endpointv3.ClusterLoadAssignment // as last put in the locality's EDS cache
	lds      *linear
	rds      *linear
	cds      *linear
	inFull   bool // applying a FULL_SNAPSHOT that continues
	inSvcSnp bool // applying a SERVICES_SNAPSHOT that continues

	// locMu guards eds and warned; eds is written under mu as well, so a
	// rebuild reads it under mu alone, and a watch (feedCache) under
	// locMu alone, never waiting for a rebuild.
	locMu  sync.RWMutex
	eds    map[Locality]*linear
	warned map[Locality]bool

	stop context.CancelFunc
	done chan struct{}
}

// linear is a cache (a LinearCache or an edsCache) and the version it is
// at. The cache moves its version by one per update call and does not
// export it; the feed is its only writer and counts along, so that it
// knows, before an update answers any watch, the version the answers
// will carry.
type linear struct {
	c      resCache
	prefix string
	n      uint64
}

func newLinear(typeURL, prefix string, log cacheLogger) *linear {
	return &linear{c: cachev3.NewLinearCache(typeURL, cachev3.WithVersionPrefix(prefix), cachev3.WithLogger(log)), prefix: prefix}
}

func (l *linear) version() string { return l.prefix + strconv.FormatUint(l.n, 10) }

// NewFeed returns a feed that is not yet running (see Start).
func NewFeed(cfg FeedConfig) (*Feed, error) {
	if cfg.MaxLocalities <= 0 {
		cfg.MaxLocalities = DefaultMaxLocalities
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Backoff.Base <= 0 || cfg.Backoff.Max <= 0 {
		cfg.Backoff = retry.Backoff{Base: 50 * time.Millisecond, Max: 2 * time.Second}
	}
	if cfg.metrics == nil {
		cfg.metrics = newMetrics()
	}
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("xds: draw the feed's version epoch: %w", err)
	}
	f := &Feed{
		cfg:     cfg,
		log:     cfg.Logger,
		epoch:   hex.EncodeToString(b[:]),
		eps:     map[string]map[registry.EndpointID]*registryv1.ServiceEndpoint{},
		targets: map[string][]Target{},
		names:   map[string]bool{},
		cla:     map[Locality]map[string]*endpointv3.ClusterLoadAssignment{},
		eds:     map[Locality]*linear{},
		warned:  map[Locality]bool{},
	}
	lg := cacheLogger{cfg.Logger}
	f.lds = newLinear(resourcev3.ListenerType, f.epoch+"-l-", lg)
	f.rds = newLinear(resourcev3.RouteType, f.epoch+"-r-", lg)
	f.cds = newLinear(resourcev3.ClusterType, f.epoch+"-c-", lg)
	f.eds[cfg.Own] = f.newEDS(0)
	f.cla[cfg.Own] = map[string]*endpointv3.ClusterLoadAssignment{}
	f.cache = &feedCache{f: f, held: map[*heldWatch]struct{}{}}
	return f, nil
}

// newEDS is the EDS cache of the i-th locality wanted. The tag ends in
// '-' so that no cache's prefix is another's ("e1-" is not a prefix of
// "e12-7").
func (f *Feed) newEDS(i int) *linear {
	prefix := f.epoch + "-e" + strconv.Itoa(i) + "-"
	return &linear{c: newEDSCache(resourcev3.EndpointType, prefix), prefix: prefix}
}

// Cache is the cache the feed keeps, for the server: go-control-plane's
// Cache interface over the feed's caches.
func (f *Feed) Cache() cachev3.Cache { return f.cache }

// Start runs the feed's goroutine until Close: subscribe to all services,
// apply the start and every batch, rebuild the changed services'
// resources, update the caches; on a cut, resume from the last version.
func (f *Feed) Start() {
	if f.cfg.Source == nil {
		return // fed by Apply
	}
	ctx, cancel := context.WithCancel(context.Background())
	f.stop, f.done = cancel, make(chan struct{})
	go func() {
		defer close(f.done)
		f.run(ctx)
	}()
}

// Close stops the feed and waits for its goroutine. The cache keeps the
// last resources, so connected clients keep their configuration.
func (f *Feed) Close() {
	if f.stop == nil {
		return
	}
	f.stop()
	<-f.done
}

func (f *Feed) run(ctx context.Context) {
	// Until the next start the last resources stay served, through
	// refusals (ErrNotReady, ErrShuttingDown) and cuts alike.
	replica.Follow(ctx, f.cfg.Source, nil, replica.Follower{
		Name: "xds feed", Log: f.log, Backoff: f.cfg.Backoff,
		Start: func(start replica.Start) {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.inFull, f.inSvcSnp = false, false
			if start.Resumed {
				f.applyLocked(start.Missed)
			} else {
				f.replaceLocked(start.Snapshot)
			}
		},
		Batch: f.Apply,
	})
}

// Apply applies a batch of events in order, as the subscription loop
// does with a batch of its Subscription: the input of a feed without a
// Source. ADDED and UPDATED put the endpoint, REMOVED drops it, and the
// services touched are rebuilt once for the batch, so a caller that
// gathers what arrived while the last Apply ran pays one rebuild for it.
// The first call marks the feed loaded and releases the watches held
// until then even when the batch is empty, so clients waiting for a
// first configuration get one.
func (f *Feed) Apply(batch []*registrarv1.EndpointEvent) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.applyLocked(batch)
}

// replaceLocked replaces everything held with a snapshot.
func (f *Feed) replaceLocked(snap []*registryv1.ServiceEndpoint) {
	changed := map[string]bool{}
	for svc := range f.eps {
		changed[svc] = true
	}
	f.eps = map[string]map[registry.EndpointID]*registryv1.ServiceEndpoint{}
	for _, ep := range snap {
		f.putLocked(ep)
		changed[ep.GetService()] = true
	}
	f.loaded = true
	f.rebuildLocked(changed)
}

func (f *Feed) putLocked(ep *registryv1.ServiceEndpoint) {
	m := f.eps[ep.GetService()]
	if m == nil {
		m = map[registry.EndpointID]*registryv1.ServiceEndpoint{}
		f.eps[ep.GetService()] = m
	}
	m[registry.IDOf(ep)] = ep
}

// applyLocked applies a batch of events (in sequence order) and rebuilds
// the services they touched, once for the batch.
func (f *Feed) applyLocked(batch []*registrarv1.EndpointEvent) {
	changed := map[string]bool{}
	for _, ev := range batch {
		switch ev.GetType() {
		case registrarv1.EndpointEvent_ENDPOINT_ADDED, registrarv1.EndpointEvent_ENDPOINT_UPDATED:
			f.putLocked(ev.GetEndpoint())
			changed[ev.GetEndpoint().GetService()] = true
		case registrarv1.EndpointEvent_ENDPOINT_REMOVED:
			svc := ev.GetEndpoint().GetService()
			if m := f.eps[svc]; m != nil {
				delete(m, registry.IDOf(ev.GetEndpoint()))
				if len(m) == 0 {
					delete(f.eps, svc)
				}
			}
			changed[svc] = true
		case registrarv1.EndpointEvent_FULL_SNAPSHOT:
			// A snapshot may come in chunks; the first replaces all.
			if !f.inFull {
				for svc := range f.eps {
					changed[svc] = true
				}
				f.eps = map[string]map[registry.EndpointID]*registryv1.ServiceEndpoint{}
			}
			for _, ep := range ev.GetEndpoints() {
				f.putLocked(ep)
				changed[ep.GetService()] = true
			}
			f.inFull = ev.GetSnapshotContinues()
		case registrarv1.EndpointEvent_SERVICES_SNAPSHOT:
			if !f.inSvcSnp {
				for _, svc := range ev.GetServices() {
					delete(f.eps, svc)
					changed[svc] = true
				}
			}
			for _, ep := range ev.GetEndpoints() {
				f.putLocked(ep)
				changed[ep.GetService()] = true
			}
			f.inSvcSnp = ev.GetSnapshotContinues()
		}
	}
	f.loaded = true
	if len(changed) > 0 {
		f.rebuildLocked(changed)
	} else {
		f.cache.release() // loaded, though nothing changed
	}
}

// rebuildLocked rebuilds the resources of the changed services and
// writes what differs into the caches, in the order the Feed's comment
// gives; the first rebuild releases the watches held until then.
func (f *Feed) rebuildLocked(changed map[string]bool) {
	at := time.Now()
	updated := map[string]Target{} // the changed services' targets, by name
	var added, removed []string
	for svc := range changed {
		old := map[string]bool{}
		for _, t := range f.targets[svc] {
			old[t.Name] = true
		}
		var eps []*registryv1.ServiceEndpoint
		for _, ep := range f.eps[svc] {
			eps = append(eps, ep)
		}
		now := Targets(svc, eps)
		if len(now) == 0 {
			delete(f.targets, svc)
		} else {
			f.targets[svc] = now
		}
		for _, t := range now {
			updated[t.Name] = t
			if !old[t.Name] {
				added = append(added, t.Name)
			}
			delete(old, t.Name)
		}
		for name := range old {
			removed = append(removed, name)
		}
	}
	slices.Sort(added)
	slices.Sort(removed)

	// The endpoints first: a Cluster sent next finds its load assignment
	// already there.
	for loc, l := range f.eds {
		f.putAssignmentsLocked(loc, l, updated, at)
	}
	if len(added) > 0 {
		lis, rts, cls := map[string]types.Resource{}, map[string]types.Resource{}, map[string]types.Resource{}
		for _, name := range added {
			lis[name], rts[name], cls[name] = Listener(name), RouteConfig(name), Cluster(name)
			f.names[name] = true
		}
		f.updateLocked(f.cds, cls, nil, at)
		f.updateLocked(f.rds, rts, nil, at)
		f.updateLocked(f.lds, lis, nil, at)
	}
	if len(removed) > 0 {
		// What names a target goes before it: the Listener (a grpc-go
		// client drops its target's route with it), the route, the
		// Cluster, then its endpoints.
		f.updateLocked(f.lds, nil, removed, at)
		f.updateLocked(f.rds, nil, removed, at)
		f.updateLocked(f.cds, nil, removed, at)
		for loc, l := range f.eds {
			for _, name := range removed {
				delete(f.cla[loc], name)
			}
			f.updateLocked(l, nil, removed, at)
		}
		for _, name := range removed {
			delete(f.names, name)
		}
	}
	f.cfg.metrics.resources(len(f.names))
	f.cache.release()
}

// putAssignmentsLocked puts into loc's EDS cache the load assignments of
// ts that differ from what it holds: an unchanged one (an event that
// moved nothing a consumer at loc sees) wakes no watch.
func (f *Feed) putAssignmentsLocked(loc Locality, l *linear, ts map[string]Target, at time.Time) {
	held := f.cla[loc]
	put := map[string]types.Resource{}
	for name, t := range ts {
		cla := LoadAssignment(t, loc)
		if old, ok := held[name]; ok && proto.Equal(old, cla) {
			continue
		}
		held[name] = cla
		put[name] = cla
	}
	f.updateLocked(l, put, nil, at)
}

// updateLocked writes one cache, if there is anything to write. The
// version the update makes is recorded first: the watches it answers are
// sent from their streams' goroutines, which may look it up at once
// (xds_push_latency_seconds).
func (f *Feed) updateLocked(l *linear, put map[string]types.Resource, del []string, at time.Time) {
	if len(put) == 0 && len(del) == 0 {
		return
	}
	l.n++
	f.cfg.metrics.changed(l.version(), at)
	// The cache moves its version even when it fails, which it
	// does only if a resource does not marshal: then no watch is
	// answered with it, and the next update retries.
	if err := l.c.UpdateResources(put, del); err != nil {
		f.log.Error("xds feed: update cache", "version", l.version(), "err", err)
		return
	}
	f.cfg.metrics.snapshots.Inc()
}

// allTargetsLocked is every target held, by name.
func (f *Feed) allTargetsLocked() map[string]Target {
	m := map[string]Target{}
	for _, ts := range f.targets {
		for _, t := range ts {
			m[t.Name] = t
		}
	}
	return m
}

// localityOf is the locality a node is served as: the one it sends, else
// the feed's own.
func (f *Feed) localityOf(n *corev3.Node) Locality {
	l := Locality{Region: n.GetLocality().GetRegion(), Zone: n.GetLocality().GetZone()}
	if l.Region == "" && l.Zone == "" {
		return f.cfg.Own
	}
	return l
}

// edsOf is the EDS cache a node is served from: its locality's, or, for
// a locality beyond the bound, the feed's own.
func (f *Feed) edsOf(n *corev3.Node) *linear {
	loc := f.localityOf(n)
	f.locMu.RLock()
	defer f.locMu.RUnlock()
	if l := f.eds[loc]; l != nil {
		return l
	}
	return f.eds[f.cfg.Own]
}

// ensure makes sure a node's locality has an EDS cache, building its
// load assignments now from what the feed holds if it is new. The server
// calls it on every request, before go-control-plane opens the request's
// watch, so a client of a new locality is answered from its own cache at
// once.
func (f *Feed) ensure(n *corev3.Node) {
	loc := f.localityOf(n)
	// Every request passes here: the common case, a known locality, takes
	// the shared lock only.
	f.locMu.RLock()
	known := f.eds[loc] != nil
	f.locMu.RUnlock()
	if known {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.locMu.Lock()
	if f.eds[loc] != nil {
		f.locMu.Unlock()
		return // made by another request meanwhile
	}
	if len(f.eds) >= f.cfg.MaxLocalities {
		if !f.warned[loc] {
			f.warned[loc] = true
			f.log.Warn("xds: too many consumer localities, serving this node as the registrar's own", "node", n.GetId(),
				"locality", loc.String(), "own", f.cfg.Own.String(), "max", f.cfg.MaxLocalities)
		}
		f.locMu.Unlock()
		return
	}
	l := f.newEDS(len(f.eds))
	f.locMu.Unlock()
	// Filled before it is published: no watch sees it half built. Before
	// the first start it stays empty, and the first rebuild fills it.
	f.cla[loc] = map[string]*endpointv3.ClusterLoadAssignment{}
	f.putAssignmentsLocked(loc, l, f.allTargetsLocked(), time.Now())
	f.locMu.Lock()
	f.eds[loc] = l
	f.locMu.Unlock()
}

// feedCache is go-control-plane's Cache over the feed's caches: a
// watch goes to the cache of its type (EDS: of its node's locality), or,
// before the feed has loaded, waits in held.
type feedCache struct {
	f *Feed

	mu     sync.Mutex
	loaded bool
	held   map[*heldWatch]struct{}
}

var _ cachev3.Cache = (*feedCache)(nil)

// heldWatch is a watch asked for before the feed loaded: start opens it
// on its cache, unless the server cancelled it first.
type heldWatch struct {
	start func() func()

	mu       sync.Mutex
	done     bool   // cancelled
	cancelFn func() // the opened watch's, once started
}

func (h *heldWatch) open() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.done {
		h.cancelFn = h.start()
	}
}

func (h *heldWatch) cancel() {
	h.mu.Lock()
	h.done = true
	c := h.cancelFn
	h.mu.Unlock()
	if c != nil {
		c()
	}
}

// hold returns nil once loaded, else holds a watch that start opens on
// release, and returns its cancel.
func (c *feedCache) hold(start func() func()) func() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.loaded {
		return nil
	}
	h := &heldWatch{start: start}
	c.held[h] = struct{}{}
	return func() {
		c.mu.Lock()
		delete(c.held, h)
		c.mu.Unlock()
		h.cancel()
	}
}

// release opens the held watches, once the caches hold the first start.
// The caches answer them from the caller's goroutine (the feed's), into
// the streams' buffered channels.
func (c *feedCache) release() {
	c.mu.Lock()
	if c.loaded {
		c.mu.Unlock()
		return
	}
	c.loaded = true
	held := c.held
	c.held = nil
	c.mu.Unlock()
	for h := range held {
		h.open()
	}
}

// of is the cache of a type for a node; nil for a type the feed
// does not serve.
func (c *feedCache) of(typeURL string, n *corev3.Node) resCache {
	switch typeURL {
	case resourcev3.ListenerType:
		return c.f.lds.c
	case resourcev3.RouteType:
		return c.f.rds.c
	case resourcev3.ClusterType:
		return c.f.cds.c
	case resourcev3.EndpointType:
		return c.f.edsOf(n).c
	}
	return nil
}

// CreateWatch opens a state-of-the-world watch. A type the feed does not
// serve gets a watch that never answers (as a SnapshotCache does): the
// stream stays up for the types it does serve.
func (c *feedCache) CreateWatch(req *cachev3.Request, sub cachev3.Subscription, out chan cachev3.Response) (func(), error) {
	lc := c.of(req.GetTypeUrl(), req.GetNode())
	if lc == nil {
		return func() {}, nil
	}
	start := func() func() {
		cancel, e := lc.CreateWatch(req, sub, out)
		if e != nil {
			// Only a type mismatch fails, which of rules out.
			c.f.log.Error("xds: open a held watch", "type", req.GetTypeUrl(), "err", e)
		}
		return cancel
	}
	if cancel := c.hold(start); cancel != nil {
		return cancel, nil
	}
	cancel, err := lc.CreateWatch(req, sub, out)
	if err != nil {
		return nil, fmt.Errorf("xds: watch %s: %w", req.GetTypeUrl(), err)
	}
	return cancel, nil
}

// CreateDeltaWatch opens a delta watch, as CreateWatch.
func (c *feedCache) CreateDeltaWatch(req *cachev3.DeltaRequest, sub cachev3.Subscription, out chan cachev3.DeltaResponse) (func(), error) {
	lc := c.of(req.GetTypeUrl(), req.GetNode())
	if lc == nil {
		return nil, nil
	}
	start := func() func() {
		cancel, e := lc.CreateDeltaWatch(req, sub, out)
		if e != nil {
			c.f.log.Error("xds: open a held delta watch", "type", req.GetTypeUrl(), "err", e)
		}
		return cancel
	}
	if cancel := c.hold(start); cancel != nil {
		return cancel, nil
	}
	cancel, err := lc.CreateDeltaWatch(req, sub, out)
	if err != nil {
		return nil, fmt.Errorf("xds: delta watch %s: %w", req.GetTypeUrl(), err)
	}
	return cancel, nil
}

// Fetch is the REST (polling) path, which the server does not register.
func (c *feedCache) Fetch(context.Context, *cachev3.Request) (cachev3.Response, error) {
	return nil, errors.New("xds: fetch is not served (the feed serves streams only)")
}

// cacheLogger sends go-control-plane's log lines to slog; its debug and
// info lines are per watch, so both go to Debug, and are formatted only
// when Debug is on: the LinearCache logs every watch it opens with its
// names and versions, under its lock, at every stream's every ACK.
type cacheLogger struct{ l *slog.Logger }

func (c cacheLogger) debug(format string, args []any) {
	if c.l.Enabled(context.Background(), slog.LevelDebug) {
		c.l.Debug(fmt.Sprintf(format, args...))
	}
}

func (c cacheLogger) Debugf(format string, args ...any) { c.debug(format, args) }
func (c cacheLogger) Infof(format string, args ...any)  { c.debug(format, args) }
func (c cacheLogger) Warnf(format string, args ...any)  { c.l.Warn(fmt.Sprintf(format, args...)) }
func (c cacheLogger) Errorf(format string, args ...any) { c.l.Error(fmt.Sprintf(format, args...)) }
