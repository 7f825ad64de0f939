package difftest

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/aethermesh/aether/edge"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
)

// startEdge runs one aether edge replica in-process (edge.Start), on a
// loopback port with its data in a temp dir, closed when the test ends.
func startEdge(t *testing.T) *edge.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	s, err := edge.Start(ctx, edge.Config{
		Name:              "difftest",
		DataDir:           t.TempDir(),
		ListenClientURLs:  []url.URL{{Scheme: "http", Host: "127.0.0.1:0"}},
		AdvertisePeerURLs: []url.URL{{Scheme: "http", Host: "127.0.0.1:2380"}},
	})
	if err != nil {
		t.Fatalf("edge.Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Close(ctx); err != nil {
			t.Errorf("edge Close: %v", err)
		}
	})
	return s
}

// TestEdgeVsEtcd is the differential test of issue 15: aether edge (B)
// against a real single-member etcd (A), the same seeded sequence to both.
func TestEdgeVsEtcd(t *testing.T) {
	a := connect(t, etcdtest.Start(t).Endpoints()...)
	b := connect(t, startEdge(t).ClientURLs()...)
	stats, err := runDiff(t, a, b, seed(t), *flagOps)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("requests by kind: %v", stats)
}
