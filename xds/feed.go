package xds

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/retry"
	"github.com/aethermesh/aether/registrar/replica"
	"github.com/aethermesh/aether/registry"
)

// Source is what the feed subscribes to: the registrar's in-process
// Subscribe (registrar.Registrar has it), named here over package
// replica's types so that xds does not import the registrar.
type Source interface {
	Subscribe(services []string, fromVersion string) (*replica.Subscription, error)
}

// DefaultMaxLocalities bounds the consumer localities the feed keeps a
// snapshot for (see FeedConfig.MaxLocalities).
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
	// MaxLocalities bounds the snapshots kept, one per consumer locality:
	// a node's locality is what it claims, so without a bound any client
	// could make the feed build and keep snapshots without end. A node of
	// a locality beyond the bound is served the snapshot of Own (and a
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

// Feed keeps a go-control-plane SnapshotCache current from an in-process
// subscription to all services.
//
// Why a SnapshotCache: the load assignments differ per consumer locality
// (the priorities are relative to the consumer), and the SnapshotCache
// is the cache that keys its contents by node (NodeHash, here the node's
// locality); a LinearCache holds one set of resources for every client.
// The SnapshotCache still scopes what a client gets to what it asks for:
// a state-of-the-world request naming resources is answered with those
// alone, and a delta stream gets what it subscribed to. It runs with
// ads=false: with ads=true it answers a request only when the request
// names every resource of that type in the snapshot, which a client
// asking for its one target never does. Its cost: a state-of-the-world
// version is per type, so any endpoint change re-sends every SOTW
// client's load assignments, unchanged ones included (delta clients get
// only what changed). Per-resource versions, a LinearCache per locality
// behind a cache that dispatches by node, are the remedy if the fan-out
// benchmark of issue 14 asks for it.
//
// Versions: every change the feed applies takes the next number of a
// sequence prefixed by the feed's incarnation (a random token drawn at
// NewFeed), so versions only grow within a feed and never repeat across
// restarts, where a client resuming with "7" must not be told it is up
// to date by a feed whose 7 is another state. A snapshot's Listener,
// RouteConfiguration and Cluster versions move only when the set of
// targets changes (their contents are functions of the target's name);
// its ClusterLoadAssignment version moves with every change of
// endpoints. Delta streams compare per-resource hashes instead
// (go-control-plane's version map), so they get only what changed.
type Feed struct {
	cfg   FeedConfig
	log   *slog.Logger
	cache cachev3.SnapshotCache
	epoch string

	// locMu guards wanted alone and is never held while calling the
	// cache: NodeHash.ID runs under the cache's lock and takes it.
	locMu  sync.RWMutex
	wanted map[Locality]bool
	warned map[Locality]bool

	// mu orders the rebuilds and SetSnapshot calls of the feed's
	// goroutine with the lazy creation of a new locality's snapshot.
	mu       sync.Mutex
	loaded   bool // the first start has been applied
	eps      map[string]map[registry.EndpointID]*registryv1.ServiceEndpoint
	targets  map[string][]Target // by service
	shared   map[string][3]types.Resource
	cla      map[Locality]map[string]types.Resource // by target name
	seq      uint64
	lrcVer   string // version of the Listeners, Routes and Clusters
	edsVer   string
	inFull   bool // applying a FULL_SNAPSHOT that continues
	inSvcSnp bool // applying a SERVICES_SNAPSHOT that continues

	stop context.CancelFunc
	done chan struct{}
}

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
		wanted:  map[Locality]bool{cfg.Own: true},
		warned:  map[Locality]bool{},
		eps:     map[string]map[registry.EndpointID]*registryv1.ServiceEndpoint{},
		targets: map[string][]Target{},
		shared:  map[string][3]types.Resource{},
		cla:     map[Locality]map[string]types.Resource{},
	}
	f.cache = cachev3.NewSnapshotCache(false, nodeHash{f}, cacheLogger{cfg.Logger})
	return f, nil
}

// Cache is the cache the feed keeps, for the server.
func (f *Feed) Cache() cachev3.SnapshotCache { return f.cache }

