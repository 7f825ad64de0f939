package registrar_test

import (
	"context"
	"fmt"
	"math/rand"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/internal/testutil/wait"
	"github.com/aethermesh/aether/registry"
	"github.com/aethermesh/aether/server"
)

// Last acknowledged wins, across replicas. Two registrars on one etcd each
// write behind on their own flush schedule, so the order in which their
// flushes reach etcd is unrelated to the order in which they acknowledged.
// These tests write to a few endpoints through both replicas and check
// that each endpoint ends, on both replicas and in etcd, in the state of
// its last acknowledged write.
//
// A write's result (its acknowledgement's endpoint) is what it must leave:
// a drain answered by a replica that had not yet seen an earlier write
// through the other replica drains what that replica held, and that is
// what the caller was told.

// lwInterval is the replicas' write-batch interval: long against an RPC, so
// a write waits in its replica's queue for a flush whose timing is
// unrelated to the other replica's, and flushes of the two interleave out
// of acknowledgement order unless something orders them.
const lwInterval = 150 * time.Millisecond

type lwOp int

const (
	lwRegister lwOp = iota
	lwDrain
	lwUnregister
)

func (o lwOp) String() string { return [...]string{"register", "drain", "unregister"}[o] }

// lwWrite is one write as the client saw it: issued at start, answered at
// end. result is the endpoint the acknowledgement reported (nil for an
// unregister); err is non-nil when the write was not acknowledged.
type lwWrite struct {
	seq        int64
	ep, via    int
	op         lwOp
	start, end time.Time
	result     *registryv1.ServiceEndpoint
	err        error
}

func (w lwWrite) String() string {
	s := fmt.Sprintf("#%d %s via R%d [%s..%s]", w.seq, w.op, w.via+1, w.start.Format("15:04:05.000"), w.end.Format("15:04:05.000"))
	if w.err != nil {
		return s + " failed: " + status.Code(w.err).String()
	}
	return s + " -> " + lwDescribe(w.result)
}

func lwDescribe(e *registryv1.ServiceEndpoint) string {
	if e == nil {
		return "absent"
	}
	return fmt.Sprintf("%s weight=%d w=%s", strings.TrimPrefix(e.State.String(), "STATE_"), e.Weight, e.Metadata["w"])
}

// lwRig is two registrars on one etcd and the writes made through them.
type lwRig struct {
	t    *testing.T
	etcd *etcdtest.Cluster
	srv  [2]*server.Server
	c    [2]registrarv1.RegistrarClient
	eps  []*registryv1.ServiceEndpoint // the endpoints under test (identity and ports)
	seq  atomic.Int64

	mu  sync.Mutex
	log [][]lwWrite // per endpoint, in order of acknowledgement
}

func newLWRig(t *testing.T, service string, n int, interval time.Duration) *lwRig {
	etcd := etcdtest.Start(t)
	slow := func(o *server.Config) { o.WriteBatchInterval = interval }
	g := &lwRig{t: t, etcd: etcd, log: make([][]lwWrite, n)}
	for i := range g.srv {
		g.srv[i] = startRegistrar(t, etcd.Endpoints(), slow)
		g.c[i] = dial(t, g.srv[i].GRPCAddr())
	}
	for i := 0; i < n; i++ {
		// Static endpoints (no node): any caller may remove them, and the
		// ghost sweep never does.
		g.eps = append(g.eps, &registryv1.ServiceEndpoint{
			Service: service, Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: fmt.Sprintf("10.7.0.%d", i+1),
			Ports: []*registryv1.Port{{Name: "http", Port: 8080}},
		})
	}
	return g
}

