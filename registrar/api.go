package registrar

// The replica's in-process API: what a front end (the gRPC adapter in
// registrar/grpcapi, an xDS feed, a status page) calls on a *Registrar.
//
// Writes: Register/RegisterChecked, Unregister/UnregisterChecked/
// UnregisterStamped, Drain/DrainChecked apply a change to the snapshot at
// once, push it to subscribers and queue it for persistence (write-behind);
// they return the version the change is visible at. WaitPersisted waits
// for one of them to reach the backend. A WriteCheck attached to a write
// runs under the registrar's lock against the endpoint as stored, which is
// how a caller authorizes a write without a window for a concurrent change;
// OwnerCheck is the check that keeps a live node's endpoints its own.
//
// Reads: List (a snapshot and its version), ListNodes, Identity, Limits,
// Ready, PersistenceStatus.
//
// Watching: Subscribe returns a Subscription (replica.Subscription): its
// start, a snapshot or, when resumable, exactly the events missed since
// the given version; then its events in sequence order through Next. The
// start and the subscription's place in the event stream are taken in one
// critical section, so nothing falls between them. A subscription is cut
// when its consumer falls behind (ErrSlowConsumer) or the registrar shuts
// down (ErrShuttingDown); either way the subscriber resumes, here or on
// another replica, from the version of the last event it processed: a
// version of this incarnation still inside the --watch-history window
// yields exactly the missed events, anything else a fresh snapshot.
//
// Errors are the sentinels below (the same values as package replica's),
// matched with errors.Is; *registry.FieldError marks a request field that
// is invalid.

import (
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/registrar/internal/core"
	"github.com/aethermesh/aether/registrar/replica"
	"github.com/aethermesh/aether/registry"
)

// Errors of the API; see package replica for what each means.
var (
	ErrNotFound           = replica.ErrNotFound
	ErrQueueFull          = replica.ErrQueueFull
	ErrNodeFull           = replica.ErrNodeFull
	ErrOwned              = replica.ErrOwned
	ErrBackendUnavailable = replica.ErrBackendUnavailable
	ErrNoLeases           = replica.ErrNoLeases
	ErrNotPersisted       = replica.ErrNotPersisted
	ErrRefused            = replica.ErrRefused
	ErrNotReady           = replica.ErrNotReady
	ErrShuttingDown       = replica.ErrShuttingDown
	ErrSlowConsumer       = replica.ErrSlowConsumer
	ErrClosed             = replica.ErrClosed
	ErrBadVersion         = replica.ErrBadVersion
	ErrWatchesAll         = replica.ErrWatchesAll
	ErrTooManyServices    = replica.ErrTooManyServices
)

// Types of the API, defined in package replica so that a front end can
// name them without importing this package (see there).
type (
	Subscription      = replica.Subscription
	SubscriptionStart = replica.Start
	Identity          = replica.Identity
	Limits            = replica.Limits
	ServiceLimitError = replica.ServiceLimitError
)

// Identity is the origin this registrar writes for, and its zone.
func (r *Registrar) Identity() Identity {
	return Identity{Region: r.opts.Region, Cluster: r.opts.ClusterName, Zone: r.opts.Zone}
}

// Limits are the bounds a front end names in its refusals.
func (r *Registrar) Limits() Limits {
	return Limits{WatchBuffer: r.opts.WatchBuffer, MaxWatchServices: r.opts.MaxWatchServices, WriteQueueLimit: r.opts.WriteQueueLimit}
}

// HeartbeatInterval is how often a node should heartbeat: a third of the
// node TTL, so two heartbeats may be lost before its record lapses.
func (r *Registrar) HeartbeatInterval() time.Duration { return r.opts.NodeTTL / 3 }

// ShuttingDown reports whether EndStreams was called: subscriptions are
// being cut and new ones refused.
func (r *Registrar) ShuttingDown() bool {
	select {
	case <-r.closing:
		return true
	default:
		return false
	}
}

// MetricsRegistry is the registry of the registrar's metrics, for the
// process to serve at /metrics and to register its other collectors on
// (the gRPC adapter's, the replicator's).
func (r *Registrar) MetricsRegistry() *prometheus.Registry { return r.metrics.reg }

// Subscribe starts a subscription to the given services (all when empty),
// resuming from fromVersion ("" for none) when that is a version of this
// incarnation still retained; see Subscription for ordering and cuts, and
// the package's API notes above. It refuses invalid service names
// (*registry.FieldError, field "services"), more than Limits.MaxWatchServices
// services (*ServiceLimitError), a malformed version (ErrBadVersion), and
// any subscription before the snapshot is loaded (ErrNotReady) or once the
// registrar is shutting down (ErrShuttingDown).
func (r *Registrar) Subscribe(services []string, fromVersion string) (*Subscription, error) {
	f, err := newFilter(services)
	if err != nil {
		return nil, &registry.FieldError{Field: "services", Reason: err.Error()}
	}
	if max := r.opts.MaxWatchServices; len(f) > max {
		return nil, &ServiceLimitError{Services: len(f), Limit: max}
	}
	from, err := replica.ParseVersion(fromVersion)
	if err != nil {
		return nil, err
	}
	if !r.Ready() && !r.ShuttingDown() {
		return nil, ErrNotReady
	}
	sub, err := r.subscribe(f, from)
	if err != nil {
		return nil, err
	}
	if !sub.resumed {
		r.metrics.delivered(registrarv1.EndpointEvent_FULL_SNAPSHOT, 1)
	}
	start := SubscriptionStart{Resumed: sub.resumed, Snapshot: sub.snapshot, Missed: sub.missed,
		At: sub.at}
	return replica.NewSubscription(start, &source{r: r, w: sub.w}), nil
}

