package bench

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	etcdstore "github.com/aethermesh/aether/backend/etcd"
	"github.com/aethermesh/aether/registry"
)

// The fanout workload: S services with E endpoints spread evenly over
// them, and N agents, each depending on its own set of services.

const (
	fanRegion  = "default" // the registrars' own origin (their defaults)
	fanCluster = "default"
	// sentKey is the endpoint metadata key carrying "<phase>/<unix nanos>"
	// of the write that produced the event, so a receiver computes the
	// latency from the event alone (writer and receivers share a clock).
	sentKey     = "bench-sent"
	preloadSent = "-"
	// fanSeed makes every run draw the same agents and churn order.
	fanSeed = 0xae7e
	// Dependency counts: a bounded Pareto with scale depScale and shape 1,
	// P(deps >= k) = depScale/k: a median of 2*depScale, about one agent in
	// ten above 10*depScale, and 2% at the cap of 200.
	depScale = 4
	// Service popularity: Zipf-Mandelbrot, weight 1/(rank+popOffset), so
	// the most depended-on service is in about a third of all agents'
	// dependencies at 3000 services, and the least in under 1%.
	popOffset = 10
)

type fanWorkload struct {
	services []string
	eps      []*registryv1.ServiceEndpoint // endpoint i belongs to service i % S
	perSvc   []int                         // endpoints per service
	agents   [][]int32                     // each agent's dependencies (service indices)
	churn    []int32                       // endpoint order of the updates: a shuffled cycle
}

func fanServiceName(i int) string { return fmt.Sprintf("fan-svc-%04d", i) }

func newFanWorkload(services, endpoints, agents, maxDeps int) *fanWorkload {
	w := &fanWorkload{perSvc: make([]int, services)}
	for s := range services {
		w.services = append(w.services, fanServiceName(s))
	}
	w.eps = make([]*registryv1.ServiceEndpoint, endpoints)
	for i := range endpoints {
		s := i % services
		w.perSvc[s]++
		w.eps[i] = &registryv1.ServiceEndpoint{
			Service: w.services[s], Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: benchIP(i),
			Ports:  []*registryv1.Port{{Name: "http", Port: 8080}},
			Region: fanRegion, Cluster: fanCluster, Zone: "zone-a", State: registryv1.State_STATE_SERVING,
			Metadata: map[string]string{"version": "v1", sentKey: preloadSent},
		}
	}
	rng := rand.New(rand.NewPCG(fanSeed, uint64(services)))
	maxDeps = max(1, min(maxDeps, services/2))
	cum := make([]float64, services)
	var sum float64
	for s := range services {
		sum += 1 / float64(s+popOffset)
		cum[s] = sum
	}
	stamp := make([]int32, services)
	for a := range agents {
		n := int(depScale / (1 - rng.Float64())) // 1-U is in (0, 1]
		n = max(1, min(n, maxDeps))
		deps := make([]int32, 0, n)
		for len(deps) < n {
			s := sort.SearchFloat64s(cum, rng.Float64()*sum)
			s = min(s, services-1)
			if stamp[s] == int32(a+1) {
				continue
			}
			stamp[s] = int32(a + 1)
			deps = append(deps, int32(s))
		}
		w.agents = append(w.agents, deps)
	}
	w.churn = make([]int32, endpoints)
	for i := range w.churn {
		w.churn[i] = int32(i)
	}
	rng.Shuffle(len(w.churn), func(i, j int) { w.churn[i], w.churn[j] = w.churn[j], w.churn[i] })
	return w
}

// depStats describes the agents' dependency counts.
func (w *fanWorkload) depStats() (subs int, mean float64, median, maxN int) {
	ns := make([]int, len(w.agents))
	for i, d := range w.agents {
		ns[i] = len(d)
		subs += len(d)
	}
	if len(ns) == 0 {
		return 0, 0, 0, 0
	}
	slices.Sort(ns)
	return subs, float64(subs) / float64(len(ns)), ns[len(ns)/2], ns[len(ns)-1]
}

// subscribers counts, per service, the agents that depend on it among
// those for which in(agent) holds.
func (w *fanWorkload) subscribers(in func(agent int) bool) []int64 {
	out := make([]int64, len(w.services))
	for a, deps := range w.agents {
		if in(a) {
			for _, s := range deps {
				out[s]++
			}
		}
	}
	return out
}

// snapshotSize is how many endpoints an agent's initial state holds.
func (w *fanWorkload) snapshotSize(agent int) int {
	n := 0
	for _, s := range w.agents[agent] {
		n += w.perSvc[s]
	}
	return n
}

