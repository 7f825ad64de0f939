package cli

import (
	"strings"
	"testing"

	"github.com/aethermesh/aether/internal/testutil/dynalite"
	"github.com/aethermesh/aether/server"
)

// TestDynamoDBCreateTable: create-table makes the table on a real
// DynamoDB-compatible server (dynalite), a second run keeps it, and the
// registrar's flags select it.
func TestDynamoDBCreateTable(t *testing.T) {
	d := dynalite.Start(t)
	// The SDK's chain reads the process environment.
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	args := []string{"dynamodb", "create-table", "--dynamodb-table", "aether", "--dynamodb-region", "us-east-1", "--dynamodb-endpoint", d.Endpoint}
	for run := 1; run <= 2; run++ {
		res := runCLI(t, nil, nil, args...)
		if res.err != nil || !strings.Contains(res.stdout, "table aether ready") {
			t.Fatalf("create-table run %d: %v, stdout %q", run, res.err, res.stdout)
		}
	}
	if res := runCLI(t, nil, nil, "dynamodb", "create-table", "--dynamodb-endpoint", d.Endpoint); res.err == nil || !strings.Contains(res.err.Error(), "--dynamodb-table") {
		t.Fatalf("create-table without a table: %v", res.err)
	}

	res := runCLI(t, nil, nil, "registrar", "--cluster-name", "c1", "--region", "r1",
		"--backend", "dynamodb", "--dynamodb-table", "aether", "--dynamodb-region", "us-east-1", "--dynamodb-endpoint", d.Endpoint)
	if res.err != nil || res.served == nil {
		t.Fatalf("registrar --backend dynamodb: %v", res.err)
	}
	if c := res.served; c.Backend != server.BackendDynamoDB || c.DynamoDBTable != "aether" || c.DynamoDBRegion != "us-east-1" || c.DynamoDBEndpoint != d.Endpoint {
		t.Fatalf("served config %+v", c)
	}
	res = runCLI(t, nil, map[string]string{"AETHER_BACKEND": "dynamodb"}, "registrar", "--cluster-name", "c1", "--region", "r1")
	if res.err == nil || !strings.Contains(res.err.Error(), "--dynamodb-table") || res.served != nil {
		t.Fatalf("registrar --backend dynamodb without a table: %v", res.err)
	}
}