// write makes one write and records it. Only NOT_FOUND (a drain or
// unregister of an endpoint the replica does not know) is an expected
// refusal; anything else fails the test.
func (g *lwRig) write(ep, via int, op lwOp, rng *rand.Rand) lwWrite {
	w := lwWrite{seq: g.seq.Add(1), ep: ep, via: via, op: op}
	id := g.eps[ep]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w.start = time.Now()
	switch op {
	case lwRegister:
		e := proto.Clone(id).(*registryv1.ServiceEndpoint)
		e.Weight = uint32(1 + rng.Intn(100))
		e.Zone = fmt.Sprintf("z%d", rng.Intn(3))
		e.Metadata = map[string]string{"w": strconv.FormatInt(w.seq, 10), "via": strconv.Itoa(via + 1)}
		var resp *registrarv1.RegisterEndpointResponse
		resp, w.err = g.c[via].RegisterEndpoint(ctx, &registrarv1.RegisterEndpointRequest{Endpoint: e})
		w.result = resp.GetEndpoint()
	case lwDrain:
		var resp *registrarv1.DrainEndpointResponse
		resp, w.err = g.c[via].DrainEndpoint(ctx, &registrarv1.DrainEndpointRequest{Service: id.Service, Protocol: id.Protocol, Ip: id.Ip})
		w.result = resp.GetEndpoint()
	case lwUnregister:
		_, w.err = g.c[via].UnregisterEndpoint(ctx, &registrarv1.UnregisterEndpointRequest{Service: id.Service, Protocol: id.Protocol, Ip: id.Ip})
	}
	w.end = time.Now()
	if w.err != nil && status.Code(w.err) != codes.NotFound {
		g.t.Errorf("%s: unexpected error %v", w, w.err)
	}
	if w.err == nil && op != lwUnregister && w.result == nil {
		g.t.Errorf("%s: acknowledged without the endpoint", w)
	}
	g.mu.Lock()
	g.log[ep] = append(g.log[ep], w)
	g.mu.Unlock()
	return w
}

func randomOp(rng *rand.Rand) lwOp {
	switch n := rng.Intn(4); {
	case n < 2:
		return lwRegister
	case n == 2:
		return lwDrain
	default:
		return lwUnregister
	}
}

// churn is the noisy part of a round: writes alternating between the
// replicas from one goroutine, then two goroutines, one per replica,
// writing at the same time. It ends when every write has been answered.
func (g *lwRig) churn(rng *rand.Rand, alternating, concurrent int) {
	for i := 0; i < alternating; i++ {
		g.write(rng.Intn(len(g.eps)), i%2, randomOp(rng), rng)
	}
	var wg sync.WaitGroup
	for via := range g.c {
		seed := rng.Int63()
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewSource(seed))
			for i := 0; i < concurrent; i++ {
				g.write(rng.Intn(len(g.eps)), via, randomOp(rng), rng)
			}
		}()
	}
	wg.Wait()
}

// settle is the quiet end of a round. Per endpoint, with no other write to
// it in flight: a write through one replica, then, a gap later, a last one
// through the other, as in the report (a register through R1
// acknowledged well after a drain through R2 was, yet undone by it). The
// gap is shorter than a flush interval, so the earlier write can still sit
// in its replica's queue when the later one is acknowledged. Each pair
// starts at its own offset, so the pairs meet the two flush schedules at
// different phases. Meanwhile each replica keeps taking unrelated writes,
// as a busy one does, so its flushes come on its own schedule rather than
// right after each write. It returns, per endpoint, the last acknowledged
// write: the later of the pair, or the earlier if the later was refused.
func (g *lwRig) settle(rng *rand.Rand) []lwWrite {
	stop := make(chan struct{})
	var noise sync.WaitGroup
	for via := range g.c {
		noise.Add(1)
		go func() {
			defer noise.Done()
			tick := time.NewTicker(3 * time.Millisecond)
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err := g.c[via].RegisterEndpoint(ctx, &registrarv1.RegisterEndpointRequest{Endpoint: &registryv1.ServiceEndpoint{
					Service: "noise", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: fmt.Sprintf("10.8.%d.%d", via, i%200+1),
					Ports: []*registryv1.Port{{Name: "http", Port: 80}}, Metadata: map[string]string{"i": strconv.Itoa(i)},
				}})
				cancel()
				if err != nil {
					g.t.Errorf("noise write via R%d: %v", via+1, err)
					return
				}
			}
		}()
	}

	last := make([]lwWrite, len(g.eps))
	var wg sync.WaitGroup
	for ep := range g.eps {
		seed := rng.Int63()
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewSource(seed))
			first := rng.Intn(2)
			// The offset and the gap spread the pair over the flush
			// schedules; they are the scenario, not a wait for anything.
			time.Sleep(time.Duration(rng.Int63n(int64(2 * lwInterval))))
			op := lwRegister
			if rng.Intn(2) == 0 {
				op = lwDrain
			}
			a := g.write(ep, first, op, rng)
			if a.err != nil {
				a = g.write(ep, first, lwRegister, rng)
			}
			time.Sleep(time.Duration(5+rng.Int63n(int64(lwInterval/time.Millisecond/2))) * time.Millisecond)
			b := g.write(ep, 1-first, randomOp(rng), rng)
			last[ep] = b
			if b.err != nil {
				last[ep] = a
			}
		}()
	}
	wg.Wait()
	close(stop)
	noise.Wait()
	return last
}

