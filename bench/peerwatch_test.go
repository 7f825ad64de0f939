package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aethermesh/aether/disruption"
	"github.com/aethermesh/aether/internal/testutil/dynalite"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/server"
)

// A short cross-replica run on DynamoDB with peer-watch: every
// registration reaches B's watcher, and is timed. (Timing is the
// scenario's; here only that the harness measures.)
func TestCrossReplicaDynamoDB(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "test") // the registrars' SDK chain; dynalite accepts any
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	d := dynalite.Start(t)
	res, err := CrossReplica(t.Context(), CrossReplicaConfig{Backend: server.BackendDynamoDB, PeerWatch: true, Changes: 50, Rate: 100, Endpoint: d.Endpoint})
	if err != nil {
		t.Fatal(err)
	}
	if res.Cross.N != 50 || res.SyncMode != registrar.SyncPoll || res.BatchInterval != "100ms" {
		t.Fatalf("result %+v: want 50 timed registrations, poll sync, the 100ms default batch", res)
	}
	t.Logf("DynamoDB, peer-watch: %s", res.Cross)
}

// The section renders the propagation rows (the goal judged per row) and
// the battery runs, in its own marked section.
func TestPeerWatchSection(t *testing.T) {
	r := Report{Date: "d1", Command: "aether bench --scenario peer-watch", PeerWatch: &PeerWatchResult{
		Propagation: []CrossReplicaResult{
			{Backend: "etcd", SyncMode: "watch", SyncInterval: "5s", BatchInterval: "10ms", RatePerSec: 99, Cross: Latencies{N: 10, P50: 20, P99: 40, Max: 41}},
			{Backend: "dynamodb", PeerWatch: true, SyncMode: "poll", SyncInterval: "5s", BatchInterval: "100ms", RatePerSec: 99, Cross: Latencies{N: 10, P50: 1, P99: 60, Max: 70}},
		},
		Battery: []disruption.Result{{Config: disruption.Config{Backend: disruption.BackendDynamoDB, SyncMode: registrar.SyncPoll, PeerWatch: true, SyncInterval: 5 * time.Second}, Resolutions: 777}},
	}}
	path := filepath.Join(t.TempDir(), "benchmarks.md")
	if err := r.UpdateFile(path); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	doc := string(b)
	for _, want := range []string{
		"### Peer-watch (last run d1)",
		"| etcd | watch (every 5s) | off | 10ms | 99/s | 10 | 20.00 ms | 40.00 ms | 41.00 ms | — |",
		"| dynamodb | poll (every 5s) | on | 100ms | 99/s | 10 | 1.00 ms | 60.00 ms | 70.00 ms | **missed** |",
		"| DynamoDB, poll sync + peer-watch | 5s | 777 | **0** |",
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("document lacks %q:\n%s", want, doc)
		}
	}
	if strings.Count(doc, peerBeginMark) != 1 || strings.Count(doc, peerEndMark) != 1 {
		t.Errorf("no single marked section:\n%s", doc)
	}
}