// subscription is what a new stream starts from: either a snapshot or the
// events it missed, then whatever arrives on w.
type subscription struct {
	w        *watcher
	snapshot []*registryv1.ServiceEndpoint // when resumed is false
	missed   []*registrarv1.EndpointEvent  // when resumed is true
	resumed  bool
	at       registry.Position
}

// subscribe registers a stream. Resuming from a token of this incarnation
// inside the retention window yields exactly the missed events; any other
// token yields a snapshot. Either way the watcher is added in the same
// critical section, so nothing falls between the start and the stream.
// Once the registrar is shutting down it refuses: under the lock, so a
// stream either sees closing here or is added before endSubscriptions
// takes the lock and cuts it.
func (r *Registrar) subscribe(f filter, from registry.Position) (*subscription, error) {
	w := newWatcher(f, r.opts.WatchBuffer)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ShuttingDown() {
		return nil, ErrShuttingDown
	}
	sub := &subscription{w: w, at: r.st.Version()}
	if from.Epoch == r.st.Epoch() {
		sub.missed, sub.resumed = r.st.Since(from.Seq, core.Filter(f))
	}
	if !sub.resumed {
		sub.snapshot, _ = r.st.Snapshot(core.Filter(f))
	}
	r.hub.add(w)
	return sub, nil
}

// endSubscriptions cuts every subscription with ErrShuttingDown; called
// once, after closing is closed, so no new one is added after it.
func (r *Registrar) endSubscriptions() {
	r.mu.Lock()
	r.hub.cutAll(ErrShuttingDown)
	r.mu.Unlock()
}

// updateFilter changes a live stream's services. Added services get a
// SERVICES_SNAPSHOT queued in order with the stream's events, so the client
// holds them as of that version and applies later events on top.
//
// The change is refused, and nothing changed, when the stream would then
// watch more than max services; n is the count it would have had.
func (r *Registrar) updateFilter(w *watcher, add, remove filter, max int) (n int, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if w.gone {
		return 0, true
	}
	n = len(w.f)
	for svc := range w.f {
		if _, rm := remove[svc]; rm {
			n--
		}
	}
	for svc := range add {
		_, had := w.f[svc]
		_, rm := remove[svc]
		if !had || rm {
			n++
		}
	}
	if max > 0 && n > max {
		return n, false
	}
	r.hub.remove(w)
	w.gone = false
	var added []string
	for svc := range remove {
		delete(w.f, svc)
	}
	for svc := range add {
		if _, ok := w.f[svc]; !ok {
			w.f[svc] = struct{}{}
			added = append(added, svc)
		}
	}
	r.hub.add(w)
	if len(added) == 0 {
		return n, true
	}
	sort.Strings(added)
	only := make(filter, len(added))
	for _, svc := range added {
		only[svc] = struct{}{}
	}
	eps, seq := r.st.Snapshot(core.Filter(only))
	r.hub.send(w, []*registrarv1.EndpointEvent{{
		Type:      registrarv1.EndpointEvent_SERVICES_SNAPSHOT,
		Version:   registry.Position{Epoch: r.st.Epoch(), Seq: seq}.String(),
		Epoch:     r.st.Epoch(),
		Sequence:  seq,
		Services:  added,
		Endpoints: eps,
	}})
	return n, true
}

func (r *Registrar) unsubscribe(w *watcher) {
	r.mu.Lock()
	r.hub.remove(w)
	r.mu.Unlock()
}

// source is a watcher as a subscription's replica.Source.
type source struct {
	r *Registrar
	w *watcher
}

func (s *source) Ready() <-chan struct{}                     { return s.w.ready }
func (s *source) Take() ([]*registrarv1.EndpointEvent, bool) { return s.w.next() }
func (s *source) Cut() <-chan struct{}                       { return s.w.evicted }

// Reason is read only after evicted is closed, which happens after cut set
// it: the channel's close orders the write before the read.
func (s *source) Reason() error { return s.w.reason }

func (s *source) Update(add, remove []string) error {
	// f is read without the lock: only updateFilter changes it, and the
	// subscription's updates come from one goroutine (see Subscription).
	if s.w.f.all() {
		return ErrWatchesAll
	}
	a, err := newFilter(add)
	if err != nil {
		return &registry.FieldError{Field: "add", Reason: err.Error()}
	}
	rm, err := newFilter(remove)
	if err != nil {
		return &registry.FieldError{Field: "remove", Reason: err.Error()}
	}
	max := s.r.opts.MaxWatchServices
	if n, ok := s.r.updateFilter(s.w, a, rm, max); !ok {
		return &ServiceLimitError{Services: n, Limit: max}
	}
	return nil
}

func (s *source) Close() {
	s.r.mu.Lock()
	s.r.hub.cut(s.w, ErrClosed)
	s.r.mu.Unlock()
}

// Now is the replica's clock, so that ages a process reports about it
// (readiness) are on the same clock as the times it records.
func (r *Registrar) Now() time.Time { return r.now() }

// Options are the options the replica runs with, defaults filled in and
// the sync mode resolved against the backend's capabilities.
func (r *Registrar) Options() Options { return r.opts }

// Nodes are the node records this replica holds, as stored: shared, so the
// caller must not modify them. Unlike ListNodes it asks the backend
// nothing (no lease lookups), so it answers at once while the backend is
// slow or unreachable: what a status page counts nodes with.
func (r *Registrar) Nodes() []*registryv1.Node {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.st.Nodes()
}

// Version is the position of the replica's latest event: its epoch and
// a sequence that grows by one per endpoint event. Unlike List it copies
// nothing, so a status page can sample it every second to count events.
func (r *Registrar) Version() registry.Position {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.st.Version()
}
