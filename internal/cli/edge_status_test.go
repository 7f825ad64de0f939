package cli

import (
	"bytes"
	"context"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/aethermesh/aether/edge"
)

// TestEdgeStatus runs `aether edge status` against a real replica with a
// live peer and one that never starts.
func TestEdgeStatus(t *testing.T) {
	names := []string{"a", "b", "c"} // c never runs
	peer := map[string]url.URL{}
	ic := map[string][]url.URL{}
	for _, n := range names {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		peer[n] = url.URL{Scheme: "http", Host: l.Addr().String()}
		ic[n] = []url.URL{peer[n]}
		_ = l.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := map[string]*edge.Server{}
	for _, n := range names[:2] {
		s, err := edge.Start(ctx, edge.Config{
			Name: n, DataDir: t.TempDir(),
			ListenClientURLs: []url.URL{{Scheme: "http", Host: "127.0.0.1:0"}},
			ListenPeerURLs:   []url.URL{peer[n]}, AdvertisePeerURLs: []url.URL{peer[n]},
			InitialCluster: ic, SyncInterval: 100 * time.Millisecond,
		})
		if err != nil {
			t.Fatal(err)
		}
		srv[n] = s
		defer func() {
			if err := s.Close(context.Background()); err != nil {
				t.Error(err)
			}
		}()
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: srv["a"].ClientURLs(), Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	run := func() string {
		var out, errb bytes.Buffer
		root := newRoot(deps{stdout: &out, stderr: &errb, lookupEnv: func(string) (string, bool) { return "", false }})
		root.SetOut(&out)
		root.SetArgs([]string{"edge", "status", "--endpoint", srv["a"].ClientURLs()[0]})
		if err := root.ExecuteContext(ctx); err != nil {
			t.Fatalf("edge status: %v\n%s", err, errb.String())
		}
		return out.String()
	}
	var out string
	deadline := time.Now().Add(10 * time.Second)
	for {
		out = run()
		if strings.Contains(out, "yes") || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	var rowB, rowC string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && f[0] == "b" {
			rowB = line
		}
		if len(f) > 0 && f[0] == "c" {
			rowC = line
		}
	}
	if f := strings.Fields(rowB); len(f) != 6 || f[2] != "true" || f[4] != "0" || f[5] != "yes" {
		t.Fatalf("peer b's row %q in\n%s", rowB, out)
	}
	if f := strings.Fields(rowC); len(f) != 6 || f[2] != "false" || f[3] != "never" || f[4] != "1" || f[5] != "no" {
		t.Fatalf("peer c's row %q in\n%s", rowC, out)
	}

	// aether edge put --replicas: on 2 (a and b), not on 3 (c is down).
	edgePut := func(args ...string) (string, error) {
		var out, errb bytes.Buffer
		root := newRoot(deps{stdout: &out, stderr: &errb, lookupEnv: func(string) (string, bool) { return "", false }})
		root.SetOut(&out)
		root.SetErr(&errb)
		root.SetArgs(append([]string{"edge", "put", "--endpoint", srv["a"].ClientURLs()[0]}, args...))
		err := root.ExecuteContext(ctx)
		return out.String(), err
	}
	if out, err := edgePut("--replicas", "2", "x", "1"); err != nil || !strings.Contains(out, "on 2 replicas") {
		t.Fatalf("edge put --replicas 2: %q %v", out, err)
	}
	if _, err := edgePut("--replicas", "3", "--timeout", "300ms", "x", "2"); err == nil || !strings.Contains(err.Error(), "waiting for 3 replicas") {
		t.Fatalf("edge put --replicas 3 with c down: %v", err)
	}
	if r, err := cli.Get(ctx, "x"); err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "2" {
		t.Fatalf("the put that timed out waiting is still acknowledged: %v %v", r, err)
	}
}

// The sync flags reach the server's config.
func TestEdgeSyncFlags(t *testing.T) {
	res := mustEdge(t, nil, "--name", "a", "--data-dir", t.TempDir(),
		"--initial-cluster", "a=http://127.0.0.1:2380,b=http://127.0.0.2:2380,c=http://127.0.0.3:2380",
		"--initial-advertise-peer-urls", "http://127.0.0.1:2380", "--sync-peers", "b,c", "--sync-interval", "2s")
	s := res.settings
	if strings.Join(s.SyncPeers, ",") != "b,c" || s.SyncInterval != 2*time.Second {
		t.Fatalf("sync settings: %q %v", s.SyncPeers, s.SyncInterval)
	}
	if cfg := s.edgeConfig(); strings.Join(cfg.SyncPeers, ",") != "b,c" || cfg.SyncInterval != 2*time.Second {
		t.Fatalf("server config: %q %v", cfg.SyncPeers, cfg.SyncInterval)
	}
	if res := runEdgeCLI(t, nil, "--sync-interval", "-1s"); res.err == nil {
		t.Fatal("a negative --sync-interval was accepted")
	}
}
