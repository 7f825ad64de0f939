package cli

import (
	"strings"
	"testing"
	"time"
)

// The GC flags reach the server's config; a retention a healthy peer
// could outlive between acks, or one without GC, is refused by name.
func TestEdgeGCFlags(t *testing.T) {
	base := []string{"--name", "a", "--data-dir", t.TempDir(),
		"--initial-cluster", "a=http://127.0.0.1:2380,b=http://127.0.0.2:2380",
		"--initial-advertise-peer-urls", "http://127.0.0.1:2380"}
	res := mustEdge(t, nil, append(base, "--history-gc", "--peer-retention", "10m")...)
	if cfg := res.settings.edgeConfig(); cfg.DisableHistoryGC || cfg.PeerRetention != 10*time.Minute {
		t.Fatalf("server config: history GC off %v, retention %v", cfg.DisableHistoryGC, cfg.PeerRetention)
	}
	// GC is on by default, and can be turned off.
	if cfg := mustEdge(t, nil, base...).settings.edgeConfig(); cfg.DisableHistoryGC || cfg.PeerRetention != 0 {
		t.Fatalf("defaults: history GC off %v, retention %v", cfg.DisableHistoryGC, cfg.PeerRetention)
	}
	if cfg := mustEdge(t, nil, append(base, "--history-gc=false")...).settings.edgeConfig(); !cfg.DisableHistoryGC {
		t.Fatal("--history-gc=false: history GC still on")
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--history-gc", "--peer-retention", "-1s"}, "--peer-retention must not be negative"},
		{[]string{"--history-gc", "--peer-retention", "20s"}, "--peer-retention 20s is under 10 sync intervals"},
		{[]string{"--history-gc=false", "--peer-retention", "10m"}, "--peer-retention needs --history-gc"},
	} {
		res := runEdgeCLI(t, nil, append(base, tc.args...)...)
		if res.err == nil || !strings.Contains(res.err.Error(), tc.want) {
			t.Errorf("%v: err %v, want %q", tc.args, res.err, tc.want)
		}
	}
}

// The checkpoint flags reach the server's config (0 there is the default,
// so the flags' 0, "off", becomes negative); values that would checkpoint
// absurdly often, or negative ones, are refused by name.
func TestEdgeCheckpointFlags(t *testing.T) {
	base := []string{"--name", "a", "--data-dir", t.TempDir()}
	if cfg := mustEdge(t, nil, base...).settings.edgeConfig(); cfg.CheckpointChanges != 10000 || cfg.CheckpointBytes != 64<<20 {
		t.Fatalf("defaults: checkpoint every %d changes, %d bytes", cfg.CheckpointChanges, cfg.CheckpointBytes)
	}
	cfg := mustEdge(t, nil, append(base, "--checkpoint-changes", "5000", "--checkpoint-bytes", "0")...).settings.edgeConfig()
	if cfg.CheckpointChanges != 5000 || cfg.CheckpointBytes >= 0 {
		t.Fatalf("--checkpoint-changes 5000 --checkpoint-bytes 0: %d changes, %d bytes", cfg.CheckpointChanges, cfg.CheckpointBytes)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--checkpoint-changes", "-1"}, "--checkpoint-changes must not be negative"},
		{[]string{"--checkpoint-bytes", "-5"}, "--checkpoint-bytes must not be negative"},
		{[]string{"--checkpoint-changes", "10"}, "--checkpoint-changes 10 is under 100"},
		{[]string{"--checkpoint-bytes", "4096"}, "--checkpoint-bytes 4096 is under 1048576 (1 MiB)"},
	} {
		res := runEdgeCLI(t, nil, append(base, tc.args...)...)
		if res.err == nil || !strings.Contains(res.err.Error(), tc.want) {
			t.Errorf("%v: err %v, want %q", tc.args, res.err, tc.want)
		}
	}
}
