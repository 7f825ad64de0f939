package cli

import (
	"strings"
	"testing"
	"time"

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

// TestBackendDefaults: --peer-watch is on by default, and
// --write-batch-interval left out follows the backend and peer-watch;
// given, either flag is taken as it is. Left on by default with TLS but
// no CA to verify peers by, peer-watch is turned off with a warning,
// where the explicit flag is refused.
func TestBackendDefaults(t *testing.T) {
	t.Parallel()
	dyn := []string{"--backend", "dynamodb", "--dynamodb-table", "t", "--dynamodb-region", "us-east-1"}
	tls := []string{"--tls-cert", "c.pem", "--tls-key", "k.pem", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}
	for _, c := range []struct {
		name      string
		args      []string
		peerWatch bool
		batch     time.Duration
		warn      string
	}{
		{"etcd", nil, true, 100 * time.Millisecond, ""},
		{"etcd without peer-watch", []string{"--peer-watch=false"}, false, 10 * time.Millisecond, ""},
		{"etcd, batch given", []string{"--peer-watch=false", "--write-batch-interval", "50ms"}, false, 50 * time.Millisecond, ""},
		{"dynamodb", dyn, true, 100 * time.Millisecond, ""},
		{"dynamodb without peer-watch", append([]string{"--peer-watch=false"}, dyn...), false, 100 * time.Millisecond, ""},
		{"tls without a peer CA", tls, false, 10 * time.Millisecond, "peer-watch is off: with --tls-cert it needs a CA"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			res := runCLI(t, nil, nil, append([]string{"registrar"}, c.args...)...)
			if res.err != nil || res.served == nil {
				t.Fatalf("registrar %v: %v", c.args, res.err)
			}
			if got := res.served; got.PeerWatch != c.peerWatch || got.WriteBatchInterval != c.batch {
				t.Errorf("registrar %v: peer-watch %v, --write-batch-interval %v; want %v, %v", c.args, got.PeerWatch, got.WriteBatchInterval, c.peerWatch, c.batch)
			}
			if c.warn != "" && !strings.Contains(res.stderr, c.warn) {
				t.Errorf("registrar %v: stderr %q, want a warning %q", c.args, res.stderr, c.warn)
			}
		})
	}
	res := runCLI(t, nil, nil, append([]string{"registrar", "--peer-watch"}, tls...)...)
	if res.err == nil || !strings.Contains(res.err.Error(), "--peer-watch with --tls-cert needs a CA") {
		t.Fatalf("explicit --peer-watch with TLS and no CA: %v, want it refused", res.err)
	}
}