// lwView is what one place holds of each endpoint under test.
type lwView []*registryv1.ServiceEndpoint

func (g *lwRig) replicaView(via int) lwView {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := g.c[via].ListAllEndpoints(ctx, &registrarv1.ListAllEndpointsRequest{Services: []string{g.eps[0].Service}})
	if err != nil {
		g.t.Fatalf("list R%d: %v", via+1, err)
	}
	v := make(lwView, len(g.eps))
	for _, e := range l.Endpoints {
		for i, id := range g.eps {
			if registry.IDOf(e) == registry.IDOf(withOrigin(id)) {
				v[i] = e
			}
		}
	}
	return v
}

func (g *lwRig) etcdView() lwView {
	cli := g.etcd.Client(g.t)
	v := make(lwView, len(g.eps))
	for i, id := range g.eps {
		_, v[i] = etcdKey(g.t, cli, id)
	}
	return v
}

func withOrigin(e *registryv1.ServiceEndpoint) *registryv1.ServiceEndpoint {
	c := proto.Clone(e).(*registryv1.ServiceEndpoint)
	c.Region, c.Cluster = "r1", "c1"
	return c
}

func sameOrAbsent(a, b *registryv1.ServiceEndpoint) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return registry.SameAttributes(a, b)
}

// converge waits until neither replica has a write left to persist and
// both replicas and etcd hold the same state of every endpoint, and
// returns the three views.
func (g *lwRig) converge() (views [3]lwView) {
	g.t.Helper()
	var last string
	defer func() {
		if g.t.Failed() && last != "" {
			g.t.Log("last views seen:\n" + last)
		}
	}()
	wait.For(g.t, "both replicas and etcd to agree, with nothing left to persist", 30*time.Second, func() bool {
		if g.srv[0].Registrar().PendingWrites() != 0 || g.srv[1].Registrar().PendingWrites() != 0 {
			return false
		}
		views = [3]lwView{g.replicaView(0), g.replicaView(1), g.etcdView()}
		var b strings.Builder
		agree := true
		for i := range g.eps {
			fmt.Fprintf(&b, "  %s: R1 %s, R2 %s, etcd %s\n", g.eps[i].Ip, lwDescribe(views[0][i]), lwDescribe(views[1][i]), lwDescribe(views[2][i]))
			agree = agree && sameOrAbsent(views[0][i], views[2][i]) && sameOrAbsent(views[1][i], views[2][i])
		}
		last = b.String()
		return agree
	})
	return views
}

// check asserts that every endpoint is, everywhere, as its last
// acknowledged write left it, and returns how many endpoints are not.
func (g *lwRig) check(round int, last []lwWrite, views [3]lwView) int {
	g.t.Helper()
	wrong := 0
	for i, w := range last {
		want := w.result // nil for an unregister: the endpoint must be absent
		ok := true
		for _, v := range views {
			ok = ok && sameOrAbsent(v[i], want)
		}
		if ok {
			continue
		}
		wrong++
		g.mu.Lock()
		hist := g.log[i]
		if len(hist) > 4 {
			hist = hist[len(hist)-4:]
		}
		g.mu.Unlock()
		var b strings.Builder
		for _, h := range hist {
			b.WriteString("\n    " + h.String())
		}
		g.t.Errorf("round %d, %s: last acknowledged write %s\n  but R1 has %s, R2 %s, etcd %s\n  its last writes:%s",
			round, g.eps[i].Ip, w, lwDescribe(views[0][i]), lwDescribe(views[1][i]), lwDescribe(views[2][i]), b.String())
	}
	return wrong
}

