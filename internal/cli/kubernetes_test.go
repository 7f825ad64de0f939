package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

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
