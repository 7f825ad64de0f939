package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/kubeapi"
	"github.com/aethermesh/aether/internal/testutil/regtest"
	"github.com/aethermesh/aether/internal/testutil/wait"
	"github.com/aethermesh/aether/server"
)

// TestKubernetesFlags: --backend kubernetes takes its flags into the
// served config, and each bad combination is refused before anything
// starts, naming the flag and the fix.
func TestKubernetesFlags(t *testing.T) {
	// Not in a pod, no KUBECONFIG: only --kubeconfig says where the API
	// server is.
	t.Setenv("KUBECONFIG", "")
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, []byte("apiVersion: v1\nkind: Config\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"registrar", "--cluster-name", "c1", "--region", "r1"}

	res := runCLI(t, nil, nil, append(base, "--backend", "kubernetes", "--kubeconfig", kc, "--kubernetes-namespace", "aether-system", "--kubernetes-install-crds")...)
	if res.err != nil || res.served == nil {
		t.Fatalf("registrar --backend kubernetes: %v", res.err)
	}
	if c := res.served; c.Backend != server.BackendKubernetes || c.Kubeconfig != kc || c.KubernetesNamespace != "aether-system" || !c.KubernetesInstallCRDs {
		t.Fatalf("served config: backend %q kubeconfig %q namespace %q install %v", c.Backend, c.Kubeconfig, c.KubernetesNamespace, c.KubernetesInstallCRDs)
	}
	// From the environment, as every registrar flag.
	res = runCLI(t, nil, map[string]string{"AETHER_BACKEND": "kubernetes", "AETHER_KUBECONFIG": kc}, base...)
	if res.err != nil || res.served == nil || res.served.Kubeconfig != kc {
		t.Fatalf("registrar with AETHER_BACKEND=kubernetes AETHER_KUBECONFIG: %v", res.err)
	}

	for _, c := range []struct {
		name string
		args []string
		env  map[string]string
		want []string
	}{
		{"kubeconfig without the backend", []string{"--kubeconfig", kc}, nil, []string{"--kubeconfig", "need --backend kubernetes"}},
		{"namespace without the backend", []string{"--backend", "dynamodb", "--kubernetes-namespace", "ns"}, nil, []string{"--kubernetes-namespace", "need --backend kubernetes"}},
		{"unknown backend", []string{"--backend", "k8s"}, nil, []string{`--backend "k8s"`, "etcd, dynamodb or kubernetes"}},
		{"no API server", []string{"--backend", "kubernetes"}, nil, []string{"--kubeconfig PATH", "KUBECONFIG", "in a pod"}},
		{"missing kubeconfig", []string{"--backend", "kubernetes", "--kubeconfig", kc + ".missing"}, nil, []string{"--kubeconfig " + kc + ".missing", "no such file"}},
		{"bad namespace", []string{"--backend", "kubernetes", "--kubeconfig", kc, "--kubernetes-namespace", "Aether_NS"}, nil, []string{`--kubernetes-namespace "Aether_NS"`, "aether-system"}},
		{"etcd endpoints", []string{"--backend", "kubernetes", "--kubeconfig", kc, "--etcd-endpoints", "http://etcd:2379"}, nil, []string{"runs no etcd", "drop --etcd-endpoints"}},
		{"dynamodb table", []string{"--backend", "kubernetes", "--kubeconfig", kc, "--dynamodb-table", "t"}, nil, []string{"drop --dynamodb-table"}},
		{"peer etcd", []string{"--backend", "kubernetes", "--kubeconfig", kc, "--peer-etcd", "r2=http://etcd:2379"}, nil, []string{"drop --peer-etcd"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			res := runCLI(t, nil, c.env, append(append([]string{}, base...), c.args...)...)
			if res.err == nil || res.served != nil {
				t.Fatalf("%v: accepted (served %v)", c.args, res.served != nil)
			}
			for _, w := range c.want {
				if !strings.Contains(res.err.Error(), w) {
					t.Errorf("%v: error %q does not say %q", c.args, res.err, w)
				}
			}
		})
	}

	// KUBECONFIG alone, or being in a pod, is enough to pass the checks
	// (the API server itself is reached at start).
	t.Setenv("KUBECONFIG", kc)
	if res := runCLI(t, nil, nil, append(base, "--backend", "kubernetes")...); res.err != nil {
		t.Fatalf("--backend kubernetes with KUBECONFIG set: %v", res.err)
	}
	t.Setenv("KUBECONFIG", "")
	t.Setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
	if res := runCLI(t, nil, nil, append(base, "--backend", "kubernetes")...); res.err != nil {
		t.Fatalf("--backend kubernetes in a pod: %v", res.err)
	}
}

// runRegistrarCmd runs `aether <args>` as the binary does (the real
// serve), until the returned stop is called; stop returns its error.
func runRegistrarCmd(t *testing.T, args ...string) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var out, errb bytes.Buffer
	root := newRoot(deps{stdout: &out, stderr: &errb, lookupEnv: func(string) (string, bool) { return "", false }, serve: serveRegistrar})
	root.SetArgs(args)
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() { cancel(); err = <-done })
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// TestRegistrarOnKubernetesEndToEnd: `aether registrar --backend
// kubernetes --kubeconfig <file>` against a real kube-apiserver: it
// installs its CRDs, serves registrations over gRPC, and a restart (a new
// process, the same flags) still has them, loaded from the API server.
func TestRegistrarOnKubernetesEndToEnd(t *testing.T) {
	api := kubeapi.Start(t)
	t.Setenv("KUBECONFIG", "")
	grpcAddr, httpAddr := regtest.FreeAddr(t), regtest.FreeAddr(t)
	args := []string{"registrar", "--cluster-name", testCluster, "--region", testRegion,
		"--backend", "kubernetes", "--kubeconfig", api.Kubeconfig, "--kubernetes-namespace", "default", "--kubernetes-install-crds",
		"--grpc-addr", grpcAddr, "--http-addr", httpAddr, "--log-level", "error"}
	stop := runRegistrarCmd(t, args...)
	c := regtest.Dial(t, grpcAddr)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	e := regtest.EP("web", "10.0.0.1", 80)
	wait.For(t, "the registrar on kubernetes to accept a registration", 30*time.Second, func() bool {
		_, err := c.RegisterEndpoint(ctx, &registrarv1.RegisterEndpointRequest{Endpoint: e})
		return err == nil
	})
	if _, err := c.AnnounceNode(ctx, &registrarv1.AnnounceNodeRequest{Node: &registryv1.Node{Name: "n1"}}); err != nil {
		t.Fatalf("AnnounceNode: %v", err)
	}
	if err := stop(); err != nil {
		t.Fatalf("registrar exited with %v", err)
	}

	runRegistrarCmd(t, args...)
	c = regtest.Dial(t, grpcAddr)
	var eps []*registryv1.ServiceEndpoint
	wait.For(t, "the restarted registrar to serve the endpoint it loaded", 30*time.Second, func() bool {
		r, err := c.ListAllEndpoints(ctx, &registrarv1.ListAllEndpointsRequest{Services: []string{"web"}})
		if err != nil {
			return false
		}
		eps = r.GetEndpoints()
		return len(eps) == 1
	})
	if eps[0].GetIp() != "10.0.0.1" {
		t.Fatalf("after the restart: %v", eps)
	}
	nodes, err := c.ListNodes(ctx, &registrarv1.ListNodesRequest{})
	if err != nil || len(nodes.GetNodes()) != 1 || nodes.GetNodes()[0].GetNode().GetName() != "n1" {
		t.Fatalf("nodes after the restart: %v, %v", nodes, err)
	}
}
