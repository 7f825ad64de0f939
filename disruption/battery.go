package disruption

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/client"
)

// The phases of a battery, in order. The names are what Result and the
// benchmark report print per phase, so they name the disruption itself.
const (
	PhaseBaseline = "baseline"
	PhaseRoll     = "roll svc-1/svc-4/svc-5"
	PhaseRestart  = "registrar rolling restart"
	PhaseStorm    = "reconnect storm"
	PhaseChurn    = "churn svc-2+svc-3"
	PhaseSettle   = "settle"
)

type phase struct {
	name string
	run  func()
}

type battery struct {
	ctx     context.Context
	cfg     Config
	g       *truth
	w       *writer
	cl      *cluster
	clients []atomic.Pointer[client.Client]
	phases  []phase

	phase atomic.Int32
	start time.Time // when the resolvers started

	errMu sync.Mutex
	errs  []error

	propMu             sync.Mutex
	regProp, drainProp []time.Duration
	observers          sync.WaitGroup
	observersCtx       context.Context
	stopObservers      context.CancelFunc
}

// Run runs one battery: it starts an etcd and two registrars, deploys
// EndpointsPerService pods of every service, starts the clients'
// resolvers and runs the phases, then waits until every client's cache
// has settled to the registered pods. Drops are measured, not errors: the
// error reports a battery that could not run as described (a write that
// kept failing, a change that never reached a client, a cache that never
// settled), and the Result holds whatever was measured until then.
func Run(ctx context.Context, cfg Config) (Result, error) {
	began := time.Now()
	cfg = cfg.withDefaults()
	res := Result{Config: cfg}
	if err := cfg.validate(); err != nil {
		return res, err
	}
	cl, err := startCluster(ctx, cfg)
	if err != nil {
		return res, err
	}
	b := &battery{ctx: ctx, cfg: cfg, g: newTruth(), cl: cl, clients: make([]atomic.Pointer[client.Client], cfg.Clients)}
	b.observersCtx, b.stopObservers = context.WithCancel(ctx)
	teardown := sync.OnceFunc(func() {
		b.stopObservers()
		b.observers.Wait()
		for i := range b.clients {
			if c := b.clients[i].Load(); c != nil {
				c.Close()
			}
		}
		b.fail(cl.close())
	})
	defer teardown()
	conns := make([]registrarv1.RegistrarClient, 2)
	for i := range conns {
		if conns[i], err = cl.dial(i); err != nil {
			return res, err
		}
	}
	b.w = &writer{conns: conns, timeout: cfg.PropagateTimeout}
	for i := range b.clients {
		c, err := b.newClient()
		if err != nil {
			return res, err
		}
		b.clients[i].Store(c)
	}

	// Initial deployment, fully visible before anyone resolves.
	var initial []*pod
	for _, svc := range Services {
		for range cfg.EndpointsPerService {
			p := b.g.spawn(svc)
			if err := b.w.register(p); err != nil {
				return res, err
			}
			b.g.set(p, registered)
			initial = append(initial, p)
		}
	}
	for _, p := range initial {
		if err := b.waitVisible(p); err != nil {
			return res, err
		}
	}

	b.phases = b.definePhases()
	res.Phases = make([]PhaseResult, len(b.phases))
	for i, ph := range b.phases {
		res.Phases[i].Name = ph.name
	}
	b.progress("disruption: %s, --sync-interval %v; %d clients x %d resolvers; %d pods per service; drain period %v",
		cfg.Mode(), cfg.SyncInterval, cfg.Clients, cfg.ResolversPerClient, cfg.EndpointsPerService, cfg.DrainPeriod)

	rctx, stopResolvers := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var stats []*resolverStats
	b.start = time.Now()
	for i := range cfg.Clients {
		for j := range cfg.ResolversPerClient {
			st := newResolverStats(len(b.phases))
			stats = append(stats, st)
			wg.Add(1)
			go func() {
				defer wg.Done()
				b.resolve(rctx, i, uint64(i*cfg.ResolversPerClient+j+1), st)
			}()
		}
	}
	for i, ph := range b.phases {
		b.phase.Store(int32(i))
		b.progress("phase %d/%d: %s", i+1, len(b.phases), ph.name)
		start := time.Now()
		ph.run()
		res.Phases[i].Duration = time.Since(start)
		if b.failed() {
			break
		}
	}
	stopResolvers()
	wg.Wait()

	b.merge(&res, stats)
	if !b.failed() {
		b.settle()
	}
	if b.failed() {
		b.stopObservers()
	}
	// Settled: every observer sees what it waits for at its next look.
	b.observers.Wait()
	teardown()
	b.propMu.Lock()
	res.RegisterPropagation, res.DrainPropagation = summarize(b.regProp), summarize(b.drainProp)
	b.propMu.Unlock()
	res.Duration = time.Since(began)
	b.progress("%s", res.Summary())
	return res, b.err()
}

