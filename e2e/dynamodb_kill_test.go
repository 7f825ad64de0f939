package e2e

import (
	"context"
	"testing"

	dynamostore "github.com/aethermesh/aether/backend/dynamodb"
	"github.com/aethermesh/aether/internal/testutil/dynalite"
)

// startDynamo runs "aether registrar --backend dynamodb" on table at
// endpoint (startOnBackend).
func startDynamo(t *testing.T, endpoint, table string, grpcAddr, httpAddr string) *registrarProc {
	t.Helper()
	return startOnBackend(t, grpcAddr, httpAddr,
		"--backend", "dynamodb", "--dynamodb-table", table, "--dynamodb-endpoint", endpoint, "--dynamodb-region", "us-east-1")
}

// TestDynamoDBPeerWatchReplicaKilled9: replicaKilled9MidBurst on one
// DynamoDB table (dynalite).
func TestDynamoDBPeerWatchReplicaKilled9(t *testing.T) {
	srv := dynalite.Start(t)
	table := "aether-kill"
	mustAether(t, "dynamodb", "create-table", "--dynamodb-table", table, "--dynamodb-endpoint", srv.Endpoint, "--dynamodb-region", "us-east-1")
	ctx := context.Background()
	cli, err := dynamostore.NewClient(ctx, dynamostore.Config{Table: table, Region: "us-east-1", Endpoint: srv.Endpoint})
	if err != nil {
		t.Fatal(err)
	}
	st, err := dynamostore.Open(ctx, cli, table, dynamostore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	replicaKilled9MidBurst(t, killScenario{
		start: func(t *testing.T, grpcAddr, httpAddr string) *registrarProc {
			return startDynamo(t, srv.Endpoint, table, grpcAddr, httpAddr)
		},
		stored: func(t *testing.T) map[string]bool { return storedOf(t, st) },
	})
}
