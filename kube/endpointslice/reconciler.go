package endpointslice

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/retry"
	"github.com/aethermesh/aether/registrar/replica"
	"github.com/aethermesh/aether/registry"
)

// Source is what the reconciler follows: the registrar's in-process
// Subscribe (registrar.Registrar has it), named over package replica's
// types as xds.Source is, so this package does not import the registrar.
type Source = replica.Subscriber

// Defaults of ReconcilerConfig.
const (
	DefaultWriteQPS   = 20
	DefaultWriteBurst = 50
	DefaultResync     = 5 * time.Minute
	// conflictRetries bounds the relist-and-replan rounds of one service
	// after a 409 before it waits for its backoff.
	conflictRetries = 4
	callTimeout     = 15 * time.Second
	listPageSize    = 500
)

// ReconcilerConfig configures a Reconciler.
type ReconcilerConfig struct {
	// Config is the planner's: the namespace, the origin whose endpoints
	// are published, the packing.
	Config
	Source Source
	Client kubernetes.Interface
	// ServiceNames publishes an Aether service under another Kubernetes
	// Service name (one that is not a DNS-1035 label, say); any other is
	// published under its own. An Aether service whose own name is one of
	// the targets is skipped, not merged.
	ServiceNames map[string]string
	// WriteQPS and WriteBurst bound the rate of writes (creates, updates,
	// deletes) to the API server: a token bucket shared by every service.
	WriteQPS   float64
	WriteBurst int
	// Resync is how often every managed slice is listed again and every
	// service replanned, which repairs slices changed or deleted behind
	// the reconciler's back.
	Resync     time.Duration
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// Election, when set, makes one replica of the origin the writer
	// (see Election); nil lets every replica write.
	Election *Election
	// Backoff spaces resubscriptions, relists after a failed list, and
	// the retries of a service whose write failed. Zero takes 100ms to 30s.
	Backoff retry.Backoff
}

// Reconciler keeps the EndpointSlices of the configured origin's services
// equal to what the planner makes of the registrar's endpoints. Two
// goroutines: the feed follows the subscription and marks services dirty;
// the worker lists the managed slices (once, then every Resync), plans
// each dirty service against the slices it knows and writes the plan,
// taking what the API server returns as the slices it now knows. A 409
// (a slice changed since it was read: another registrar replica, a
// person) relists that service's slices and plans again.
//
// Until the subscription's first start has been applied the worker writes
// nothing: planning from an empty registrar would delete the slices a
// restarted registrar is about to adopt.
type Reconciler struct {
	cfg ReconcilerConfig
	log *slog.Logger
	m   *metrics
	lim *rate.Limiter

	mu       sync.Mutex
	eps      map[string]map[registry.EndpointID]*registryv1.ServiceEndpoint
	dirty    map[string]bool
	loaded   bool
	inFull   bool
	inSvcSnp bool
	wake     chan struct{}

	// The worker's own.
	slices  map[string]map[string]*discoveryv1.EndpointSlice // by service, by name
	skipped map[string]map[Reason]int                        // by service
	skipSig map[string]string                                // what was last logged of a service's skips

	el      *elector        // nil without an Election
	targets map[string]bool // the values of ServiceNames

	stop context.CancelFunc
	wg   sync.WaitGroup
}

