package endpointslice

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"os"
	"sync"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

// Election makes one of the registrar replicas of an origin the writer of
// its slices, through a coordination.k8s.io Lease in the slices'
// namespace (client-go's leaderelection, as kube-controller-manager
// elects its EndpointSlice controller). Without it every replica writes:
// correct, since writes are preconditioned and the planner deterministic,
// but each change then costs the other replicas a 409 and a relist, and a
// replica whose view lags a moment behind can briefly write the older
// state back. The others keep following the registrar, so a new leader
// lists the slices and writes only what differs.
type Election struct {
	// Identity names this replica in the Lease; empty takes the host
	// name and a random suffix.
	Identity string
	// LeaseDuration, RenewDeadline and RetryPeriod are client-go's (zero
	// takes kube-controller-manager's 15s, 10s, 2s).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// LeaseName is the name of the Lease the replicas of an origin elect their
// writer with.
func (c Config) LeaseName() string {
	h := fnv.New32a()
	h.Write([]byte(c.Region + "/" + c.Cluster))
	return fmt.Sprintf("aether-endpointslices-%08x", h.Sum32())
}

// elector runs the election and tells the worker whether, and under what
// context, it leads.
type elector struct {
	r  *Reconciler
	le *leaderelection.LeaderElector

	mu     sync.Mutex
	lead   context.Context // nil while not leading; cancelled when leadership ends
	closed bool
	// cbs counts the leaderelection's OnStartedLeading callbacks running:
	// it starts them on goroutines of its own, which Close joins here.
	cbs sync.WaitGroup
}

func newElector(r *Reconciler, e Election) (*elector, error) {
	if e.LeaseDuration <= 0 {
		e.LeaseDuration = 15 * time.Second
	}
	if e.RenewDeadline <= 0 {
		e.RenewDeadline = 10 * time.Second
	}
	if e.RetryPeriod <= 0 {
		e.RetryPeriod = 2 * time.Second
	}
	if e.Identity == "" {
		host, _ := os.Hostname()
		var b [4]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, fmt.Errorf("endpointslice: draw an election identity: %w", err)
		}
		e.Identity = host + "_" + hex.EncodeToString(b[:])
	}
	el := &elector{r: r}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: r.cfg.LeaseName(), Namespace: r.cfg.Namespace},
		Client:     r.cfg.Client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: e.Identity},
		Labels:     map[string]string{"app.kubernetes.io/managed-by": "aether"},
	}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:          lock,
		LeaseDuration: e.LeaseDuration,
		RenewDeadline: e.RenewDeadline,
		RetryPeriod:   e.RetryPeriod,
		// A replica that stops hands over at once rather than after the
		// lease runs out.
		ReleaseOnCancel: true,
		Name:            lock.LeaseMeta.Name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: el.started,
			OnStoppedLeading: el.stopped,
		},
	})
	if err != nil {
		return nil, fmt.Errorf("endpointslice: leader election: %w", err)
	}
	el.le = le
	return el, nil
}

// run campaigns until ctx ends: Run returns when leadership is lost, and
// the replica then stands again.
func (el *elector) run(ctx context.Context) {
	ctx = klog.NewContext(ctx, logr.FromSlogHandler(el.r.log.Handler()))
	for ctx.Err() == nil {
		el.le.Run(ctx)
	}
}

func (el *elector) started(ctx context.Context) {
	el.mu.Lock()
	if el.closed {
		el.mu.Unlock()
		return
	}
	el.cbs.Add(1)
	defer el.cbs.Done()
	// ctx is cancelled when leadership ends (before stopped is called),
	// so a late start leaves a context that is already done.
	el.lead = ctx
	el.mu.Unlock()
	el.r.log.Info("endpointslices: leading, writing this origin's slices", "lease", el.r.cfg.LeaseName(), "namespace", el.r.cfg.Namespace)
	el.r.signal()
}

func (el *elector) stopped() {
	el.mu.Lock()
	was := el.lead != nil
	el.lead = nil
	el.mu.Unlock()
	if was {
		el.r.log.Info("endpointslices: no longer leading", "lease", el.r.cfg.LeaseName())
	}
	el.r.signal()
}

// leading is the context of the current leadership, nil when there is
// none.
func (el *elector) leading() context.Context {
	el.mu.Lock()
	defer el.mu.Unlock()
	if el.lead == nil || el.lead.Err() != nil {
		return nil
	}
	return el.lead
}

// close joins the callbacks still running; run must have returned.
func (el *elector) close() {
	el.mu.Lock()
	el.closed = true
	el.mu.Unlock()
	el.cbs.Wait()
}
