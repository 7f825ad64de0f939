package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"testing"
	"time"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	dynamostore "github.com/aethermesh/aether/backend/dynamodb"
	"github.com/aethermesh/aether/internal/testutil/dynalite"
	"github.com/aethermesh/aether/internal/testutil/logbuf"
	"github.com/aethermesh/aether/internal/testutil/wait"
)

// startDynamo runs "aether registrar --backend dynamodb" on table at
// endpoint with the CLI's defaults (peer-watch on), replica name in the
// logs only.
func startDynamo(t *testing.T, endpoint, table string, grpcAddr, httpAddr string) *registrarProc {
	t.Helper()
	p := &registrarProc{grpcAddr: grpcAddr, httpAddr: httpAddr, logs: &logbuf.Buffer{}, exited: make(chan error, 1)}
	p.cmd = exec.Command(aetherBin, "registrar",
		"--backend", "dynamodb", "--dynamodb-table", table, "--dynamodb-endpoint", endpoint, "--dynamodb-region", "us-east-1",
		"--grpc-addr", p.grpcAddr, "--http-addr", p.httpAddr,
		"--cluster-name", "east-1", "--region", "us-east", "--zone", "us-east-1a")
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	return p.launch(t)
}

// TestDynamoDBPeerWatchReplicaKilled9 kills one of two registrar processes
// on one DynamoDB table with SIGKILL in the middle of a burst of writes
// (some acknowledged and streamed to the other replica over peer-watch but
// never persisted), then restarts it on the same addresses. Whatever was
// acknowledged with wait_persisted survives on both; a write the dead
// replica never persisted is not kept by the survivor on its peer's word
// alone (the table is the source of truth); and once the killed replica is
// back, both list exactly what the table holds.
func TestDynamoDBPeerWatchReplicaKilled9(t *testing.T) {
	srv := dynalite.Start(t)
	table := "aether-kill"
	mustAether(t, "dynamodb", "create-table", "--dynamodb-table", table, "--dynamodb-endpoint", srv.Endpoint, "--dynamodb-region", "us-east-1")
	aAddr, aHTTP := freeAddr(t), freeAddr(t)
	a := startDynamo(t, srv.Endpoint, table, aAddr, aHTTP)
	b := startDynamo(t, srv.Endpoint, table, freeAddr(t), freeAddr(t))
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
	// hears them over peer-watch within milliseconds, the table holds
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

	// B converges on the table: every durable write stays, and of the
	// burst it keeps exactly what the table holds, once its grace for
	// unconfirmed peer writes has passed and its poll has read the table.
	ctx := context.Background()
	cli, err := dynamostore.NewClient(ctx, dynamostore.Config{Table: table, Region: "us-east-1", Endpoint: srv.Endpoint})
	if err != nil {
		t.Fatal(err)
	}
	st, err := dynamostore.Open(ctx, cli, table, dynamostore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// What the table holds, read by the backend's own consistent listing.
	inTable := func() map[string]bool {
		l, err := st.List(ctx)
		if err != nil {
			t.Fatalf("list the table: %v", err)
		}
		out := map[string]bool{}
		for _, e := range l.Endpoints {
			out[e.Service+" "+e.Ip] = true
		}
		return out
	}
	var table1 map[string]bool
	wait.ForState(t, "B listing exactly what the table holds after A's SIGKILL", 60*time.Second, func() (bool, string) {
		table1 = inTable()
		gotB := listed(t, cb)
		if len(gotB) != len(table1) {
			return false, fmt.Sprintf("B lists %d, the table holds %d", len(gotB), len(table1))
		}
		for k := range table1 {
			if gotB[k] == nil {
				return false, "B lacks " + k
			}
		}
		return true, ""
	})
	for i := range durable {
		if !table1[fmt.Sprintf("web 10.9.%d.%d", i/250, i%250+1)] {
			t.Fatalf("a write acknowledged with wait_persisted is gone from the table after SIGKILL: %d", i)
		}
	}
	t.Logf("the table holds %d of the %d burst writes A acknowledged before the kill", len(table1)-durable, acked)

	// A comes back on the same addresses; both list the same.
	a = startDynamo(t, srv.Endpoint, table, aAddr, aHTTP)
	ca = grpcClient(t, a.grpcAddr)
	if err := register(ca, 1000, true); err != nil {
		t.Fatalf("register after the restart: %v", err)
	}
	wait.ForState(t, "A and B listing the same after A's restart", 60*time.Second, func() (bool, string) {
		la, lb := listed(t, ca), listed(t, cb)
		if len(la) != len(lb) || len(la) != len(table1)+1 {
			return false, fmt.Sprintf("A %d, B %d, want %d", len(la), len(lb), len(table1)+1)
		}
		for k := range la {
			if lb[k] == nil {
				return false, "B lacks " + k
			}
		}
		return true, ""
	})
}