// NewReconciler checks cfg and returns a reconciler that is not yet
// running (see Start).
func NewReconciler(cfg ReconcilerConfig) (*Reconciler, error) {
	switch {
	case cfg.Source == nil:
		return nil, errors.New("endpointslice: no Source")
	case cfg.Client == nil:
		return nil, errors.New("endpointslice: no Kubernetes client")
	case cfg.Namespace == "":
		return nil, errors.New("endpointslice: no namespace")
	case cfg.Region == "" || cfg.Cluster == "":
		return nil, errors.New("endpointslice: no origin (region and cluster)")
	case cfg.MaxEndpointsPerSlice < 0 || cfg.MaxEndpointsPerSlice > MaxMaxEndpointsPerSlice:
		return nil, fmt.Errorf("endpointslice: %d endpoints per slice: want 1 to %d", cfg.MaxEndpointsPerSlice, MaxMaxEndpointsPerSlice)
	}
	targets := map[string]bool{}
	for from, to := range cfg.ServiceNames {
		if err := ServiceName(to); err != nil {
			return nil, fmt.Errorf("endpointslice: %s published as %s: %w", from, to, err)
		}
		if targets[to] {
			return nil, fmt.Errorf("endpointslice: two services published as %s", to)
		}
		targets[to] = true
	}
	if cfg.WriteQPS <= 0 {
		cfg.WriteQPS = DefaultWriteQPS
	}
	if cfg.WriteBurst <= 0 {
		cfg.WriteBurst = DefaultWriteBurst
	}
	if cfg.Resync <= 0 {
		cfg.Resync = DefaultResync
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Backoff.Base <= 0 || cfg.Backoff.Max <= 0 {
		cfg.Backoff = retry.Backoff{Base: 100 * time.Millisecond, Max: 30 * time.Second}
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	r := &Reconciler{
		cfg:     cfg,
		log:     cfg.Logger,
		m:       m,
		lim:     rate.NewLimiter(rate.Limit(cfg.WriteQPS), cfg.WriteBurst),
		eps:     map[string]map[registry.EndpointID]*registryv1.ServiceEndpoint{},
		dirty:   map[string]bool{},
		wake:    make(chan struct{}, 1),
		slices:  map[string]map[string]*discoveryv1.EndpointSlice{},
		skipped: map[string]map[Reason]int{},
		skipSig: map[string]string{},
		targets: targets,
	}
	if cfg.Election != nil {
		if r.el, err = newElector(r, *cfg.Election); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// Start runs the feed and the worker until Close.
func (r *Reconciler) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	r.stop = cancel
	r.wg.Add(2)
	go func() { defer r.wg.Done(); r.feed(ctx) }()
	go func() { defer r.wg.Done(); r.work(ctx) }()
	if r.el != nil {
		r.wg.Add(1)
		go func() { defer r.wg.Done(); r.el.run(ctx) }()
	}
}

// Close stops both goroutines and waits for them. The slices stay as
// they are: consumers keep the last endpoints, and a successor adopts
// them.
func (r *Reconciler) Close() {
	if r.stop == nil {
		return
	}
	r.stop()
	r.wg.Wait()
	if r.el != nil {
		r.el.close()
	}
}

// feed follows the registrar (replica.Follow, as the xDS feed does) and
// wakes the worker after each start and batch it applied.
func (r *Reconciler) feed(ctx context.Context) {
	replica.Follow(ctx, r.cfg.Source, nil, replica.Follower{
		Name: "endpointslices", Log: r.log, Backoff: r.cfg.Backoff,
		Start: func(start replica.Start) {
			r.mu.Lock()
			r.inFull, r.inSvcSnp = false, false
			if start.Resumed {
				r.applyLocked(start.Missed)
			} else {
				r.replaceLocked(start.Snapshot)
			}
			r.mu.Unlock()
			r.signal()
		},
		Batch: func(batch []*registrarv1.EndpointEvent) {
			r.mu.Lock()
			r.applyLocked(batch)
			r.mu.Unlock()
			r.signal()
		},
	})
}

func (r *Reconciler) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// own reports whether ep is of the origin whose slices this reconciler
// writes: the registrar also holds other clusters' and regions'
// endpoints, which their own registrars publish.
func (r *Reconciler) own(ep *registryv1.ServiceEndpoint) bool {
	return ep.GetRegion() == r.cfg.Region && ep.GetCluster() == r.cfg.Cluster
}

func (r *Reconciler) replaceLocked(snap []*registryv1.ServiceEndpoint) {
	for svc := range r.eps {
		r.dirty[svc] = true
	}
	r.eps = map[string]map[registry.EndpointID]*registryv1.ServiceEndpoint{}
	for _, ep := range snap {
		r.putLocked(ep)
	}
	r.loaded = true
}

// takenPrefix marks, in the reconciler's keys, an Aether service whose
// name is the Kubernetes name another service is renamed to: it is not a
// Kubernetes name (ServiceName refuses it), so the service is skipped
// rather than merged into the other's slices.
const takenPrefix = "\x00taken:"

// kname is the Kubernetes Service name svc is published as: its
// ServiceNames entry, else its own name.
func (r *Reconciler) kname(svc string) string {
	if k, ok := r.cfg.ServiceNames[svc]; ok {
		return k
	}
	if r.targets[svc] {
		return takenPrefix + svc
	}
	return svc
}

func (r *Reconciler) putLocked(ep *registryv1.ServiceEndpoint) {
	svc := r.kname(ep.GetService())
	id := registry.IDOf(ep)
	if !r.own(ep) {
		// An endpoint that moved origin is gone from this one.
		r.removeLocked(svc, id)
		return
	}
	m := r.eps[svc]
	if m == nil {
		m = map[registry.EndpointID]*registryv1.ServiceEndpoint{}
		r.eps[svc] = m
	}
	m[id] = ep
	r.dirty[svc] = true
}

func (r *Reconciler) removeLocked(svc string, id registry.EndpointID) {
	if m := r.eps[svc]; m != nil {
		if _, ok := m[id]; ok {
			delete(m, id)
			r.dirty[svc] = true
		}
		if len(m) == 0 {
			delete(r.eps, svc)
		}
	}
}

func (r *Reconciler) applyLocked(batch []*registrarv1.EndpointEvent) {
	for _, ev := range batch {
		switch ev.GetType() {
		case registrarv1.EndpointEvent_ENDPOINT_ADDED, registrarv1.EndpointEvent_ENDPOINT_UPDATED:
			r.putLocked(ev.GetEndpoint())
		case registrarv1.EndpointEvent_ENDPOINT_REMOVED:
			r.removeLocked(r.kname(ev.GetEndpoint().GetService()), registry.IDOf(ev.GetEndpoint()))
		case registrarv1.EndpointEvent_FULL_SNAPSHOT:
			// A snapshot may come in chunks; the first replaces all.
			if !r.inFull {
				for svc := range r.eps {
					r.dirty[svc] = true
				}
				r.eps = map[string]map[registry.EndpointID]*registryv1.ServiceEndpoint{}
			}
			for _, ep := range ev.GetEndpoints() {
				r.putLocked(ep)
			}
			r.inFull = ev.GetSnapshotContinues()
		case registrarv1.EndpointEvent_SERVICES_SNAPSHOT:
			if !r.inSvcSnp {
				for _, svc := range ev.GetServices() {
					delete(r.eps, r.kname(svc))
					r.dirty[r.kname(svc)] = true
				}
			}
			for _, ep := range ev.GetEndpoints() {
				r.putLocked(ep)
			}
			r.inSvcSnp = ev.GetSnapshotContinues()
		}
	}
	r.loaded = true
}

// take is the dirty services, once the first start is applied.
func (r *Reconciler) take() (svcs []string, loaded bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.loaded {
		return nil, false
	}
	for svc := range r.dirty {
		svcs = append(svcs, svc)
	}
	r.dirty = map[string]bool{}
	return svcs, true
}

// endpointsOf copies the endpoints of svc held now.
func (r *Reconciler) endpointsOf(svc string) []*registryv1.ServiceEndpoint {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*registryv1.ServiceEndpoint, 0, len(r.eps[svc]))
	for _, ep := range r.eps[svc] {
		out = append(out, ep)
	}
	return out
}

func (r *Reconciler) markAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for svc := range r.eps {
		r.dirty[svc] = true
	}
	for svc := range r.slices {
		r.dirty[svc] = true
	}
}

// work is the worker: list, then plan and write the dirty services as
// they come, each failed one again after its backoff, everything again
// every Resync.
func (r *Reconciler) work(ctx context.Context) {
	listed := false
	listAttempt := 0
	failures := map[string]int{}
	retryAt := map[string]time.Time{}
	resync := time.NewTicker(r.cfg.Resync)
	defer resync.Stop()
	for ctx.Err() == nil {
		// wctx is what writes run under: the leadership's context with an
		// election (writes stop when it is lost), else ctx.
		wctx := ctx
		if r.el != nil {
			if wctx = r.el.leading(); wctx == nil {
				// Not leading: the dirty services wait, and a leadership
				// won later starts with a fresh listing.
				listed = false
				select {
				case <-ctx.Done():
				case <-r.wake:
				}
				continue
			}
		}
		svcs, loaded := r.take()
		if loaded && !listed {
			if err := r.listAll(wctx); err != nil {
				r.m.errors.WithLabelValues("list").Inc()
				r.log.Warn("endpointslices: listing the managed slices failed, retrying", "namespace", r.cfg.Namespace, "err", err, "attempt", listAttempt)
				r.markDirty(svcs)
				retry.Sleep(ctx, r.cfg.Backoff.Ceiling(listAttempt), nil)
				listAttempt++
				continue
			}
			listed, listAttempt = true, 0
			r.markAll()
			svcs, _ = r.take()
		}
		now := time.Now()
		for svc, at := range retryAt {
			if !now.Before(at) {
				svcs = append(svcs, svc)
				delete(retryAt, svc)
			}
		}
		slices.Sort(svcs)
		svcs = slices.Compact(svcs)
		for i, svc := range svcs {
			if wctx.Err() != nil {
				r.markDirty(svcs[i:]) // for this replica's next leadership, or a successor's
				break
			}
			if err := r.sync(wctx, svc); err != nil {
				if wctx.Err() != nil {
					r.markDirty(svcs[i:])
					break
				}
				n := failures[svc]
				failures[svc] = n + 1
				d := r.cfg.Backoff.Delay(n)
				retryAt[svc] = time.Now().Add(d)
				r.log.Warn("endpointslices: writing a service's slices failed, retrying", "service", svc, "namespace", r.cfg.Namespace, "err", err, "retry_in", d)
				continue
			}
			delete(failures, svc)
			delete(retryAt, svc)
		}
		r.m.slices.Set(float64(r.sliceCount()))

		var timer *time.Timer
		var fire <-chan time.Time
		if len(retryAt) > 0 {
			next := time.Time{}
			for _, at := range retryAt {
				if next.IsZero() || at.Before(next) {
					next = at
				}
			}
			timer = time.NewTimer(time.Until(next))
			fire = timer.C
		}
		select {
		case <-ctx.Done():
		case <-wctx.Done():
		case <-r.wake:
		case <-fire:
		case <-resync.C:
			listed = false
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

// markDirty puts back services taken but not written.
func (r *Reconciler) markDirty(svcs []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, svc := range svcs {
		r.dirty[svc] = true
	}
}

func (r *Reconciler) sliceCount() int {
	n := 0
	for _, m := range r.slices {
		n += len(m)
	}
	return n
}

// listAll replaces the slices known with a listing of every slice of this
// origin in the namespace, paged.
func (r *Reconciler) listAll(ctx context.Context) error {
	all, err := r.list(ctx, labels.SelectorFromSet(r.cfg.OriginLabels()))
	if err != nil {
		return err
	}
	known := map[string]map[string]*discoveryv1.EndpointSlice{}
	for _, s := range all {
		svc := s.Labels[discoveryv1.LabelServiceName]
		if known[svc] == nil {
			known[svc] = map[string]*discoveryv1.EndpointSlice{}
		}
		known[svc][s.Name] = s
	}
	// A service no longer listed is dirty as well: markAll, after this,
	// visits r.slices, so keep an empty entry for it.
	for svc := range r.slices {
		if known[svc] == nil {
			known[svc] = map[string]*discoveryv1.EndpointSlice{}
		}
	}
	r.slices = known
	return nil
}

// relist replaces the slices known of one service.
func (r *Reconciler) relist(ctx context.Context, svc string) error {
	got, err := r.list(ctx, labels.SelectorFromSet(r.cfg.Labels(svc)))
	if err != nil {
		r.m.errors.WithLabelValues("list").Inc()
		return err
	}
	m := map[string]*discoveryv1.EndpointSlice{}
	for _, s := range got {
		m[s.Name] = s
	}
	r.slices[svc] = m
	return nil
}

func (r *Reconciler) list(ctx context.Context, sel labels.Selector) ([]*discoveryv1.EndpointSlice, error) {
	var out []*discoveryv1.EndpointSlice
	opts := metav1.ListOptions{LabelSelector: sel.String(), Limit: listPageSize}
	for {
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		l, err := r.cfg.Client.DiscoveryV1().EndpointSlices(r.cfg.Namespace).List(cctx, opts)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("list EndpointSlices in %s (%s): %w", r.cfg.Namespace, opts.LabelSelector, err)
		}
		for i := range l.Items {
			out = append(out, &l.Items[i])
		}
		if l.Continue == "" {
			return out, nil
		}
		opts.Continue = l.Continue
	}
}

// sync plans one service and writes the plan; on a conflict it relists
// the service's slices and plans again, a bounded number of times.
func (r *Reconciler) sync(ctx context.Context, svc string) error {
	eps := r.endpointsOf(svc)
	if err := ServiceName(svc); err != nil {
		var skips []Skip
		if taken, ok := strings.CutPrefix(svc, takenPrefix); ok {
			err = fmt.Errorf("service %q: another service is published under that Kubernetes name (ServiceNames)", taken)
		}
		if len(eps) > 0 {
			skips = []Skip{{Reason: ReasonServiceName, Detail: err.Error()}}
		}
		r.noteSkips(svc, skips)
		return nil
	}
	for attempt := 0; ; attempt++ {
		existing := make([]*discoveryv1.EndpointSlice, 0, len(r.slices[svc]))
		for _, s := range r.slices[svc] {
			existing = append(existing, s)
		}
		plan := r.cfg.Plan(svc, eps, existing)
		r.noteSkips(svc, plan.Skipped)
		err := r.write(ctx, svc, plan)
		if err == nil {
			if len(r.slices[svc]) == 0 {
				delete(r.slices, svc)
			}
			return nil
		}
		if !stale(err) || attempt >= conflictRetries {
			return err
		}
		r.m.conflicts.Inc()
		r.log.Debug("endpointslices: a slice changed since it was read, relisting", "service", svc, "err", err)
		if err := r.relist(ctx, svc); err != nil {
			return err
		}
	}
}

// stale reports whether a write failed because what it was planned from
// is no longer what is stored: relist and replan.
func stale(err error) bool {
	return apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) || apierrors.IsNotFound(err)
}

// write applies a plan: creates and updates before deletes, so an
// endpoint moving between slices is briefly in both rather than in
// neither. Each write takes a token of the rate limiter, and what the API
// server returns is what the reconciler knows of the slice from then on.
func (r *Reconciler) write(ctx context.Context, svc string, p Plan) error {
	api := r.cfg.Client.DiscoveryV1().EndpointSlices(r.cfg.Namespace)
	known := r.slices[svc]
	if known == nil {
		known = map[string]*discoveryv1.EndpointSlice{}
		r.slices[svc] = known
	}
	call := func(op string, f func(context.Context) error) error {
		if err := r.lim.Wait(ctx); err != nil {
			return err
		}
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		defer cancel()
		if err := f(cctx); err != nil {
			r.m.errors.WithLabelValues(op).Inc()
			return err
		}
		r.m.writes.WithLabelValues(op).Inc()
		return nil
	}
	for _, s := range p.Create {
		if err := call("create", func(ctx context.Context) error {
			got, err := api.Create(ctx, s, metav1.CreateOptions{FieldManager: ManagedBy})
			if err == nil {
				known[got.Name] = got
			}
			return err
		}); err != nil {
			return fmt.Errorf("create EndpointSlice %s/%s: %w", r.cfg.Namespace, s.Name, err)
		}
	}
	for _, s := range p.Update {
		if err := call("update", func(ctx context.Context) error {
			// s carries the resourceVersion it was planned from: the API
			// server refuses the update (409) if the slice changed since.
			got, err := api.Update(ctx, s, metav1.UpdateOptions{FieldManager: ManagedBy})
			if err == nil {
				known[got.Name] = got
			}
			return err
		}); err != nil {
			return fmt.Errorf("update EndpointSlice %s/%s at resourceVersion %s: %w", r.cfg.Namespace, s.Name, s.ResourceVersion, err)
		}
	}
	for _, s := range p.Delete {
		rv := s.ResourceVersion
		if err := call("delete", func(ctx context.Context) error {
			err := api.Delete(ctx, s.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}})
			if err == nil || apierrors.IsNotFound(err) {
				delete(known, s.Name) // gone either way
				return nil
			}
			return err
		}); err != nil {
			return fmt.Errorf("delete EndpointSlice %s/%s at resourceVersion %s: %w", r.cfg.Namespace, s.Name, rv, err)
		}
	}
	return nil
}