// TestLastWinsAcrossReplicas: thousands of alternating and concurrent
// writes to a few endpoints through two replicas, then a last write to
// each through a replica other than the one before it: every endpoint ends
// as its last acknowledged write left it, on both replicas and in etcd.
func TestLastWinsAcrossReplicas(t *testing.T) {
	t.Parallel()
	const endpoints, rounds = 6, 5
	g := newLWRig(t, "lastwins", endpoints, lwInterval)
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewSource(seed))
	writes, wrong := 0, 0
	for round := 1; round <= rounds; round++ {
		g.churn(rng, 600, 400)
		last := g.settle(rng)
		views := g.converge()
		wrong += g.check(round, last, views)
		writes = int(g.seq.Load())
	}
	t.Logf("%d writes to %d endpoints in %d rounds; %d of %d final states were not the last acknowledged write",
		writes, endpoints, rounds, wrong, endpoints*rounds)
}

// TestReadYourWritesAcrossReplicas: an endpoint registered through R1 and
// persisted is drained and then deregistered through R2 within a few
// milliseconds, before R2's watch has necessarily brought it: both answer
// as if R2 knew it, and afterwards it is gone everywhere. The registration
// is known persisted either because it waited for that (wait_persisted) or
// because the test saw its key in etcd before turning to R2.
func TestReadYourWritesAcrossReplicas(t *testing.T) {
	t.Parallel()
	t.Run("wait_persisted", func(t *testing.T) { t.Parallel(); testReadYourWrites(t, true) })
	t.Run("seen_in_etcd", func(t *testing.T) { t.Parallel(); testReadYourWrites(t, false) })
}

func testReadYourWrites(t *testing.T, waitPersisted bool) {
	const n = 200
	// A short interval only keeps the test quick: each registration
	// waits for its flush before R2 is asked, and with flushes spaced
	// leading-edge that flush starts the interval after the previous one.
	g := newLWRig(t, "ryw", 1, time.Millisecond)
	cli := g.etcd.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// seen waits for etcd's watch to report R1's write of e: the moment it
	// is persisted, and as early as R2's own watch could learn of it.
	key0, _ := registry.IDOf(withOrigin(&registryv1.ServiceEndpoint{Service: "ryw", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: "10.6.0.1"})).Key()
	var changes clientv3.WatchChan
	if !waitPersisted {
		changes = cli.Watch(ctx, strings.TrimSuffix(key0, "10.6.0.1"), clientv3.WithPrefix())
	}
	seen := func(e *registryv1.ServiceEndpoint) {
		t.Helper()
		key, _ := registry.IDOf(withOrigin(e)).Key()
		timeout := time.After(10 * time.Second)
		for {
			select {
			case resp := <-changes:
				for _, ev := range resp.Events {
					if ev.Type == clientv3.EventTypePut && string(ev.Kv.Key) == key {
						return
					}
				}
			case <-timeout:
				t.Fatalf("R1's registration of %s did not reach etcd within 10s", e.Ip)
			}
		}
	}
	notFound := map[string]int{}
	persisted := 0
	for i := 0; i < n; i++ {
		e := &registryv1.ServiceEndpoint{
			Service: "ryw", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: fmt.Sprintf("10.6.%d.%d", i/250, i%250+1),
			Ports: []*registryv1.Port{{Name: "http", Port: 8080}}, Weight: uint32(i%50 + 1), Metadata: map[string]string{"i": strconv.Itoa(i)},
		}
		reg, err := g.c[0].RegisterEndpoint(ctx, &registrarv1.RegisterEndpointRequest{Endpoint: e, WaitPersisted: waitPersisted})
		if err != nil {
			t.Fatalf("register %s via R1: %v", e.Ip, err)
		}
		if reg.Persisted {
			persisted++
		}
		if !waitPersisted {
			seen(e)
		}
		d, err := g.c[1].DrainEndpoint(ctx, &registrarv1.DrainEndpointRequest{Service: e.Service, Protocol: e.Protocol, Ip: e.Ip})
		switch {
		case status.Code(err) == codes.NotFound:
			notFound["drain"]++
		case err != nil:
			t.Fatalf("drain %s via R2: %v", e.Ip, err)
		default:
			want := withOrigin(e)
			want.State = registryv1.State_STATE_DRAINING
			if !registry.SameAttributes(d.Endpoint, want) {
				t.Errorf("drain %s via R2 answered %v, want R1's registration, draining", e.Ip, d.Endpoint)
			}
		}
		_, err = g.c[1].UnregisterEndpoint(ctx, &registrarv1.UnregisterEndpointRequest{Service: e.Service, Protocol: e.Protocol, Ip: e.Ip})
		switch {
		case status.Code(err) == codes.NotFound:
			notFound["deregister"]++
		case err != nil:
			t.Fatalf("deregister %s via R2: %v", e.Ip, err)
		}
	}
	if waitPersisted && persisted != n {
		t.Errorf("%d of %d registrations with wait_persisted answered persisted", persisted, n)
	}
	if notFound["drain"]+notFound["deregister"] > 0 {
		t.Errorf("R2 answered NOT_FOUND to %d of %d drains and %d of %d deregistrations of endpoints R1 had persisted",
			notFound["drain"], n, notFound["deregister"], n)
	}
	if t.Failed() {
		return
	}
	wait.For(t, "every endpoint gone from both replicas and etcd", 30*time.Second, func() bool {
		for via := range g.c {
			l, err := g.c[via].ListAllEndpoints(ctx, &registrarv1.ListAllEndpointsRequest{Services: []string{"ryw"}})
			if err != nil || len(l.Endpoints) != 0 {
				return false
			}
		}
		return countKeys(t, cli) == 0
	})
}

