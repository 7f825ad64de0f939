package kubernetes

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"

	"github.com/aethermesh/aether/backend"
)

// Defaults for zero Config fields.
const (
	// DefaultMaxInFlight bounds the API calls one Store has in flight at
	// once (writes of a batch, reads of a listing's pages): enough to keep
	// a batch's round trips overlapping, few enough that one registrar
	// does not take a priority level's whole concurrency share.
	DefaultMaxInFlight = 16
	// DefaultPageSize is the limit of each page of a listing. 500 is
	// what kubectl and informers use; the API server's cost per page is
	// about linear in it.
	DefaultPageSize = 500
	// TombstoneTTL is how long a delete's stamp is kept, as on etcd: long
	// enough to outlast any flush still queued somewhere (a flush retries
	// within seconds of the backend coming back), short enough that
	// deleted endpoints cost nothing for long.
	TombstoneTTL = 10 * time.Minute
	// DefaultGCInterval is how often a Store collects tombstones older
	// than TombstoneTTL.
	DefaultGCInterval = time.Minute
)

// fieldManager is the server-side apply field manager of every write.
const fieldManager = "aether"

// Config configures a Store.
type Config struct {
	// RESTConfig reaches the API server: rest.InClusterConfig() in a pod
	// (the service account), or a kubeconfig's. Required. New copies it.
	RESTConfig *rest.Config
	// Namespace holds the backend's objects. Required.
	Namespace string
	// Region and Cluster are the registrar's own (node leases and member
	// records are per cluster).
	Region, Cluster string
	Logger          *slog.Logger
	// InstallCRDs makes New install (server-side apply) the CRDs when
	// they are missing or older; otherwise New only checks them and fails
	// with an error naming the fix.
	InstallCRDs bool
	// MaxInFlight bounds concurrent API calls (default
	// DefaultMaxInFlight).
	MaxInFlight int
	// PageSize is the limit of each page of a listing (default
	// DefaultPageSize).
	PageSize int64
	// TombstoneTTL overrides TombstoneTTL (tests); GCInterval overrides
	// DefaultGCInterval, and a negative GCInterval turns collection off.
	TombstoneTTL time.Duration
	GCInterval   time.Duration
}

// Store is the Kubernetes objects backend: a backend.Store, Watcher and
// Digester on AetherEndpoint and AetherNode custom resources in one
// namespace. Its methods are safe for concurrent use.
type Store struct {
	cs   kubernetes.Interface // typed clientset: Leases, EndpointSlices
	dyn  dynamic.Interface    // the custom resources
	meta metadata.Interface   // metadata-only listings (digest.go)
	ns   string

	eps, nodes dynamic.ResourceInterface // the two resources in ns

	region, cluster string
	log             *slog.Logger
	pageSize        int64
	tombTTL         time.Duration
	// id names this Store in the objects it writes for itself (watch
	// fences): unique per New.
	id string

	// inflight is a semaphore of MaxInFlight tokens, taken around every
	// API call of the store's own loops.
	inflight chan struct{}

	// conflicts counts writes that met a 409 (Conflict or
	// AlreadyExists) and were decided again from a fresh read.
	conflicts atomic.Int64

	// fenceSeq numbers fence writes, so each one changes the object.
	fenceSeq atomic.Int64

	// base ends when the store closes; so do watches (watch.go), which
	// watches joins.
	base    context.Context
	watchMu sync.Mutex
	closed  bool
	watches sync.WaitGroup
	// fenced records which fence objects this store has written.
	fenced [nStreams]atomic.Bool

	// afterPage, if set, runs after each page of a listing is read (tests
	// compact between pages with it).
	afterPage func(ctx context.Context, page int)

	// now is the clock tombstones are dated and collected by.
	now func() time.Time

	stop     context.CancelFunc
	wg       sync.WaitGroup
	closeErr sync.Once

	pacer  *pacer  // client pacing and the server's clock (ratelimit.go)
	reaper *reaper // ends lapsed leases (nodes.go)
}