// definePhases is the battery: baseline, rolls, a rolling restart of both
// registrars, a reconnect storm, churn of two services at once, settle.
func (b *battery) definePhases() []phase {
	return []phase{
		{PhaseBaseline, func() { b.sleep(b.cfg.Quiet) }},
		{PhaseRoll, func() {
			for _, svc := range []string{"svc-1", "svc-4", "svc-5"} {
				b.roll(svc)
			}
		}},
		{PhaseRestart, func() {
			for _, i := range []int{replicaA, replicaB} {
				if err := b.cl.stop(i); err != nil {
					b.fail(err)
					return
				}
				// Down for a while: B's watchers fail over to A. Every
				// client is back on a stream, necessarily to the other
				// replica, and a roll while one replica is down reaches
				// them (writes fail over to B while A is down).
				b.sleep(b.cfg.Downtime)
				b.connected()
				b.roll(map[int]string{replicaA: "svc-3", replicaB: "svc-4"}[i])
				if err := b.cl.start(b.ctx, i); err != nil {
					b.fail(err)
					return
				}
				b.sleep(b.cfg.Downtime)
			}
			// Both replicas are back: a write through A is seen through B.
			b.roll("svc-2")
		}},
		{PhaseStorm, func() {
			for range b.cfg.Storms {
				next := make([]*client.Client, len(b.clients))
				errs := make([]error, len(b.clients))
				var wg sync.WaitGroup
				for i := range next {
					wg.Add(1)
					go func() { defer wg.Done(); next[i], errs[i] = b.newClient() }()
				}
				wg.Wait()
				if err := errors.Join(errs...); err != nil {
					b.fail(err)
					for _, c := range next {
						if c != nil {
							c.Close()
						}
					}
					return
				}
				for i := range next {
					b.clients[i].Swap(next[i]).Close()
				}
				b.sleep(b.cfg.Quiet / 3)
			}
		}},
		{PhaseChurn, func() {
			var wg sync.WaitGroup
			for _, svc := range []string{"svc-2", "svc-3"} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range b.cfg.ChurnRolls {
						b.roll(svc)
					}
				}()
			}
			wg.Wait()
		}},
		{PhaseSettle, func() { b.sleep(b.cfg.Quiet) }},
	}
}

func (b *battery) newClient() (*client.Client, error) {
	// Clients watch through B first, failing over to A.
	return client.New(client.Config{
		Addrs:       []string{b.cl.addrs[replicaB], b.cl.addrs[replicaA]},
		Services:    Services,
		Node:        "resolver",
		BackoffBase: 20 * time.Millisecond,
		BackoffMax:  300 * time.Millisecond,
		Logger:      b.cfg.Logger,
	})
}

func (b *battery) progress(format string, args ...any) {
	if b.cfg.Progress != nil {
		fmt.Fprintf(b.cfg.Progress, format+"\n", args...)
	}
}

// fail records why the battery cannot go on; phases stop at their next
// step.
func (b *battery) fail(err error) {
	if err == nil {
		return
	}
	b.errMu.Lock()
	b.errs = append(b.errs, err)
	b.errMu.Unlock()
}

func (b *battery) failed() bool {
	b.errMu.Lock()
	defer b.errMu.Unlock()
	return len(b.errs) > 0 || b.ctx.Err() != nil
}

