package server

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	kubestore "github.com/aethermesh/aether/backend/kubernetes"
)

// BackendKubernetes is --backend kubernetes: the registry as custom
// resources in a Kubernetes API server (backend/kubernetes), node
// liveness on its Leases.
const BackendKubernetes = "kubernetes"

// serviceAccountNamespaceFile is where a pod finds its namespace (the
// service account's), as client-go's in-cluster client config reads it.
const serviceAccountNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// kubeRESTConfig is how the registrar reaches an API server, the way
// client-go's tools do it, and where that came from; both users (the
// kubernetes backend and the EndpointSlice reconciler) locate theirs by
// it, so one rule answers "which cluster does this registrar write to":
//
//   - the kubeconfig file given, else the KUBECONFIG environment variable
//     (a path list, merged as kubectl merges it): that file's current
//     context;
//   - else, in a pod (KUBERNETES_SERVICE_HOST set), the pod's service
//     account (rest.InClusterConfig: its token, renewed by the kubelet and
//     re-read by client-go, and the cluster CA).
//
// ~/.kube/config is deliberately not a fallback, unlike kubectl's: a
// registrar that silently wrote its registry into whichever cluster a
// developer's kubectl points at would be a hazard; name it with the flag.
// The namespace is the one given, else the kubeconfig context's, else the
// pod's (POD_NAMESPACE, then the service account's), else "default".
//
// feature ("--backend kubernetes") and flag ("--kubeconfig") are what the
// errors name: the option being set up, and the flag that gives its file.
func kubeRESTConfig(kubeconfig, namespace, feature, flag string) (cfg *rest.Config, ns, source string, err error) {
	paths := filepath.SplitList(os.Getenv(clientcmd.RecommendedConfigPathEnvVar))
	switch {
	case kubeconfig != "" || len(paths) > 0:
		rules := &clientcmd.ClientConfigLoadingRules{ExplicitPath: kubeconfig, Precedence: paths}
		source = flag + " " + kubeconfig
		if kubeconfig == "" {
			source = "KUBECONFIG=" + os.Getenv(clientcmd.RecommendedConfigPathEnvVar)
		}
		cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
		if cfg, err = cc.ClientConfig(); err != nil {
			return nil, "", "", fmt.Errorf("%s: %s: %w (give a readable kubeconfig with a current context)", feature, source, err)
		}
		if ns, _, err = cc.Namespace(); err != nil {
			return nil, "", "", fmt.Errorf("%s: %s: namespace: %w", feature, source, err)
		}
	default:
		cfg, err = rest.InClusterConfig()
		if errors.Is(err, rest.ErrNotInCluster) {
			return nil, "", "", fmt.Errorf("%s: no %s, no KUBECONFIG, and not running in a pod (KUBERNETES_SERVICE_HOST is unset): give %s PATH, or run the registrar in the cluster with a service account", feature, flag, flag)
		}
		if err != nil {
			return nil, "", "", fmt.Errorf("%s: the pod's service account: %w (is automountServiceAccountToken off?)", feature, err)
		}
		source = "the pod's service account"
		ns = os.Getenv("POD_NAMESPACE")
		if ns == "" {
			if b, rerr := os.ReadFile(serviceAccountNamespaceFile); rerr == nil {
				ns = strings.TrimSpace(string(b))
			}
		}
	}
	if namespace != "" {
		ns = namespace
	}
	if ns == "" {
		ns = "default"
	}
	return cfg, ns, source, nil
}

// loadKubernetes is load on the kubernetes backend: the REST config, the
// store (its CRDs checked, or installed with --kubernetes-install-crds),
// the snapshot.
func (s *Server) loadKubernetes(ctx context.Context) error {
	opts, log := s.opts, s.opts.Logger
	rc, ns, source, err := kubeRESTConfig(opts.Kubeconfig, opts.KubernetesNamespace, "--backend kubernetes", "--kubeconfig")
	if err != nil {
		return err
	}
	where := fmt.Sprintf("namespace %s at %s (%s)", ns, rc.Host, source)
	s.startup.waitFor("connecting to the Kubernetes API server: " + where)
	store, err := kubestore.New(ctx, kubestore.Config{
		RESTConfig:  rc,
		Namespace:   ns,
		Region:      opts.Region,
		Cluster:     opts.ClusterName,
		Logger:      log.With("component", "kubernetes"),
		InstallCRDs: opts.KubernetesInstallCRDs,
	})
	if err != nil {
		return fmt.Errorf("--backend kubernetes (%s): %w", where, err)
	}
	s.kube = store
	s.backend.Backend = store
	s.startup.waitFor("loading its snapshot from the Kubernetes API server: " + where)
	if err := s.reg.Start(ctx); err != nil {
		return err
	}
	s.serving()
	return nil
}

// validateKubernetes checks --backend and the kubernetes options before
// the other backends' checks (validateBackend), which do not know this
// backend.
func (c Config) validateKubernetes() error {
	switch c.Backend {
	case "", BackendEtcd, BackendDynamoDB:
		if c.Kubeconfig != "" || c.KubernetesNamespace != "" || c.KubernetesInstallCRDs {
			return fmt.Errorf("--kubeconfig, --kubernetes-namespace and --kubernetes-install-crds need --backend %s", BackendKubernetes)
		}
		return c.validateBackend()
	case BackendKubernetes:
	default:
		return fmt.Errorf("--backend %q: want %s, %s or %s", c.Backend, BackendEtcd, BackendDynamoDB, BackendKubernetes)
	}
	var other []string
	if len(c.EtcdEndpoints) > 0 {
		other = append(other, "--etcd-endpoints")
	}
	if len(c.PeerEtcd) > 0 {
		other = append(other, "--peer-etcd (multi-region replication is etcd's)")
	}
	if c.EtcdTLSEnabled() || c.EmbeddedEtcdTLSEnabled() || c.PeerEtcdTLSEnabled() {
		other = append(other, "the etcd TLS flags")
	}
	if c.DynamoDBTable != "" || c.DynamoDBRegion != "" || c.DynamoDBEndpoint != "" {
		other = append(other, "--dynamodb-table/--dynamodb-region/--dynamodb-endpoint")
	}
	if len(other) > 0 {
		return fmt.Errorf("--backend %s stores the registry in the API server and runs no etcd: drop %s", BackendKubernetes, strings.Join(other, ", "))
	}
	if c.KubernetesNamespace != "" {
		if errs := validation.IsDNS1123Label(c.KubernetesNamespace); len(errs) > 0 {
			return fmt.Errorf("--kubernetes-namespace %q: not a namespace name (%s); use lower-case letters, digits and '-', e.g. aether-system", c.KubernetesNamespace, strings.Join(errs, "; "))
		}
	}
	if c.Kubeconfig == "" && os.Getenv(clientcmd.RecommendedConfigPathEnvVar) == "" && os.Getenv("KUBERNETES_SERVICE_HOST") == "" {
		return fmt.Errorf("--backend %s needs an API server: give --kubeconfig PATH (or set KUBECONFIG), or run the registrar in a pod, where its service account is used", BackendKubernetes)
	}
	if c.Kubeconfig != "" {
		if _, err := os.Stat(c.Kubeconfig); err != nil {
			return fmt.Errorf("--kubeconfig %s: %w (give the path of a kubeconfig file, or leave it empty in a pod to use its service account)", c.Kubeconfig, err)
		}
	}
	return nil
}
