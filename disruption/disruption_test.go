// Package disruption reproduces seed 000's empirical validation (issue 6,
// section 3) in a short form: two registrar replicas on one etcd, writes
// through replica A, agent clients watching through replica B, continuous
// resolvers checking every resolution against ground truth while endpoints
// roll, registrars restart, clients reconnect and services churn.
package disruption

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/client"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/registrar"
)

// Battery parameters (short form).
const (
	numClients       = 3
	resolversPerCli  = 2
	endpointsPerSvc  = 2
	drainPeriod      = 100 * time.Millisecond // minimum time an endpoint stays DRAINING before deregistration
	propagateTimeout = 15 * time.Second       // a write not visible on every client by then fails the test
	quietPhase       = 750 * time.Millisecond // resolving time of phases without writes
)

var services = []string{"svc-1", "svc-2", "svc-3", "svc-4", "svc-5"}

// multiPort is the service whose endpoints expose two ports (h1 and h2c).
const multiPort = "svc-5"

func portsOf(svc string) []*registryv1.Port {
	if svc == multiPort {
		return []*registryv1.Port{{Name: "h1", Port: 8080}, {Name: "h2c", Port: 3001}}
	}
	return []*registryv1.Port{{Name: "http", Port: 8080}}
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// ---------------------------------------------------------------------------
// Ground truth.

// life is where a pod is in its life. Only registered endpoints are
// required to be found; pending and draining ones are alive (a resolver may
// still pick them from a stale cache) but need not be found; dead ones must
// never be picked.
type life int

const (
	pending    life = iota // alive, register sent but not acknowledged (surge)
	registered             // alive, registered SERVING and acknowledged
	draining               // alive, drain decided: no new traffic required
	dead                   // deregistered (acknowledged) and gone
)

type pod struct {
	svc, ip string
	ports   []*registryv1.Port
	life    life
}

// truth is the set of pods. Every transition takes the write lock; a
// resolver holds the read lock across reading its client's cache, picking
// and checking, so a resolution and a death are totally ordered: a pod
// reported dead was dead when the cache was read.
type truth struct {
	mu   sync.RWMutex
	pods map[string]map[string]*pod // service -> ip -> pod
	next atomic.Uint32
}

func newTruth() *truth {
	g := &truth{pods: map[string]map[string]*pod{}}
	for _, s := range services {
		g.pods[s] = map[string]*pod{}
	}
	return g
}

// spawn starts a new pod of svc: it is alive before it registers.
func (g *truth) spawn(svc string) *pod {
	n := g.next.Add(1)
	p := &pod{svc: svc, ip: fmt.Sprintf("10.%d.%d.%d", 1+n/65536, (n/256)%256, n%256), ports: portsOf(svc), life: pending}
	g.set(p, pending, true)
	return p
}

func (g *truth) set(p *pod, l life, add bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if add {
		g.pods[p.svc][p.ip] = p
	}
	p.life = l
}

// ---------------------------------------------------------------------------
// Writes, through replica A (failing over to B only while A is down).

type writer struct {
	conns []registrarv1.RegistrarClient
}

func (w *writer) do(t testing.TB, what string, call func(ctx context.Context, c registrarv1.RegistrarClient) error) {
	t.Helper()
	deadline := time.Now().Add(propagateTimeout)
	for {
		var err error
		for _, c := range w.conns {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			err = call(ctx, c)
			cancel()
			if err == nil {
				return
			}
			if code := status.Code(err); code != codes.Unavailable && code != codes.DeadlineExceeded {
				t.Errorf("%s: %v", what, err)
				return
			}
		}
		if time.Now().After(deadline) {
			t.Errorf("%s: %v", what, err)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (w *writer) register(t testing.TB, p *pod) {
	w.do(t, "register "+p.ip, func(ctx context.Context, c registrarv1.RegistrarClient) error {
		_, err := c.RegisterEndpoint(ctx, &registrarv1.RegisterEndpointRequest{Endpoint: &registryv1.ServiceEndpoint{
			Service: p.svc, Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: p.ip, Ports: p.ports,
			Zone: "z1", State: registryv1.State_STATE_SERVING,
			// No Node: static endpoints, never ghost-swept.
		}})
		return err
	})
}

func (w *writer) drain(t testing.TB, p *pod) {
	w.do(t, "drain "+p.ip, func(ctx context.Context, c registrarv1.RegistrarClient) error {
		_, err := c.DrainEndpoint(ctx, &registrarv1.DrainEndpointRequest{Service: p.svc, Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: p.ip})
		return err
	})
}

func (w *writer) unregister(t testing.TB, p *pod) {
	w.do(t, "unregister "+p.ip, func(ctx context.Context, c registrarv1.RegistrarClient) error {
		_, err := c.UnregisterEndpoint(ctx, &registrarv1.UnregisterEndpointRequest{Service: p.svc, Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: p.ip})
		if status.Code(err) == codes.NotFound {
			return nil
		}
		return err
	})
}

// ---------------------------------------------------------------------------
// The battery.

type battery struct {
	t       *testing.T
	g       *truth
	w       *writer
	clients [numClients]atomic.Pointer[client.Client]
	addrs   []string // B, A: clients watch through B

	phase atomic.Int32

	propMu  sync.Mutex
	maxProp time.Duration // slowest write to become visible on every client
}

type phaseStats struct{ resolutions, drops, noServing, deadPicks int64 }

func (b *battery) newClient() *client.Client {
	c, err := client.New(client.Config{
		Addrs:       b.addrs,
		Services:    services,
		Node:        "resolver",
		BackoffBase: 20 * time.Millisecond,
		BackoffMax:  300 * time.Millisecond,
		Logger:      quietLogger(),
	})
	if err != nil {
		b.t.Fatal(err)
	}
	return c
}

// visible waits until every client's cache shows p in state want (or, for
// want == STATE_UNSPECIFIED, does not show p), and records how long it took.
func (b *battery) visible(p *pod, want registryv1.State) {
	start := time.Now()
	deadline := start.Add(propagateTimeout)
	for {
		ok := true
		for i := range b.clients {
			eps, err := b.clients[i].Load().Endpoints(context.Background(), p.svc)
			if err != nil {
				ok = false
				break
			}
			got := registryv1.State_STATE_UNSPECIFIED
			for _, e := range eps {
				if e.Ip == p.ip {
					got = e.State
				}
			}
			if got != want {
				ok = false
				break
			}
		}
		if ok {
			d := time.Since(start)
			b.propMu.Lock()
			b.maxProp = max(b.maxProp, d)
			b.propMu.Unlock()
			return
		}
		if time.Now().After(deadline) {
			b.t.Errorf("%s %s not %v on every client within %v", p.svc, p.ip, want, propagateTimeout)
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// connected waits until every client has a live stream.
func (b *battery) connected() {
	deadline := time.Now().Add(propagateTimeout)
	for i := range b.clients {
		for !b.clients[i].Load().Connected() {
			if time.Now().After(deadline) {
				b.t.Errorf("client %d not reconnected within %v", i, propagateTimeout)
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// surge brings up a new pod of svc and waits until every client sees it.
func (b *battery) surge(svc string) *pod {
	p := b.g.spawn(svc)
	b.w.register(b.t, p)
	b.g.set(p, registered, false)
	b.visible(p, registryv1.State_STATE_SERVING)
	return p
}

// retire takes an old pod down the two-phase way: drain, wait until every
// client has seen the drain and the drain period has passed, deregister,
// and only then the pod dies.
func (b *battery) retire(p *pod) {
	b.g.set(p, draining, false)
	start := time.Now()
	b.w.drain(b.t, p)
	b.visible(p, registryv1.State_STATE_DRAINING)
	if d := drainPeriod - time.Since(start); d > 0 {
		time.Sleep(d)
	}
	b.w.unregister(b.t, p)
	b.g.set(p, dead, false)
}

// roll replaces every pod of svc, one at a time, surge first.
func (b *battery) roll(svc string) {
	b.g.mu.RLock()
	var old []*pod
	for _, p := range b.g.pods[svc] {
		if p.life == registered {
			old = append(old, p)
		}
	}
	b.g.mu.RUnlock()
	slices.SortFunc(old, func(x, y *pod) int { return cmpStr(x.ip, y.ip) })
	for _, p := range old {
		b.surge(svc)
		b.retire(p)
	}
}

func cmpStr(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// resolve is one resolver: it picks a SERVING endpoint of a random service
// from its client's cache and checks it against ground truth.
func (b *battery) resolve(ctx context.Context, idx int, seed uint64, stats []phaseStats, wg *sync.WaitGroup) {
	defer wg.Done()
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	serving := make([]*registryv1.ServiceEndpoint, 0, 8)
	for n := 0; ctx.Err() == nil; n++ {
		if n%256 == 255 {
			time.Sleep(time.Millisecond) // leave CPU to the registrars on small machines
		}
		ph := b.phase.Load()
		svc := services[rng.IntN(len(services))]
		cl := b.clients[idx].Load()

		b.g.mu.RLock()
		eps, err := cl.Endpoints(ctx, svc)
		if err != nil {
			b.g.mu.RUnlock()
			if errors.Is(err, client.ErrClosed) || ctx.Err() != nil {
				continue // swapped out by the reconnect storm: not a resolution
			}
			b.t.Errorf("resolver %d: %s: %v", idx, svc, err)
			return
		}
		serving = serving[:0]
		for _, e := range eps {
			if e.State == registryv1.State_STATE_SERVING {
				serving = append(serving, e)
			}
		}
		var drop string
		if len(serving) == 0 {
			for _, p := range b.g.pods[svc] {
				if p.life == registered {
					drop = fmt.Sprintf("no SERVING endpoint of %s while %s is registered and alive", svc, p.ip)
					stats[ph].noServing++
					break
				}
			}
		} else {
			e := serving[rng.IntN(len(serving))]
			p := b.g.pods[svc][e.Ip]
			switch {
			case p == nil:
				drop = fmt.Sprintf("picked %s %s, which never existed", svc, e.Ip)
			case p.life == dead:
				drop = fmt.Sprintf("picked %s %s, which is dead", svc, e.Ip)
			case len(e.Ports) != len(p.ports):
				drop = fmt.Sprintf("picked %s %s with ports %v, want %v", svc, e.Ip, e.Ports, p.ports)
			}
			if drop != "" {
				stats[ph].deadPicks++
			}
		}
		b.g.mu.RUnlock()

		stats[ph].resolutions++
		if drop != "" {
			stats[ph].drops++
			if stats[ph].drops <= 3 {
				b.t.Errorf("drop (phase %d, resolver %d): %s", ph, idx, drop)
			}
		}
	}
}

func startRegistrar(t *testing.T, etcd []string, grpcAddr string) *registrar.Server {
	t.Helper()
	var (
		s   *registrar.Server
		err error
	)
	// The port was just released by the previous replica (or by freeAddr):
	// retry briefly in case the kernel has not handed it back yet.
	for range 50 {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		s, err = registrar.Start(ctx, registrar.Options{
			EtcdEndpoints: etcd,
			GRPCAddr:      grpcAddr,
			HTTPAddr:      "127.0.0.1:0",
			ClusterName:   "c1",
			Region:        "r1",
			Logger:        quietLogger(),
		})
		cancel()
		if err == nil {
			return s
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("start registrar on %s: %v", grpcAddr, err)
	return nil
}

func closeRegistrar(t *testing.T, s *registrar.Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Close(ctx); err != nil {
		t.Errorf("close registrar %s: %v", s.GRPCAddr(), err)
	}
}

func dial(t *testing.T, addr string) registrarv1.RegistrarClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return registrarv1.NewRegistrarClient(cc)
}

func TestDisruptionBattery(t *testing.T) {
	begin := time.Now()
	etcd := etcdtest.Start(t)
	addrA, addrB := freeAddr(t), freeAddr(t)
	regs := map[string]*registrar.Server{
		addrA: startRegistrar(t, etcd.Endpoints(), addrA),
		addrB: startRegistrar(t, etcd.Endpoints(), addrB),
	}
	t.Cleanup(func() {
		for _, s := range regs {
			if s != nil {
				closeRegistrar(t, s)
			}
		}
	})

	b := &battery{
		t:     t,
		g:     newTruth(),
		w:     &writer{conns: []registrarv1.RegistrarClient{dial(t, addrA), dial(t, addrB)}},
		addrs: []string{addrB, addrA},
	}
	for i := range b.clients {
		b.clients[i].Store(b.newClient())
	}
	t.Cleanup(func() {
		for i := range b.clients {
			b.clients[i].Load().Close()
		}
	})

	// Initial deployment, fully visible before anyone resolves.
	for _, svc := range services {
		for range endpointsPerSvc {
			b.surge(svc)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	phases := []struct {
		name string
		run  func()
	}{
		{"baseline", func() { time.Sleep(quietPhase) }},
		{"roll svc-1/svc-4/svc-5", func() {
			for _, svc := range []string{"svc-1", "svc-4", "svc-5"} {
				b.roll(svc)
			}
		}},
		{"registrar rolling restart", func() {
			for _, addr := range []string{addrA, addrB} {
				closeRegistrar(t, regs[addr])
				regs[addr] = nil
				time.Sleep(quietPhase / 2) // down for a while: B's watchers fail over to A
				// Every client is back on a stream, necessarily to the other
				// replica, and a roll while one replica is down reaches them
				// (writes fail over to B while A is down).
				b.connected()
				b.roll(map[string]string{addrA: "svc-3", addrB: "svc-4"}[addr])
				regs[addr] = startRegistrar(t, etcd.Endpoints(), addr)
				time.Sleep(quietPhase / 2)
			}
			// Both replicas are back: a write through A is seen through B.
			b.roll("svc-2")
		}},
		{"reconnect storm", func() {
			for range 3 {
				var next [numClients]*client.Client
				var wg sync.WaitGroup
				for i := range next {
					wg.Add(1)
					go func() { defer wg.Done(); next[i] = b.newClient() }()
				}
				wg.Wait()
				for i := range next {
					b.clients[i].Swap(next[i]).Close()
				}
				time.Sleep(quietPhase / 3)
			}
		}},
		{"churn svc-2+svc-3", func() {
			var wg sync.WaitGroup
			for _, svc := range []string{"svc-2", "svc-3"} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range 2 {
						b.roll(svc)
					}
				}()
			}
			wg.Wait()
		}},
		{"settle", func() { time.Sleep(quietPhase) }},
	}

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var perResolver [][]phaseStats
	for i := range numClients {
		for j := range resolversPerCli {
			st := make([]phaseStats, len(phases))
			perResolver = append(perResolver, st)
			wg.Add(1)
			go b.resolve(ctx, i, uint64(i*resolversPerCli+j+1), st, &wg)
		}
	}
	durs := make([]time.Duration, len(phases))
	for i, ph := range phases {
		b.phase.Store(int32(i))
		start := time.Now()
		ph.run()
		durs[i] = time.Since(start)
		if t.Failed() {
			break
		}
	}
	cancel()
	wg.Wait()

	var total phaseStats
	for i, ph := range phases {
		var s phaseStats
		for _, st := range perResolver {
			s.resolutions += st[i].resolutions
			s.drops += st[i].drops
			s.noServing += st[i].noServing
			s.deadPicks += st[i].deadPicks
		}
		total.resolutions += s.resolutions
		total.drops += s.drops
		t.Logf("phase %-26s %7v  resolutions %8d  drops %d (dead picks %d, none serving %d)",
			ph.name, durs[i].Round(time.Millisecond), s.resolutions, s.drops, s.deadPicks, s.noServing)
	}
	b.propMu.Lock()
	t.Logf("total: %d resolutions, %d drops; slowest write-to-every-client propagation %v; battery %v",
		total.resolutions, total.drops, b.maxProp.Round(time.Millisecond), time.Since(begin).Round(time.Millisecond))
	b.propMu.Unlock()

	// Settled: every client's cache comes to be exactly the registered
	// pods, SERVING (the last deregistrations may still be in flight).
	mismatch := func() string {
		for i := range b.clients {
			for _, svc := range services {
				eps, err := b.clients[i].Load().Endpoints(context.Background(), svc)
				if err != nil {
					return err.Error()
				}
				var got, want []string
				for _, e := range eps {
					got = append(got, e.Ip+"/"+e.State.String())
				}
				for _, p := range b.g.pods[svc] {
					if p.life == registered {
						want = append(want, p.ip+"/"+registryv1.State_STATE_SERVING.String())
					}
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
	for deadline := time.Now().Add(propagateTimeout); ; time.Sleep(10 * time.Millisecond) {
		m := mismatch()
		if m == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("not settled after %v: %s", propagateTimeout, m)
			break
		}
	}
	if total.drops != 0 {
		t.Errorf("%d drops over %d resolutions, want 0", total.drops, total.resolutions)
	}
	if total.resolutions < 10_000 {
		t.Errorf("only %d resolutions: the battery did not exercise the resolvers", total.resolutions)
	}
}
