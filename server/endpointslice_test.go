package server_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/server"
)

// TestEndpointSlicesBadKubeconfig: a kubeconfig that cannot be loaded
// fails the start at once, naming the flag.
func TestEndpointSlicesBadKubeconfig(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(bad, []byte("not: [a kubeconfig"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{bad, filepath.Join(t.TempDir(), "missing")} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		s, err := server.Launch(ctx, server.Config{
			GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", DataDir: t.TempDir(),
			Options:        registrar.Options{ClusterName: "c1", Region: "r1", Logger: quietLogger()},
			EndpointSlices: server.EndpointSlicesConfig{Enabled: true, Namespace: "mesh", Kubeconfig: path},
		})
		cancel()
		if err == nil {
			_ = s.Close(context.Background())
			t.Fatalf("%s: launched", path)
		}
		if !strings.Contains(err.Error(), "--endpointslices") {
			t.Fatalf("%s: %v, want the flag named", path, err)
		}
	}
}
