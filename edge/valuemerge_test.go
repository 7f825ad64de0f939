package edge

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/aethermesh/aether/internal/testutil/logbuf"
)

// Two replicas configured differently do not exchange changes: each
// refuses the other's stream, saying why; started alike (the misconfigured
// one on a fresh data directory) they converge.
func TestValueMergeMismatchRefusedAtHandshake(t *testing.T) {
	names := []string{"a", "b"}
	c := newTestCluster(t, names, nil)
	logs := map[string]*logbuf.Buffer{"a": {}, "b": {}}
	mode := map[string]string{"a": "json", "b": "bytes"}
	c.mod = func(name string, cfg *Config) {
		cfg.ValueMerge = mode[name]
		cfg.Logger = slog.New(slog.NewTextHandler(logs[name], &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	c.start("a")
	c.start("b")
	ctx := testCtx(t)
	if _, err := newClientQuiet(t, c.srv["a"]).Put(ctx, "/cfg", `{"x":1}`); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		eventually(t, 10*time.Second, n+" to refuse its peer", func() bool {
			return strings.Contains(logs[n].String(), "every replica must be started with the same --value-merge and --value-merge-prefix")
		})
	}
	if r, err := newClientQuiet(t, c.srv["b"]).Get(ctx, "/cfg"); err != nil || len(r.Kvs) != 0 {
		t.Fatalf("b got a's change across a refused handshake: %v %v", r, err)
	}
	c.stop("b")
	// b's data dir remembers how it was written.
	cfg := Config{Name: "b", DataDir: c.dirs["b"], ValueMerge: "json"}
	cfg.ListenClientURLs = c.srv["a"].cfg.ListenClientURLs
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cfg.InitialCluster = c.srv["a"].cfg.InitialCluster
	if s, err := Start(sctx, cfg); err == nil {
		closeServer(t, s)
		t.Fatal("a data dir written with value merge bytes restarted with json")
	} else if !strings.Contains(err.Error(), "was written with value merge bytes, this replica is configured with json") {
		t.Fatalf("restart with another value merge: %v", err)
	}
	c.dirs["b"] = t.TempDir()
	mode["b"] = "json"
	c.start("b")
	waitConverged(t, c.running())
	r, err := newClientQuiet(t, c.srv["b"]).Get(ctx, "/cfg")
	if err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != `{"x":1}` {
		t.Fatalf("b after restarting alike: %v %v", r, err)
	}
}
