package cli

import (
	"github.com/spf13/pflag"

	"github.com/aethermesh/aether/server"
)

// addKubernetesFlags adds the registrar's --backend kubernetes flags
// (--backend itself is addDynamoDBFlags').
func addKubernetesFlags(f *pflag.FlagSet, opts *server.Config) {
	f.StringVar(&opts.Kubeconfig, "kubeconfig", "", "with --backend kubernetes: the kubeconfig file of the API server (its current context); empty takes KUBECONFIG, else, in a pod, the pod's service account (~/.kube/config is not read unless named)")
	f.StringVar(&opts.KubernetesNamespace, "kubernetes-namespace", "", "with --backend kubernetes: the namespace of the registry's objects and Leases; empty takes the kubeconfig context's, or the pod's (POD_NAMESPACE, then its service account's), else default")
	f.BoolVar(&opts.KubernetesInstallCRDs, "kubernetes-install-crds", false, "with --backend kubernetes: install or upgrade the AetherEndpoint and AetherNode CRDs at start (needs create/update on customresourcedefinitions); off, the registrar only checks they are installed (deploy/ installs them)")
}
