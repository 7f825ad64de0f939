package server_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/aethermesh/aether/internal/testutil/kubeapi"
	"github.com/aethermesh/aether/internal/testutil/regtest"
	"github.com/aethermesh/aether/kube/endpointslice"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/server"
)

// TestEndpointSlicesWiring: a registrar started with EndpointSlices on
// (a kubeconfig file of a real kube-apiserver, as --endpointslices-kubeconfig
// gives it) publishes its endpoints as slices, counts the writes on its
// /metrics, and stops the reconciler on close.
func TestEndpointSlicesWiring(t *testing.T) {
	api := kubeapi.Start(t)
	cs, err := kubernetes.NewForConfig(api.Config())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "mesh"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	s := regtest.Start(t, server.Config{
		DataDir:              t.TempDir(),
		EmbeddedEtcdAddr:     "127.0.0.1:0",
		EmbeddedEtcdPeerAddr: "127.0.0.1:0",
		Options:              registrar.Options{ClusterName: "c1", Region: "r1"},
		EndpointSlices:       server.EndpointSlicesConfig{Enabled: true, Namespace: "mesh", Kubeconfig: api.Kubeconfig},
	})
	register(t, dial(t, s.GRPCAddr()), ep("web", "10.0.0.1", 8080))
	sel := discoveryv1.LabelServiceName + "=web," + discoveryv1.LabelManagedBy + "=" + endpointslice.ManagedBy
	waitFor(t, "the endpoint published as a slice", 20*time.Second, func() bool {
		l, err := cs.DiscoveryV1().EndpointSlices("mesh").List(ctx, metav1.ListOptions{LabelSelector: sel})
		return err == nil && len(l.Items) == 1 && len(l.Items[0].Endpoints) == 1 && l.Items[0].Endpoints[0].Addresses[0] == "10.0.0.1"
	})
	_, body := get(t, "http://"+s.HTTPAddr()+"/metrics")
	if !strings.Contains(body, `endpointslice_writes_total{op="create"} 1`) {
		t.Fatalf("/metrics has no create counted")
	}
	closeCtx, cancelClose := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelClose()
	if err := s.Close(closeCtx); err != nil {
		t.Fatal(err)
	}
	// The slices stay for a successor to adopt.
	l, err := cs.DiscoveryV1().EndpointSlices("mesh").List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil || len(l.Items) != 1 {
		t.Fatalf("after close: %v, %d slices", err, len(l.Items))
	}
}

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
