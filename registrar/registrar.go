package registrar

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/internal/retry"
	"github.com/aethermesh/aether/registrar/internal/core"
	"github.com/aethermesh/aether/registrar/replica"
	"github.com/aethermesh/aether/registry"
)

// Backend is a store with every capability of package backend, as the etcd
// backend (*etcdstore.Store) offers: what the registrar runs at its best on.
// New takes any backend.Store and uses what it finds of the rest:
//
//   - backend.Store: ApplyOrdered persists a batch so that per key the
//     newest stamp wins, safe to retry for the unsettled mutations after
//     an error; List the whole registry at one revision; GetEndpoint one
//     endpoint as held now, for a drain or unregister of an endpoint this
//     replica has not heard of; GetAt some values at a revision.
//   - backend.Watcher: the change feed after a revision. Without it the
//     registrar syncs by polling (SyncPoll).
//   - backend.Digester: the backstop's cheap listing, keys and mod
//     revisions read in parts paced by the caller, followed by GetAt of
//     the values that changed. Without it every backstop is a full List.
//   - backend.Leases: node liveness, leases and node records written under
//     them; a lease that is gone is reported as backend.ErrLeaseNotFound.
//     Without it node calls are refused (errNoLeases) and there is no
//     ghost sweep.
type Backend = backend.Full

// Registrar is one active-active replica: the snapshot, its streams, the
// write-behind flusher and the backend syncer. The state machine (state) is
// guarded by mu; the loops do I/O outside the lock.
type Registrar struct {
	opts    Options
	backend backend.Store
	// The store's optional capabilities, found once by New; nil for one it
	// lacks.
	watcher  backend.Watcher
	digester backend.Digester
	leases   backend.Leases
	log      *slog.Logger
	metrics  *metrics
	// clock is what the loops wait on; now is its Now (a test may stand
	// in another).
	clock Clock
	now   func() time.Time

	mu  sync.Mutex
	st  *core.State
	hub *hub

	kick      chan struct{} // wakes the flusher before its tick
	sweepKick chan struct{} // wakes the ghost sweep (a node record went away)
	closing   chan struct{} // closed when streams must end (shutdown)
	closeMu   sync.Once
	started   atomic.Bool
	stop      context.CancelFunc
	wg        sync.WaitGroup

	// bounds are where the next backstop's parts start: keys spaced
	// backstopPartKeys apart in the last keys-only listing.
	bounds atomic.Pointer[[]string]

	// persist is the write-behind's bookkeeping for callers that wait for
	// persistence, and for the persistence status (persistence.go);
	// guarded by mu.
	persist persistTracker

	// Peer-watch (peer.go): the streams this replica serves, and the
	// address and client TLS its member record and dialing use.
	peerHub  *peerHub
	peerAddr string
	peerTLS  *tls.Config
	// peerView is the other replicas as discovery and their streams know
	// them (peerview.go), for Peers.
	peerView peerView
}

// New builds a registrar over a store. Call Start to load the snapshot.
// The store's optional capabilities are found here, once: without a change
// feed (backend.Watcher) the registrar syncs by polling, which an explicit
// SyncMode SyncWatch refuses rather than quietly ignores (an empty SyncMode
// picks poll); without a digest (backend.Digester) the backstop takes full
// listings; without leases (backend.Leases) node calls are refused and
// nothing is swept.
func New(opts Options, store backend.Store) (*Registrar, error) {
	watcher, _ := store.(backend.Watcher)
	digester, _ := store.(backend.Digester)
	leases, _ := store.(backend.Leases)
	if watcher == nil {
		switch opts.SyncMode {
		case SyncWatch:
			return nil, fmt.Errorf("--sync-mode %q: the configured backend has no change feed to watch; use --sync-mode %s", opts.SyncMode, SyncPoll)
		case "":
			opts.SyncMode = SyncPoll
		}
	}
	opts = opts.withDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	r := &Registrar{
		opts:     opts,
		backend:  store,
		watcher:  watcher,
		digester: digester,
		leases:   leases,
		log:      opts.Logger.With("component", "registrar", "cluster", opts.ClusterName, "region", opts.Region),
		clock:    wallClock{},
		st: core.New(core.Config{
			Epoch:        newEpoch(),
			HistorySize:  opts.WatchHistory,
			QueueLimit:   opts.WriteQueueLimit,
			MaxPerNode:   opts.MaxEndpointsPerNode,
			FlushAtBatch: opts.WriteBatchSize,
			PeerGrace:    opts.peerGrace(),
		}),
		peerHub:   newPeerHub(),
		hub:       newHub(),
		kick:      make(chan struct{}, 1),
		sweepKick: make(chan struct{}, 1),
		closing:   make(chan struct{}),
		persist:   newPersistTracker(),
	}
	r.now = r.clock.Now
	r.metrics = newMetrics(r)
	r.hub.onDeliver = r.metrics.delivered
	return r, nil
}