// preload writes every endpoint straight into etcd in v1 keys, with
// etcdstore's batched Apply (transactions of 128), several at a time.
func (w *fanWorkload) preload(ctx context.Context, cli *clientv3.Client) error {
	st := etcdstore.New(cli, etcdstore.Options{})
	const chunk = 1024
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				lo := int(next.Add(chunk)) - chunk
				if lo >= len(w.eps) {
					return
				}
				hi := min(lo+chunk, len(w.eps))
				muts := make([]etcdstore.Mutation, 0, hi-lo)
				for _, ep := range w.eps[lo:hi] {
					muts = append(muts, etcdstore.Mutation{ID: registry.IDOf(ep), Endpoint: ep})
				}
				if _, err := st.Apply(ctx, muts); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// stamped is endpoint i carrying the send time of a change of phase.
func (w *fanWorkload) stamped(i int, phase int, sent time.Time) *registryv1.ServiceEndpoint {
	ep := w.eps[i]
	return &registryv1.ServiceEndpoint{
		Service: ep.Service, Protocol: ep.Protocol, Ip: ep.Ip, Ports: ep.Ports,
		Region: ep.Region, Cluster: ep.Cluster, Zone: ep.Zone, State: ep.State,
		Metadata: map[string]string{"version": "v1", sentKey: strconv.Itoa(phase) + "/" + strconv.FormatInt(sent.UnixNano(), 10)},
	}
}

// parseSent reads a sentKey value.
func parseSent(v string) (phase int, sent int64, ok bool) {
	p, t, found := strings.Cut(v, "/")
	if !found {
		return 0, 0, false
	}
	ph, err1 := strconv.Atoi(p)
	ns, err2 := strconv.ParseInt(t, 10, 64)
	if err1 != nil || err2 != nil || ns == 0 {
		return 0, 0, false
	}
	return ph, ns, true
}

// receipts are what receivers record of delivered changes: each one's
// latency in the histogram of its phase and the receiver's path.
type receipts struct {
	phases []*phaseStats // indexed by phase
}

// phaseStats are one phase's deliveries on each path.
type phaseStats struct {
	paths [2]histogram // registrar: same, cross replica; etcd modes: [0] only
	bad   atomic.Int64 // events whose send time did not parse
}

func newReceipts(phases int) *receipts {
	r := &receipts{}
	for range phases {
		r.phases = append(r.phases, &phaseStats{})
	}
	return r
}

// record counts a delivery of an event with metadata value v.
func (r *receipts) record(path int, v string, now time.Time) {
	if v == preloadSent {
		return // a preloaded value, not a change
	}
	phase, sent, ok := parseSent(v)
	if !ok || phase < 0 || phase >= len(r.phases) {
		r.phases[0].bad.Add(1)
		return
	}
	r.phases[phase].paths[path].record(now.Sub(time.Unix(0, sent)))
}

// churnResult is what the churn writer did in one phase.
type churnResult struct {
	Issued    int     // changes written successfully
	Errors    int     // writes that failed
	FirstErr  string  // the first failure
	Behind    int     // changes not issued because every writer was busy
	Seconds   float64 // from the first to the last scheduled change
	Achieved  float64 // changes per second written
	expectedN [2]int64
}

// churnWriters is how many changes the churn writer has in flight at most.
const churnWriters = 128

// runChurn updates endpoints at rate per second for d, open loop: a pacer
// hands each due change to one of workers concurrent writers, so a slow
// write does not slow the rate (unless every writer is busy, which counts
// as behind). write gets the endpoint index and does the write, stamping
// the send time itself; expected adds the deliveries a successful change
// of endpoint i should produce on each path.
func runChurn(ctx context.Context, w *fanWorkload, start int, rate int, d time.Duration, workers int,
	write func(ctx context.Context, i int) error, expected func(i int) [2]int64) (churnResult, int) {
	var res churnResult
	jobs := make(chan int, max(workers*2, rate)) // up to a second's worth queued
	var wg sync.WaitGroup
	var mu sync.Mutex
	var issued, errs int
	var exp [2]int64
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				err := write(ctx, i)
				mu.Lock()
				if err != nil {
					errs++
					if res.FirstErr == "" {
						res.FirstErr = err.Error()
					}
				} else {
					issued++
					e := expected(i)
					exp[0] += e[0]
					exp[1] += e[1]
				}
				mu.Unlock()
			}
		}()
	}
	total := int(float64(rate) * d.Seconds())
	k := start
	began := time.Now()
	tick := time.NewTicker(2 * time.Millisecond)
	sent := 0
loop:
	for sent < total {
		select {
		case <-ctx.Done():
			break loop
		case <-tick.C:
		}
		due := min(total, int(time.Since(began).Seconds()*float64(rate)))
		for sent < due {
			select {
			case jobs <- int(w.churn[k%len(w.churn)]):
				k++
				sent++
			default:
				// Every writer is busy and the queue is full: this change
				// is skipped, not delayed (open loop).
				res.Behind++
				sent++
			}
		}
	}
	tick.Stop()
	res.Seconds = time.Since(began).Seconds()
	close(jobs)
	wg.Wait()
	res.Issued, res.Errors, res.expectedN = issued, errs, exp
	res.Achieved = float64(issued) / math.Max(res.Seconds, 1e-9)
	return res, k
}
