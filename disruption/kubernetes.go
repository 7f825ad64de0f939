package disruption

import (
	"context"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/aethermesh/aether/server"
)

// BackendKubernetes is the battery on a Kubernetes API server
// (Config.Kubeconfig): both registrars keep the registry as custom
// resources in a namespace of its own.
const BackendKubernetes = server.BackendKubernetes

// kubeNamespacePrefix names the battery's namespaces, one per run, so that
// a rerun (or a bench harness running several) never sees the records of
// another.
const kubeNamespacePrefix = "aether-disruption-"

// useKubernetes creates a fresh namespace for the battery on the API
// server of cfg.Kubeconfig (its current context's user needs to create
// and delete namespaces, and to install the CRDs if they are missing) and
// points the registrars' options at it. It returns the function deleting
// the namespace again, for cluster.close.
func useKubernetes(ctx context.Context, cfg Config, o *server.Config) (drop func() error, err error) {
	rc, err := clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("disruption: Kubeconfig %s: %w", cfg.Kubeconfig, err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("disruption: Kubeconfig %s: %w", cfg.Kubeconfig, err)
	}
	ns := kubeNamespacePrefix + strconv.FormatInt(time.Now().UnixNano(), 36)
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := cs.CoreV1().Namespaces().Create(cctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name:   ns,
		Labels: map[string]string{"app.kubernetes.io/managed-by": "aether-disruption"},
	}}, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("disruption: create namespace %s at %s: %w", ns, rc.Host, err)
	}
	o.Backend, o.Kubeconfig, o.KubernetesNamespace = BackendKubernetes, cfg.Kubeconfig, ns
	// The battery's namespace is new, so its CRDs may be the first on this
	// API server; the registrars install them as --kubernetes-install-crds
	// does (a no-op where they exist).
	o.KubernetesInstallCRDs = true
	drop = func() error {
		// Without a namespace controller (a bare API server, as in tests)
		// the namespace stays Terminating with its objects; in a cluster
		// the controller removes them.
		dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := cs.CoreV1().Namespaces().Delete(dctx, ns, metav1.DeleteOptions{}); err != nil {
			return fmt.Errorf("disruption: delete namespace %s: %w", ns, err)
		}
		return nil
	}
	return drop, nil
}

// validateKubernetes checks Backend and Kubeconfig before validateBackend,
// which knows the other backends only (as server.Config does it).
func (c Config) validateKubernetes() error {
	switch c.Backend {
	case BackendEtcd, BackendDynamoDB:
		if c.Kubeconfig != "" {
			return fmt.Errorf("disruption: Kubeconfig is for Backend %q", BackendKubernetes)
		}
		return c.validateBackend()
	case BackendKubernetes:
	default:
		return fmt.Errorf("disruption: Backend %q: use %s, %s or %s", c.Backend, BackendEtcd, BackendDynamoDB, BackendKubernetes)
	}
	if c.Kubeconfig == "" {
		return fmt.Errorf("disruption: Backend %q needs Kubeconfig (the path of a kubeconfig whose current context may create namespaces; the battery makes a namespace of its own there)", BackendKubernetes)
	}
	if c.DynamoDBEndpoint != "" {
		return fmt.Errorf("disruption: DynamoDBEndpoint is for Backend %q", BackendDynamoDB)
	}
	return nil
}