// noteSkips records what of svc is not published: the gauges, and a log
// line when that changes.
func (r *Reconciler) noteSkips(svc string, skips []Skip) {
	counts := map[Reason]int{}
	var parts []string
	for _, s := range skips {
		counts[s.Reason]++
		if s.IP != "" {
			parts = append(parts, fmt.Sprintf("%s %s: %s (%s)", s.IP, strings.TrimPrefix(s.Protocol.String(), "PROTOCOL_"), s.Reason, s.Detail))
		} else {
			parts = append(parts, fmt.Sprintf("%s (%s)", s.Reason, s.Detail))
		}
	}
	for reason, n := range r.skipped[svc] {
		r.gauge(reason).Sub(float64(n))
	}
	for reason, n := range counts {
		r.gauge(reason).Add(float64(n))
	}
	if len(counts) == 0 {
		delete(r.skipped, svc)
	} else {
		r.skipped[svc] = counts
	}
	slices.Sort(parts)
	sig := strings.Join(parts, "; ")
	if sig != r.skipSig[svc] {
		if sig != "" {
			r.log.Warn("endpointslices: not publishing part of a service", "service", strings.TrimPrefix(svc, takenPrefix), "skipped", sig)
		}
		if sig == "" {
			delete(r.skipSig, svc)
		} else {
			r.skipSig[svc] = sig
		}
	}
}

func (r *Reconciler) gauge(reason Reason) prometheus.Gauge {
	if reason == ReasonServiceName {
		return r.m.skippedServices.WithLabelValues(string(reason))
	}
	return r.m.skippedEndpoints.WithLabelValues(string(reason))
}