func (b *battery) err() error {
	b.errMu.Lock()
	defer b.errMu.Unlock()
	errs := b.errs
	if len(errs) > 5 {
		errs = append(errs[:5:5], fmt.Errorf("and %d more", len(b.errs)-5))
	}
	if err := b.ctx.Err(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// sleep waits d, or less if ctx ends.
func (b *battery) sleep(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-b.ctx.Done():
	case <-t.C:
	}
}

// ---------------------------------------------------------------------------
// Rolls, as a Deployment does them: never waiting for the clients.

// roll replaces every pod of svc, one at a time: a new pod is registered
// and, ReadyDelay later, an old one retired.
func (b *battery) roll(svc string) {
	for _, old := range b.g.registered(svc) {
		if b.failed() {
			return
		}
		b.surge(svc)
		b.sleep(b.cfg.ReadyDelay)
		b.retire(old)
	}
}

// surge brings up a new pod of svc.
func (b *battery) surge(svc string) {
	p := b.g.spawn(svc)
	if err := b.w.register(p); err != nil {
		b.fail(err)
		return
	}
	b.g.set(p, registered)
	b.observe(p, time.Now(), false)
}

// retire takes an old pod down the two-phase way: drain, stay alive for
// the drain period, deregister, and only then die.
func (b *battery) retire(p *pod) {
	b.g.retire(p, int(b.phase.Load()))
	start := time.Now()
	if err := b.w.drain(p); err != nil {
		b.fail(err)
		return
	}
	b.observe(p, start, true)
	b.sleep(b.cfg.DrainPeriod - time.Since(start))
	if err := b.w.unregister(p); err != nil {
		b.fail(err)
		return
	}
	b.g.set(p, dead)
}

// ---------------------------------------------------------------------------
// Watching the clients, aside from the rolls.

// seen reports whether every client shows p (any state), or with drained
// whether no client shows p SERVING.
func (b *battery) seen(p *pod, drained bool) bool {
	for i := range b.clients {
		eps, err := b.clients[i].Load().Endpoints(b.observersCtx, p.svc)
		if err != nil {
			return false
		}
		var got *registryv1.ServiceEndpoint
		for _, e := range eps {
			if e.Ip == p.ip {
				got = e
			}
		}
		if drained && got != nil && got.State == registryv1.State_STATE_SERVING || !drained && got == nil {
			return false
		}
	}
	return true
}

// observe records, aside, how long p's registration (or drain) takes from
// since to reach every client. A registration that is never seen because
// its pod is dead by then is not counted; a change that takes longer than
// PropagateTimeout fails the battery.
func (b *battery) observe(p *pod, since time.Time, drained bool) {
	b.observers.Add(1)
	go func() {
		defer b.observers.Done()
		deadline := since.Add(b.cfg.PropagateTimeout)
		for b.observersCtx.Err() == nil {
			if b.seen(p, drained) {
				d := time.Since(since)
				b.propMu.Lock()
				if drained {
					b.drainProp = append(b.drainProp, d)
				} else {
					b.regProp = append(b.regProp, d)
				}
				b.propMu.Unlock()
				return
			}
			if !drained && b.g.lifeOf(p) == dead {
				return
			}
			if time.Now().After(deadline) {
				what := "registered"
				if drained {
					what = "drained"
				}
				b.fail(fmt.Errorf("%s %s %s, not seen so by every client within %v", p.svc, p.ip, what, b.cfg.PropagateTimeout))
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
}

// waitVisible waits until every client shows p SERVING.
func (b *battery) waitVisible(p *pod) error {
	deadline := time.Now().Add(b.cfg.PropagateTimeout)
	for !b.seen(p, false) {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s %s not on every client within %v", p.svc, p.ip, b.cfg.PropagateTimeout)
		}
		if err := b.ctx.Err(); err != nil {
			return err
		}
		time.Sleep(2 * time.Millisecond)
	}
	return nil
}

// connected waits until every client has a live stream.
func (b *battery) connected() {
	deadline := time.Now().Add(b.cfg.PropagateTimeout)
	for i := range b.clients {
		for !b.clients[i].Load().Connected() {
			if time.Now().After(deadline) {
				b.fail(fmt.Errorf("client %d not reconnected within %v", i, b.cfg.PropagateTimeout))
				return
			}
			if b.ctx.Err() != nil {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// settle waits until every client's cache is exactly the registered pods,
// SERVING (the last deregistrations may still be in flight).
func (b *battery) settle() {
	mismatch := func() string {
		for i := range b.clients {
			for _, svc := range Services {
				eps, err := b.clients[i].Load().Endpoints(b.ctx, svc)
				if err != nil {
					return err.Error()
				}
				var got, want []string
				for _, e := range eps {
					got = append(got, e.Ip+"/"+e.State.String())
				}
				for _, p := range b.g.registered(svc) {
					want = append(want, p.ip+"/"+registryv1.State_STATE_SERVING.String())
				}
				slices.Sort(got)
				slices.Sort(want)
				if !slices.Equal(got, want) {
					return fmt.Sprintf("client %d, %s: %v, want %v", i, svc, got, want)
				}
			}
		}
		return ""
	}
	for deadline := time.Now().Add(b.cfg.PropagateTimeout); b.ctx.Err() == nil; time.Sleep(10 * time.Millisecond) {
		m := mismatch()
		if m == "" {
			return
		}
		if time.Now().After(deadline) {
			b.fail(fmt.Errorf("not settled after %v: %s", b.cfg.PropagateTimeout, m))
			return
		}
	}
}

// merge adds up the resolvers' records.
func (b *battery) merge(res *Result, stats []*resolverStats) {
	windows := map[windowKey]*windowAcc{}
	var samples []sample
	for _, st := range stats {
		for i := range b.phases {
			res.Phases[i].Resolutions += st.resolutions[i]
			res.Phases[i].Tally.add(st.tallies[i])
		}
		for k, w := range st.windows {
			m := windows[k]
			if m == nil {
				m = &windowAcc{dead: map[string]bool{}, first: w.first, last: w.last, sample: w.sample}
				windows[k] = m
			}
			m.Tally.add(w.Tally)
			if w.first < m.first {
				m.first, m.sample = w.first, w.sample
			}
			m.last = max(m.last, w.last)
			for ip := range w.dead {
				m.dead[ip] = true
			}
		}
	}
	for _, w := range windows {
		samples = append(samples, w.sample)
	}
	slices.SortFunc(samples, func(x, y sample) int { return cmp.Compare(x.at, y.at) })
	for _, s := range samples[:min(len(samples), maxSamples)] {
		res.Samples = append(res.Samples, s.text)
	}
	for _, p := range res.Phases {
		res.Resolutions += p.Resolutions
		res.Tally.add(p.Tally)
	}
	for k, w := range windows {
		res.Windows = append(res.Windows, Window{
			Phase: b.phases[k.phase].name, Service: k.svc, Tally: w.Tally,
			DeadEndpoints: len(w.dead), First: w.first, Last: w.last,
		})
	}
	slices.SortFunc(res.Windows, func(x, y Window) int { return cmp.Compare(x.First, y.First) })
}
