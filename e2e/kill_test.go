package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"testing"
	"time"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/internal/testutil/logbuf"
	"github.com/aethermesh/aether/internal/testutil/wait"
)

// startOnBackend runs "aether registrar" with the CLI's defaults (peer-watch
// on) on the store backendArgs name, on the given addresses, as a replica
// of us-east/east-1, and waits for /readyz.
func startOnBackend(t *testing.T, grpcAddr, httpAddr string, backendArgs ...string) *registrarProc {
	t.Helper()
	p := &registrarProc{grpcAddr: grpcAddr, httpAddr: httpAddr, logs: &logbuf.Buffer{}, exited: make(chan error, 1)}
	args := append([]string{"registrar"}, backendArgs...)
	args = append(args, "--grpc-addr", p.grpcAddr, "--http-addr", p.httpAddr,
		"--cluster-name", "east-1", "--region", "us-east", "--zone", "us-east-1a")
	p.cmd = exec.Command(aetherBin, args...)
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	return p.launch(t)
}

// killScenario is a store two registrar processes of one cluster share,
// as a kill test drives it.
type killScenario struct {
	// start runs a registrar process on the store, on the given addresses.
	start func(t *testing.T, grpcAddr, httpAddr string) *registrarProc
	// stored is what the store holds ("service ip" keys), read by the
	// backend's own consistent listing, not through a registrar.
	stored func(t *testing.T) map[string]bool
}

// replicaKilled9MidBurst kills one of two registrar processes with
// SIGKILL in the middle of a burst of writes (some acknowledged and
// streamed to the other replica over peer-watch but never persisted), then
// restarts it on the same addresses. Whatever was acknowledged with
// wait_persisted survives on both; a write the dead replica never
// persisted is not kept by the survivor on its peer's word alone (the
// store is the source of truth); and once the killed replica is back, both
// list exactly what the store holds.
func replicaKilled9MidBurst(t *testing.T, sc killScenario) {
	aAddr, aHTTP := freeAddr(t), freeAddr(t)
	a := sc.start(t, aAddr, aHTTP)
	b := sc.start(t, freeAddr(t), freeAddr(t))
	ca, cb := grpcClient(t, a.grpcAddr), grpcClient(t, b.grpcAddr)

	register := func(c registrarv1.RegistrarClient, i int, persisted bool) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := c.RegisterEndpoint(ctx, &registrarv1.RegisterEndpointRequest{WaitPersisted: persisted, Endpoint: &registryv1.ServiceEndpoint{
			Service: "web", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: fmt.Sprintf("10.9.%d.%d", i/250, i%250+1),
			Ports: []*registryv1.Port{{Name: "http", Port: 8080}}, Zone: "us-east-1a",
		}})
		return err
	}
	// Durable writes first: both replicas must hold them throughout.
	const durable = 20
	for i := range durable {
		if err := register(ca, i, true); err != nil {
			t.Fatalf("durable register %d: %v", i, err)
		}
	}
	wait.For(t, "B listing A's persisted writes", 30*time.Second, func() bool { return len(listed(t, cb)) == durable })

	// A burst A acknowledges without waiting, killed while it runs: B
	// hears them over peer-watch within milliseconds, the store holds
	// only what A's write-behind flushed before the kill.
	acked := 0
	for i := durable; i < durable+200; i++ {
		if err := register(ca, i, false); err != nil {
			t.Fatalf("burst register %d: %v", i, err)
		}
		acked++
		if i == durable+150 {
			a.kill9(t)
			break
		}
	}
	t.Logf("A acknowledged %d writes of the burst before SIGKILL", acked)

	// B converges on the store: every durable write stays, and of the
	// burst it keeps exactly what the store holds, once its grace for
	// unconfirmed peer writes has passed and it has read the store.
	var stored1 map[string]bool
	wait.ForState(t, "B listing exactly what the store holds after A's SIGKILL", 60*time.Second, func() (bool, string) {
		stored1 = sc.stored(t)
		gotB := listed(t, cb)
		if len(gotB) != len(stored1) {
			return false, fmt.Sprintf("B lists %d, the store holds %d", len(gotB), len(stored1))
		}
		for k := range stored1 {
			if gotB[k] == nil {
				return false, "B lacks " + k
			}
		}
		return true, ""
	})
	for i := range durable {
		if !stored1[fmt.Sprintf("web 10.9.%d.%d", i/250, i%250+1)] {
			t.Fatalf("a write acknowledged with wait_persisted is gone from the store after SIGKILL: %d", i)
		}
	}
	t.Logf("the store holds %d of the %d burst writes A acknowledged before the kill", len(stored1)-durable, acked)

	// A comes back on the same addresses; both list the same, and it is
	// what the store holds.
	a = sc.start(t, aAddr, aHTTP)
	ca = grpcClient(t, a.grpcAddr)
	if err := register(ca, 1000, true); err != nil {
		t.Fatalf("register after the restart: %v", err)
	}
	wait.ForState(t, "A and B listing the same after A's restart", 60*time.Second, func() (bool, string) {
		la, lb := listed(t, ca), listed(t, cb)
		if len(la) != len(lb) || len(la) != len(stored1)+1 {
			return false, fmt.Sprintf("A %d, B %d, want %d", len(la), len(lb), len(stored1)+1)
		}
		for k := range la {
			if lb[k] == nil {
				return false, "B lacks " + k
			}
		}
		return true, ""
	})
	final := sc.stored(t)
	for k := range listed(t, ca) {
		if !final[k] {
			t.Fatalf("A lists %s, which the store does not hold", k)
		}
	}
	if len(final) != len(stored1)+1 {
		t.Fatalf("the store holds %d after the restart, want %d", len(final), len(stored1)+1)
	}
}

// storedOf is what a store holds, as "service ip" keys.
func storedOf(t *testing.T, st interface {
	List(context.Context) (backend.Listing, error)
}) map[string]bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := st.List(ctx)
	if err != nil {
		t.Fatalf("list the store: %v", err)
	}
	out := map[string]bool{}
	for _, e := range l.Endpoints {
		out[e.Service+" "+e.Ip] = true
	}
	return out
}