// startBackoff spaces the attempts of the initial listing.
var startBackoff = retry.Backoff{Base: 100 * time.Millisecond, Max: 5 * time.Second}

// Start loads the snapshot from the backend, retrying until it succeeds or
// ctx ends, then starts the flusher, the syncer and the bookmark ticker. A
// registrar does not serve before its snapshot is loaded: an empty snapshot
// would tell every watcher that all endpoints are gone.
func (r *Registrar) Start(ctx context.Context) error {
	var l backend.Listing
	for attempt := 0; ; attempt++ {
		var err error
		l, err = r.list(ctx)
		if err == nil {
			break
		}
		// One registrar waiting for its own store has no crowd to spread,
		// so it waits the plain exponential step.
		backoff := startBackoff.Ceiling(attempt)
		r.log.Warn("initial listing failed; retrying", "err", err, "in", backoff)
		if !retry.Sleep(ctx, backoff, nil) {
			return fmt.Errorf("loading the snapshot from the backend: %w", err)
		}
	}
	r.mu.Lock()
	r.act(r.st.ApplyListing(l))
	n := r.st.Len()
	r.mu.Unlock()
	r.log.Info("snapshot loaded", "endpoints", n, "revision", l.Revision, "skipped", l.Skipped)

	loopCtx, cancel := context.WithCancel(context.Background())
	r.stop = cancel
	if r.opts.PeerWatch {
		if err := r.startPeers(loopCtx); err != nil {
			cancel()
			return err
		}
	}
	r.wg.Add(4)
	go func() { defer r.wg.Done(); r.runSweep(loopCtx) }()
	go func() { defer r.wg.Done(); r.runFlusher(loopCtx) }()
	go func() { defer r.wg.Done(); r.runSync(loopCtx, l.Revision) }()
	go func() { defer r.wg.Done(); r.runProgress(loopCtx) }()
	r.started.Store(true)
	return nil
}

// Close stops the loops and makes a last attempt, bounded by ctx, to persist
// what is queued. Writes still queued when it returns are reported in the
// error; they are lost only because the process is ending.
func (r *Registrar) Close(ctx context.Context) error {
	r.EndStreams()
	if !r.started.Swap(false) {
		return nil
	}
	r.stop()
	r.wg.Wait()
	for {
		err := r.flush(ctx)
		if err == nil {
			if st := r.PersistenceStatus(); st.Pending > 0 && len(st.Isolated) > 0 {
				// Only isolated writes are left: the backend refused them.
				return fmt.Errorf("registrar closed with %d writes not persisted: %d refused by the backend (first: %s: %s)",
					st.Pending, len(st.Isolated), st.Isolated[0].Key, st.Isolated[0].Reason)
			}
			return nil
		}
		if !retry.Sleep(ctx, 200*time.Millisecond, nil) {
			return fmt.Errorf("registrar closed with %d writes not persisted: %w", r.PendingWrites(), err)
		}
	}
}

// EndStreams ends every watch stream with UNAVAILABLE, so clients move to
// another replica and resume there; part of shutting down.
func (r *Registrar) EndStreams() {
	r.closeMu.Do(func() {
		close(r.closing)
		r.endSubscriptions() // api.go
	})
}

// Ready reports whether the snapshot is loaded and the registrar serving.
func (r *Registrar) Ready() bool { return r.started.Load() }

// PendingWrites counts endpoints whose acknowledged writes are not yet
// persisted.
func (r *Registrar) PendingWrites() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.st.Depth()
}