// Start runs the feed's goroutine until Close: subscribe to all services,
// apply the start and every batch, rebuild the changed services'
// resources, set the snapshots; on a cut, resume from the last version.
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
// last snapshots, so connected clients keep their configuration.
func (f *Feed) Close() {
	if f.stop == nil {
		return
	}
	f.stop()
	<-f.done
}

func (f *Feed) run(ctx context.Context) {
	last := ""
	for attempt := 0; ctx.Err() == nil; {
		sub, err := f.cfg.Source.Subscribe(nil, last)
		if err != nil {
			// ErrNotReady before the registrar has loaded, ErrShuttingDown
			// as it stops: the last snapshots stay served meanwhile.
			f.log.Debug("xds feed: subscribe failed, retrying", "err", err, "attempt", attempt)
			retry.Sleep(ctx, f.cfg.Backoff.Ceiling(attempt), nil)
			attempt++
			continue
		}
		attempt = 0
		start := sub.TakeStart()
		f.mu.Lock()
		f.inFull, f.inSvcSnp = false, false
		if start.Resumed {
			f.applyLocked(start.Missed)
		} else {
			f.replaceLocked(start.Snapshot)
		}
		f.mu.Unlock()
		last = start.At.String()
		for {
			batch, err := sub.Next(ctx)
			if err != nil {
				if ctx.Err() == nil {
					f.log.Info("xds feed: subscription cut, resuming", "err", err, "from", last)
				}
				break
			}
			f.mu.Lock()
			f.applyLocked(batch)
			f.mu.Unlock()
			for _, ev := range batch {
				if ev.GetVersion() != "" {
					last = ev.GetVersion()
				}
			}
		}
		sub.Close()
	}
}

// Apply applies a batch of events in order, as the subscription loop
// does with a batch of its Subscription: the input of a feed without a
// Source. ADDED and UPDATED put the endpoint, REMOVED drops it, and the
// services touched are rebuilt once for the batch, so a caller that
// gathers what arrived while the last Apply ran pays one rebuild for it.
// The first call marks the feed loaded and sets the snapshots even when
// the batch is empty, so clients waiting for a first configuration get
// one.
func (f *Feed) Apply(batch []*registrarv1.EndpointEvent) {
	f.mu.Lock()
	defer f.mu.Unlock()
	first := !f.loaded
	f.applyLocked(batch)
	if first && len(f.cla) == 0 {
		f.rebuildLocked(map[string]bool{})
	}
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
	}
}

// rebuildLocked rebuilds the resources of the changed services, for the
// shared part and every wanted locality, and sets every snapshot.
func (f *Feed) rebuildLocked(changed map[string]bool) {
	f.seq++
	ver := f.epoch + "-" + strconv.FormatUint(f.seq, 10)
	f.cfg.metrics.changed(ver, time.Now()) // for xds_push_latency_seconds
	namesChanged := f.lrcVer == ""
	for svc := range changed {
		old := f.targets[svc]
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
		if !slices.EqualFunc(old, now, func(a, b Target) bool { return a.Name == b.Name }) {
			namesChanged = true
			for _, t := range old {
				delete(f.shared, t.Name)
				for _, m := range f.cla {
					delete(m, t.Name)
				}
			}
		}
		for _, t := range now {
			if _, ok := f.shared[t.Name]; !ok {
				f.shared[t.Name] = [3]types.Resource{Listener(t.Name), RouteConfig(t.Name), Cluster(t.Name)}
			}
			for loc, m := range f.cla {
				m[t.Name] = LoadAssignment(t, loc)
			}
		}
	}
	// A locality wanted since the last rebuild (ensure ran before the
	// first start was applied, or lost the race to this rebuild) gets all
	// its load assignments now.
	for _, loc := range f.localities() {
		if f.cla[loc] == nil {
			f.cla[loc] = f.assignmentsLocked(loc)
		}
	}
	if namesChanged {
		f.lrcVer = ver
	}
	f.edsVer = ver
	for loc := range f.cla {
		f.setLocked(loc)
	}
	f.cfg.metrics.resources(len(f.shared))
}

