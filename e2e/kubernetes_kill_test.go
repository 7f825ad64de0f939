package e2e

import (
	"context"
	"testing"
	"time"

	kubestore "github.com/aethermesh/aether/backend/kubernetes"
	"github.com/aethermesh/aether/internal/testutil/kubeapi"
)

// startKube runs "aether registrar --backend kubernetes" on the API server
// of kubeconfig, in namespace default, installing the CRDs
// (startOnBackend).
func startKube(t *testing.T, kubeconfig, grpcAddr, httpAddr string) *registrarProc {
	t.Helper()
	return startOnBackend(t, grpcAddr, httpAddr,
		"--backend", "kubernetes", "--kubeconfig", kubeconfig, "--kubernetes-namespace", "default", "--kubernetes-install-crds")
}

// TestKubernetesPeerWatchReplicaKilled9: replicaKilled9MidBurst on one
// real kube-apiserver (the kubernetes backend's custom resources).
func TestKubernetesPeerWatchReplicaKilled9(t *testing.T) {
	api := kubeapi.Start(t)
	// The registrars install the CRDs; the store that reads the truth
	// opens once they are there.
	start := func(t *testing.T, grpcAddr, httpAddr string) *registrarProc {
		return startKube(t, api.Kubeconfig, grpcAddr, httpAddr)
	}
	var st *kubestore.Store
	replicaKilled9MidBurst(t, killScenario{
		start: start,
		stored: func(t *testing.T) map[string]bool {
			if st == nil {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				// A reader only (no GC of its own): the registrars collect tombstones.
				cfg := kubestore.Config{RESTConfig: api.Config(), Namespace: "default", Region: "us-east", Cluster: "east-1", GCInterval: -1}
				s, err := kubestore.New(ctx, cfg)
				if err != nil {
					t.Fatalf("open the kubernetes store: %v", err)
				}
				t.Cleanup(func() { _ = s.Close() })
				st = s
			}
			return storedOf(t, st)
		},
	})
}