// WriteCheck decides whether a write may go ahead (see replica.WriteCheck:
// it runs under the registrar's lock).
type WriteCheck = replica.WriteCheck

// Register validates an endpoint, fills in this registrar's origin, applies
// it to the snapshot and pushes it to watchers. It returns once the write is
// queued for persistence.
func (r *Registrar) Register(ep *registryv1.ServiceEndpoint) (*registryv1.ServiceEndpoint, string, error) {
	return r.RegisterChecked(ep, nil)
}

// RegisterChecked is Register with a WriteCheck (nil: none) that runs after
// validation, under the lock, before anything is written.
func (r *Registrar) RegisterChecked(ep *registryv1.ServiceEndpoint, check WriteCheck) (*registryv1.ServiceEndpoint, string, error) {
	if ep != nil {
		region, cluster := ep.GetRegion(), ep.GetCluster()
		if err := r.claimOrigin(&region, &cluster, "endpoint."); err != nil {
			return nil, "", err
		}
		if region != ep.GetRegion() || cluster != ep.GetCluster() {
			ep = proto.Clone(ep).(*registryv1.ServiceEndpoint) // the caller's message is not ours to fill in
			ep.Region, ep.Cluster = region, cluster
		}
	}
	norm, err := registry.NormalizeEndpoint(ep, r.opts.limits())
	if err != nil {
		return nil, "", err
	}
	r.mu.Lock()
	if check != nil {
		if err := check(norm, r.st.Get(registry.IDOf(norm))); err != nil {
			r.mu.Unlock()
			return nil, "", err
		}
	}
	stored, eff, err := r.st.Register(norm, r.now())
	v := r.st.Version().String()
	r.act(eff)
	r.mu.Unlock()
	if err != nil {
		return nil, "", err
	}
	return stored, v, nil
}

// Unregister removes an endpoint of this registrar's origin.
func (r *Registrar) Unregister(id registry.EndpointID) (string, error) {
	return r.UnregisterChecked(id, nil)
}

// UnregisterChecked is Unregister with a WriteCheck (nil: none), called
// only if the endpoint exists (otherwise the result is NOT_FOUND).
func (r *Registrar) UnregisterChecked(id registry.EndpointID, check WriteCheck) (string, error) {
	v, _, err := r.UnregisterStamped(id, check)
	return v, err
}

// UnregisterStamped is UnregisterChecked that also returns the removal's
// stamp and the identity it resolved (with origin and canonical IP), for
// WaitPersisted.
func (r *Registrar) UnregisterStamped(id registry.EndpointID, check WriteCheck) (string, Written, error) {
	var stamp *registryv1.WriteStamp
	var resolved registry.EndpointID
	_, v, err := r.change(id, check, func(st *core.State, id registry.EndpointID) (*registryv1.ServiceEndpoint, core.Effects, error) {
		st2, eff, err := st.Unregister(id, r.now())
		if err == nil {
			stamp, resolved = st2, id
		}
		return nil, eff, err
	})
	return v, Written{ID: resolved, Stamp: stamp}, err
}

// Written names an acknowledged write, for WaitPersisted.
type Written = replica.Written

// Drain marks an endpoint of this registrar's origin DRAINING.
func (r *Registrar) Drain(id registry.EndpointID) (*registryv1.ServiceEndpoint, string, error) {
	return r.DrainChecked(id, nil)
}

// DrainChecked is Drain with a WriteCheck (nil: none), called only if the
// endpoint exists (otherwise the result is NOT_FOUND).
func (r *Registrar) DrainChecked(id registry.EndpointID, check WriteCheck) (*registryv1.ServiceEndpoint, string, error) {
	return r.change(id, check, func(st *core.State, id registry.EndpointID) (*registryv1.ServiceEndpoint, core.Effects, error) {
		return st.Drain(id, r.now())
	})
}

