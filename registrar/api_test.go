package registrar_test

import (
	"context"
	"errors"
	"testing"
	"time"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend/memory"
	"github.com/aethermesh/aether/internal/testutil/regtest"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/registry"
)

// inProcess is a started registrar over the in-memory model store, for
// tests of the in-process API; it closes with t.
func inProcess(t *testing.T, mut ...func(*registrar.Options)) *registrar.Registrar {
	t.Helper()
	o := registrar.Options{ClusterName: "c1", Region: "r1", Logger: regtest.QuietLogger()}
	for _, m := range mut {
		m(&o)
	}
	r, err := registrar.New(o, memory.New(memory.Options{}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := r.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return r
}

func apiEndpoint(svc, ip string) *registryv1.ServiceEndpoint {
	return &registryv1.ServiceEndpoint{Service: svc, Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: ip,
		Ports: []*registryv1.Port{{Name: "http", Port: 80}}}
}

// next is the subscription's next batch, within a bound that only a lost
// event would reach.
func next(t *testing.T, sub *registrar.Subscription) []*registrarv1.EndpointEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b, err := sub.Next(ctx)
	if err != nil {
		t.Fatalf("next batch: %v", err)
	}
	return b
}

// The in-process API, as an xDS feed or a status page would use it: no
// gRPC between the subscriber and the replica.
func TestSubscribeInProcess(t *testing.T) {
	r := inProcess(t)
	if _, _, err := r.Register(apiEndpoint("web", "10.0.0.1")); err != nil {
		t.Fatal(err)
	}

	sub, err := r.Subscribe([]string{"web"}, "")
	if err != nil {
		t.Fatal(err)
	}
	start := sub.TakeStart()
	if start.Resumed || len(start.Snapshot) != 1 || start.Snapshot[0].GetIp() != "10.0.0.1" {
		t.Fatalf("start %+v, want a snapshot of the one web endpoint", start)
	}

	// A registration of a watched service is delivered; one of another
	// service is not (the subscription is demand-scoped).
	if _, _, err := r.Register(apiEndpoint("db", "10.0.1.1")); err != nil {
		t.Fatal(err)
	}
	_, v, err := r.Register(apiEndpoint("web", "10.0.0.2"))
	if err != nil {
		t.Fatal(err)
	}
	b := next(t, sub)
	if len(b) != 1 || b[0].GetType() != registrarv1.EndpointEvent_ENDPOINT_ADDED || b[0].GetEndpoint().GetIp() != "10.0.0.2" || b[0].GetVersion() != v {
		t.Fatalf("batch %v, want web's 10.0.0.2 added at %s", b, v)
	}

	// Adding a service delivers its snapshot in order with the events.
	if err := sub.Update([]string{"db"}, nil); err != nil {
		t.Fatal(err)
	}
	b = next(t, sub)
	if len(b) != 1 || b[0].GetType() != registrarv1.EndpointEvent_SERVICES_SNAPSHOT ||
		len(b[0].GetServices()) != 1 || b[0].GetServices()[0] != "db" || len(b[0].GetEndpoints()) != 1 {
		t.Fatalf("batch %v, want a SERVICES_SNAPSHOT of db's one endpoint", b)
	}
	if _, _, err := r.Drain(registry.EndpointID{Service: "db", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, IP: "10.0.1.1"}); err != nil {
		t.Fatal(err)
	}
	if b = next(t, sub); len(b) != 1 || b[0].GetEndpoint().GetService() != "db" || b[0].GetEndpoint().GetState() != registryv1.State_STATE_DRAINING {
		t.Fatalf("batch %v, want db's endpoint draining", b)
	}
	// Removing it stops its events.
	if err := sub.Update(nil, []string{"db"}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Unregister(registry.EndpointID{Service: "db", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, IP: "10.0.1.1"}); err != nil {
		t.Fatal(err)
	}
	v2, err := r.Unregister(registry.EndpointID{Service: "web", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, IP: "10.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	if b = next(t, sub); len(b) != 1 || b[0].GetType() != registrarv1.EndpointEvent_ENDPOINT_REMOVED || b[0].GetEndpoint().GetService() != "web" {
		t.Fatalf("batch %v, want web's 10.0.0.1 removed (db is no longer watched)", b)
	}

	// Refusals name what is wrong, and change nothing.
	var fe *registry.FieldError
	if err := sub.Update([]string{"not a name"}, nil); !errors.As(err, &fe) || fe.Field != "add" {
		t.Errorf("update with an invalid name: %v, want a FieldError of add", err)
	}
	all, err := r.Subscribe(nil, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := all.Update([]string{"db"}, nil); !errors.Is(err, registrar.ErrWatchesAll) {
		t.Errorf("update of an all-services subscription: %v, want ErrWatchesAll", err)
	}
	all.Close()
	if _, err := r.Subscribe(nil, "no-colon"); !errors.Is(err, registrar.ErrBadVersion) {
		t.Errorf("subscribe from a malformed version: %v, want ErrBadVersion", err)
	}

	// Close: Next reports it, and the replica no longer delivers.
	sub.Close()
	if _, err := sub.Next(context.Background()); !errors.Is(err, registrar.ErrClosed) {
		t.Fatalf("Next after Close: %v, want ErrClosed", err)
	}

	// Resume from a version: exactly the events missed since, and no
	// snapshot; here the registration after v2 and nothing before it.
	if _, _, err := r.Register(apiEndpoint("web", "10.0.0.3")); err != nil {
		t.Fatal(err)
	}
	res, err := r.Subscribe([]string{"web"}, v2)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Close()
	start = res.TakeStart()
	if !start.Resumed || start.Snapshot != nil || len(start.Missed) != 1 || start.Missed[0].GetEndpoint().GetIp() != "10.0.0.3" {
		t.Fatalf("resumed start %+v, want just the registration of 10.0.0.3", start)
	}
	// A version of another incarnation is not resumable: a snapshot.
	other, err := r.Subscribe([]string{"web"}, "0123456789ab:1")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if start = other.TakeStart(); start.Resumed || len(start.Snapshot) != 2 {
		t.Fatalf("start from a foreign version %+v, want a snapshot of web's two endpoints", start)
	}
}

// A consumer that stops reading is cut, with the reason, instead of
// holding the replica back; and shutdown cuts every subscription.
func TestSubscriptionCuts(t *testing.T) {
	r := inProcess(t, func(o *registrar.Options) { o.WatchBuffer = 2 })
	slow, err := r.Subscribe([]string{"web"}, "")
	if err != nil {
		t.Fatal(err)
	}
	idle, err := r.Subscribe([]string{"db"}, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, ip := range []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"} {
		if _, _, err := r.Register(apiEndpoint("web", ip)); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-slow.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a subscription with three batches waiting on a buffer of two was not cut")
	}
	if !errors.Is(slow.Err(), registrar.ErrSlowConsumer) {
		t.Fatalf("cut for %v, want ErrSlowConsumer", slow.Err())
	}
	if _, err := slow.Next(context.Background()); !errors.Is(err, registrar.ErrSlowConsumer) {
		t.Fatalf("Next of a cut subscription: %v, want ErrSlowConsumer (what was buffered is not delivered)", err)
	}
	if idle.Err() != nil {
		t.Fatalf("a subscription of another service was cut too: %v", idle.Err())
	}

	r.EndStreams()
	select {
	case <-idle.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("shutdown did not cut the subscription")
	}
	if !errors.Is(idle.Err(), registrar.ErrShuttingDown) {
		t.Fatalf("cut for %v, want ErrShuttingDown", idle.Err())
	}
	if _, err := r.Subscribe(nil, ""); !errors.Is(err, registrar.ErrShuttingDown) {
		t.Fatalf("subscribe during shutdown: %v, want ErrShuttingDown", err)
	}
}

// Before its snapshot is loaded a registrar has nothing true to tell a
// subscriber.
func TestSubscribeBeforeStart(t *testing.T) {
	r, err := registrar.New(registrar.Options{ClusterName: "c1", Region: "r1", Logger: regtest.QuietLogger()}, memory.New(memory.Options{}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Subscribe(nil, ""); !errors.Is(err, registrar.ErrNotReady) {
		t.Fatalf("subscribe before Start: %v, want ErrNotReady", err)
	}
	if id := r.Identity(); id != (registrar.Identity{Region: "r1", Cluster: "c1"}) {
		t.Fatalf("identity %+v", id)
	}
}

// TestVersionCountsEvents: Version is List's version without the copy,
// and its sequence grows by one per endpoint event (what the status page
// counts events per second by); Nodes holds the announced records.
func TestVersionCountsEvents(t *testing.T) {
	r := inProcess(t)
	_, listed, err := r.List(nil)
	if err != nil {
		t.Fatal(err)
	}
	v0 := r.Version()
	if v0.String() != listed {
		t.Fatalf("Version %s, List's version %s", v0, listed)
	}
	ep := apiEndpoint("web", "10.0.0.1")
	if _, _, err := r.Register(ep); err != nil {
		t.Fatal(err)
	}
	ep.Cluster, ep.Region = "c1", "r1"
	if _, _, err := r.Drain(registry.IDOf(ep)); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Unregister(registry.IDOf(ep)); err != nil {
		t.Fatal(err)
	}
	if v := r.Version(); v.Epoch != v0.Epoch || v.Seq != v0.Seq+3 {
		t.Fatalf("after three events: %s, want %s:%d", v, v0.Epoch, v0.Seq+3)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := r.AnnounceNode(ctx, &registryv1.Node{Name: "node-a", Zone: "z1", Address: "10.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	if n := r.Nodes(); len(n) != 1 || n[0].GetName() != "node-a" || n[0].GetZone() != "z1" {
		t.Fatalf("Nodes: %v", n)
	}
	if v := r.Version(); v.Seq != v0.Seq+3 {
		t.Fatalf("a node announcement is not an endpoint event, yet the sequence moved to %d", v.Seq)
	}
}