// setLocked sets the snapshot of one locality from what is built.
func (f *Feed) setLocked(loc Locality) {
	var lis, rts, cls, eds []types.Resource
	for _, r := range f.shared {
		lis, rts, cls = append(lis, r[0]), append(rts, r[1]), append(cls, r[2])
	}
	for _, r := range f.cla[loc] {
		eds = append(eds, r)
	}
	snap := &cachev3.Snapshot{}
	snap.Resources[types.Listener] = cachev3.NewResources(f.lrcVer, lis)
	snap.Resources[types.Route] = cachev3.NewResources(f.lrcVer, rts)
	snap.Resources[types.Cluster] = cachev3.NewResources(f.lrcVer, cls)
	snap.Resources[types.Endpoint] = cachev3.NewResources(f.edsVer, eds)
	if err := f.cache.SetSnapshot(context.Background(), localityKey(loc), snap); err != nil {
		f.log.Error("xds feed: set snapshot", "locality", loc.String(), "err", err)
		return
	}
	f.cfg.metrics.snapshots.Inc()
}

// localities are the wanted localities.
func (f *Feed) localities() []Locality {
	f.locMu.RLock()
	defer f.locMu.RUnlock()
	out := make([]Locality, 0, len(f.wanted))
	for l := range f.wanted {
		out = append(out, l)
	}
	return out
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

// ensure makes sure a node's locality has a snapshot, building it now
// from what the feed holds if it is new. The server calls it on every
// request, before go-control-plane opens the request's watch, so a
// client of a new locality is answered from its own snapshot at once.
func (f *Feed) ensure(n *corev3.Node) {
	loc := f.localityOf(n)
	// Every request passes here: the common case, a known locality, takes
	// the shared lock only.
	f.locMu.RLock()
	known := f.wanted[loc]
	f.locMu.RUnlock()
	if known {
		return
	}
	f.locMu.Lock()
	if f.wanted[loc] {
		f.locMu.Unlock()
		return
	}
	if len(f.wanted) >= f.cfg.MaxLocalities {
		if !f.warned[loc] {
			f.warned[loc] = true
			f.log.Warn("xds: too many consumer localities, serving this node as the registrar's own", "node", n.GetId(),
				"locality", loc.String(), "own", f.cfg.Own.String(), "max", f.cfg.MaxLocalities)
		}
		f.locMu.Unlock()
		return
	}
	f.wanted[loc] = true
	f.locMu.Unlock()

	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.cla[loc]; ok || !f.loaded {
		return // built by a rebuild meanwhile, or built at the first one
	}
	f.cla[loc] = f.assignmentsLocked(loc)
	f.setLocked(loc)
}

// assignmentsLocked builds the load assignments of every target for a
// consumer at loc.
func (f *Feed) assignmentsLocked(loc Locality) map[string]types.Resource {
	m := map[string]types.Resource{}
	for _, ts := range f.targets {
		for _, t := range ts {
			m[t.Name] = LoadAssignment(t, loc)
		}
	}
	return m
}

// nodeHash keys the cache by the node's locality (see Feed.ensure for
// the bound).
type nodeHash struct{ f *Feed }

func (h nodeHash) ID(n *corev3.Node) string {
	loc := h.f.localityOf(n)
	h.f.locMu.RLock()
	known := h.f.wanted[loc]
	h.f.locMu.RUnlock()
	if !known {
		loc = h.f.cfg.Own
	}
	return localityKey(loc)
}

// localityKey quotes both parts: a node's locality is whatever it sends,
// so a '/' in a region must not make it another locality's key.
func localityKey(l Locality) string {
	return strconv.Quote(l.Region) + "/" + strconv.Quote(l.Zone)
}

// cacheLogger sends go-control-plane's log lines to slog; its debug and
// info lines are per watch, so both go to Debug.
type cacheLogger struct{ l *slog.Logger }

func (c cacheLogger) Debugf(format string, args ...any) { c.l.Debug(fmt.Sprintf(format, args...)) }
func (c cacheLogger) Infof(format string, args ...any)  { c.l.Debug(fmt.Sprintf(format, args...)) }
func (c cacheLogger) Warnf(format string, args ...any)  { c.l.Warn(fmt.Sprintf(format, args...)) }
func (c cacheLogger) Errorf(format string, args ...any) { c.l.Error(fmt.Sprintf(format, args...)) }