// change validates an endpoint identity from a request and applies fn to it
// under the lock, acting on the effects it yields. check, if set, runs
// first under the same lock when the endpoint exists.
func (r *Registrar) change(id registry.EndpointID, check WriteCheck, fn func(*core.State, registry.EndpointID) (*registryv1.ServiceEndpoint, core.Effects, error)) (*registryv1.ServiceEndpoint, string, error) {
	id, err := r.origin().NormalizeID(id)
	if err != nil {
		return nil, "", err
	}
	r.mu.Lock()
	if r.st.Get(id) == nil {
		// Not in this replica's snapshot, but perhaps written through
		// another replica a moment ago and not yet seen here: ask the
		// backend before answering NOT_FOUND, so a drain or deregister
		// right after a register through another replica works.
		r.mu.Unlock()
		r.learn(id)
		r.mu.Lock()
	}
	if check != nil {
		if stored := r.st.Get(id); stored != nil {
			if err := check(nil, stored); err != nil {
				r.mu.Unlock()
				return nil, "", err
			}
		}
	}
	ep, eff, err := fn(r.st, id)
	v := r.st.Version().String()
	r.act(eff)
	r.mu.Unlock()
	if err != nil {
		return nil, "", err
	}
	return ep, v, nil
}

// learnTimeout bounds the backend read of learn: a drain or unregister
// waits no longer than this for a backend that does not answer.
const learnTimeout = 2 * time.Second

// learn reads an endpoint this replica does not hold from the backend and,
// if the backend has it, takes it into the snapshot (core.State.Adopt). A
// backend that cannot be read leaves the snapshot as it is: the caller
// then answers from the snapshot, NOT_FOUND.
func (r *Registrar) learn(id registry.EndpointID) {
	ctx, cancel := context.WithTimeout(context.Background(), learnTimeout)
	defer cancel()
	ep, rev, at, err := r.backend.GetEndpoint(ctx, id)
	if err != nil {
		r.log.Warn("reading an endpoint this replica does not hold failed", "endpoint", id.String(), "err", err)
		return
	}
	if ep == nil {
		return
	}
	r.mu.Lock()
	r.act(r.st.Adopt(id, ep, rev, at))
	r.mu.Unlock()
}

// origin is this registrar's region and cluster: a registrar is the write
// path of its own cluster only, which keeps every origin subtree
// single-writer.
func (r *Registrar) origin() registry.Origin {
	return registry.Origin{Region: r.opts.Region, Cluster: r.opts.ClusterName, Refusal: registrarRefusal}
}

// registrarRefusal tells the caller where to write instead: another
// origin's subtree has its own registrars.
func registrarRefusal(part, got, own string) string {
	return fmt.Sprintf("%q is not this registrar's %s %q; write through a registrar of %s %q", got, part, own, part, got)
}

// claimOrigin defaults an empty region/cluster to this registrar's, and
// refuses another origin (see origin).
func (r *Registrar) claimOrigin(region, cluster *string, field string) error {
	return r.origin().Claim(region, cluster, field)
}

// List returns the endpoints of the given services (all when empty) and the
// version the listing is current as of.
func (r *Registrar) List(services []string) ([]*registryv1.ServiceEndpoint, string, error) {
	f, err := newFilter(services)
	if err != nil {
		return nil, "", &registry.FieldError{Field: "services", Reason: err.Error()}
	}
	r.mu.Lock()
	eps, seq := r.st.Snapshot(core.Filter(f))
	r.mu.Unlock()
	return eps, registry.Position{Epoch: r.st.Epoch(), Seq: seq}.String(), nil
}

func (r *Registrar) list(ctx context.Context) (backend.Listing, error) {
	ctx, cancel := context.WithTimeout(ctx, max(r.opts.SyncInterval, 10*time.Second))
	defer cancel()
	return r.listFull(ctx, r.clock.Now())
}

// listFull reads every value, for a listing that began at start.
func (r *Registrar) listFull(ctx context.Context, start time.Time) (backend.Listing, error) {
	l, err := r.backend.List(ctx)
	if err != nil {
		r.metrics.syncErrors.Inc()
		return l, err
	}
	r.metrics.syncFetched.Add(float64(len(l.Endpoints) + len(l.Nodes) + l.Skipped))
	r.metrics.syncDuration.Observe(r.clock.Now().Sub(start).Seconds())
	// The first backstop after it is read in parts too.
	r.bounds.Store(partBounds(len(l.Endpoints), func(i int) (string, error) { return registry.IDOf(l.Endpoints[i]).Key() }))
	return l, nil
}

// isClosed reports a context error, for loops deciding whether a failure is
// worth logging.
func isClosed(ctx context.Context, err error) bool {
	return ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded))
}