// New connects to the API server, makes sure the CRDs are there (installing
// them when cfg.InstallCRDs), checks that the server's resource versions
// are integers (doc.go), and starts tombstone collection. Close stops it.
func New(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.RESTConfig == nil {
		return nil, errors.New("kubernetes backend: no REST config (in a pod use the service account; outside, a kubeconfig)")
	}
	if errs := validation.IsDNS1123Label(cfg.Namespace); len(errs) > 0 {
		return nil, fmt.Errorf("kubernetes backend: namespace %q is not a valid namespace name: %v", cfg.Namespace, errs)
	}
	// QPS/Burst, the user agent, bounded concurrency and Retry-After
	// for the whole client, and the server clock leases are judged by
	// (ratelimit.go).
	pc := newPacer(cfg.MaxInFlight)
	rc := pc.configure(cfg.RESTConfig)
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes backend: clientset: %w", err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes backend: dynamic client: %w", err)
	}
	meta, err := metadata.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes backend: metadata client: %w", err)
	}
	var idb [6]byte
	_, _ = rand.Read(idb[:])
	s := &Store{
		cs: cs, dyn: dyn, meta: meta, ns: cfg.Namespace,
		eps:    dyn.Resource(EndpointsResource).Namespace(cfg.Namespace),
		nodes:  dyn.Resource(NodesResource).Namespace(cfg.Namespace),
		region: cfg.Region, cluster: cfg.Cluster,
		log:      log,
		pageSize: cfg.PageSize,
		tombTTL:  cfg.TombstoneTTL,
		id:       hex.EncodeToString(idb[:]),
		inflight: make(chan struct{}, max(cfg.MaxInFlight, 1)),
		now:      time.Now,
		pacer:    pc,
	}
	if cfg.MaxInFlight <= 0 {
		s.inflight = make(chan struct{}, DefaultMaxInFlight)
	}
	if s.pageSize <= 0 {
		s.pageSize = DefaultPageSize
	}
	if s.tombTTL <= 0 {
		s.tombTTL = TombstoneTTL
	}
	if cfg.InstallCRDs {
		err = installCRDs(ctx, dyn)
	} else {
		err = checkCRDs(ctx, dyn)
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes backend: %w", err)
	}
	if err := s.checkResourceVersions(ctx); err != nil {
		return nil, err
	}
	s.startReaper()
	gcCtx, stop := context.WithCancel(context.Background())
	s.base = gcCtx
	s.stop = func() {
		// Watches end with the store too, and only then are its fences
		// removed (a watch still running could write one again).
		s.watchMu.Lock()
		s.closed = true
		s.watchMu.Unlock()
		stop()
		s.watches.Wait()
		s.dropFences()
	}
	if every := cfg.GCInterval; every >= 0 {
		if every == 0 {
			every = DefaultGCInterval
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.collectLoop(gcCtx, every)
		}()
	}
	return s, nil
}

// Close stops the store's background work and waits for it. Watches end
// with their own contexts.
func (s *Store) Close() error {
	s.stop()
	s.wg.Wait()
	s.stopReaper()
	return nil
}

// Namespace is the namespace the store's objects live in.
func (s *Store) Namespace() string { return s.ns }

// checkResourceVersions refuses an API server whose resource versions are
// not integers, which the whole revision scheme rests on (doc.go).
func (s *Store) checkResourceVersions(ctx context.Context) error {
	for _, r := range []dynamic.ResourceInterface{s.eps, s.nodes} {
		l, err := r.List(ctx, metav1.ListOptions{Limit: 1})
		if err != nil {
			return fmt.Errorf("kubernetes backend: listing in namespace %s: %w", s.ns, classify(err))
		}
		if _, err := parseRV(l.GetResourceVersion()); err != nil {
			return fmt.Errorf("kubernetes backend: this API server does not serve integer resource versions (%w); the backend orders writes by them and cannot run on it: use the etcd backend", err)
		}
	}
	return nil
}

// parseRV is a resource version as a backend revision.
func parseRV(rv string) (int64, error) {
	if _, err := resourceversion.CompareResourceVersion(rv, rv); err != nil {
		return 0, fmt.Errorf("resource version %q: %w", rv, err)
	}
	n, err := strconv.ParseInt(rv, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("resource version %q does not fit an int64: %w", rv, err)
	}
	return n, nil
}

// formatRV is a backend revision as a resource version.
func formatRV(rev int64) string { return strconv.FormatInt(rev, 10) }

// acquire takes an in-flight token.
func (s *Store) acquire(ctx context.Context) error {
	select {
	case s.inflight <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Store) release() { <-s.inflight }

// classify marks an API error with the backend's sentinel it means: 410
// Gone is compaction, and failures of the moment (timeouts, throttling,
// the server unavailable) are backend.ErrUnavailable.
func classify(err error) error {
	switch {
	case err == nil:
		return nil
	case apierrors.IsResourceExpired(err) || apierrors.IsGone(err):
		return backend.Mark(err, backend.ErrCompacted)
	case transient(err):
		return backend.Mark(err, backend.ErrUnavailable)
	}
	return err
}

// transient reports whether an API error is a failure of the moment, as
// opposed to a refusal that retrying cannot change.
func transient(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	if apierrors.IsTooManyRequests(err) || apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) ||
		apierrors.IsServiceUnavailable(err) || apierrors.IsInternalError(err) || apierrors.IsUnexpectedServerError(err) {
		return true
	}
	var st apierrors.APIStatus
	if !errors.As(err, &st) {
		return true // not an API answer at all: the connection
	}
	return st.Status().Code >= 500
}

// permanent reports whether the API server refused a write for what it is
// (invalid, too large, forbidden by policy), which no retry changes.
func permanent(err error) bool {
	return apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) || apierrors.IsRequestEntityTooLargeError(err) ||
		apierrors.IsUnsupportedMediaType(err) || apierrors.IsNotAcceptable(err)
}

func errorsIsCompacted(err error) bool { return errors.Is(err, backend.ErrCompacted) }