// TestLastWinsNodeRecordAcrossReplicas: a node announced through both
// replicas, alternately and at the same time, with different labels; then
// once more through each in turn. The record on both replicas and in etcd
// carries the labels of the last acknowledged announcement.
func TestLastWinsNodeRecordAcrossReplicas(t *testing.T) {
	t.Parallel()
	g := newLWRig(t, "lastwins", 1, lwInterval)
	cli := g.etcd.Client(t)
	var seq atomic.Int64
	announce := func(via int) string {
		label := strconv.FormatInt(seq.Add(1), 10)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := g.c[via].AnnounceNode(ctx, &registrarv1.AnnounceNodeRequest{Node: &registryv1.Node{
			Name: "n-lw", Zone: "z1", Address: "10.9.0.1", Labels: map[string]string{"w": label, "via": strconv.Itoa(via + 1)},
		}}); err != nil {
			t.Errorf("announce #%s via R%d: %v", label, via+1, err)
		}
		return label
	}
	labelOn := func(via int) string {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		l, err := g.c[via].ListNodes(ctx, &registrarv1.ListNodesRequest{})
		if err != nil {
			t.Fatalf("list nodes on R%d: %v", via+1, err)
		}
		for _, s := range l.Nodes {
			if s.GetNode().GetName() == "n-lw" {
				return s.GetNode().GetLabels()["w"]
			}
		}
		return "absent"
	}
	labelInEtcd := func() string {
		resp := nodeRecord(t, cli, "n-lw")
		if len(resp.Kvs) == 0 {
			return "absent"
		}
		n, err := registry.DecodeNode(string(resp.Kvs[0].Key), resp.Kvs[0].Value)
		if err != nil {
			t.Fatal(err)
		}
		return n.GetLabels()["w"]
	}
	rng := rand.New(rand.NewSource(time.Now().UnixNano()))
	for round := 1; round <= 3; round++ {
		for i := 0; i < 100; i++ {
			announce(i % 2)
		}
		var wg sync.WaitGroup
		for via := range g.c {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 100; i++ {
					announce(via)
				}
			}()
		}
		wg.Wait()
		first := rng.Intn(2)
		announce(first)
		time.Sleep(time.Duration(rng.Int63n(int64(lwInterval)))) // the gap of the scenario, not a wait
		want := announce(1 - first)
		var got [3]string
		wait.For(t, "both replicas and etcd to agree on the node record", 30*time.Second, func() bool {
			got = [3]string{labelOn(0), labelOn(1), labelInEtcd()}
			return got[0] == got[2] && got[1] == got[2]
		})
		if got[2] != want {
			t.Errorf("round %d: last acknowledged announcement was #%s, but R1, R2 and etcd hold #%s", round, want, got[2])
		}
	}
}
