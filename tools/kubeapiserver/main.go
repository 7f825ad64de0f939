// Command kube-apiserver is Kubernetes' own API server (the same main as
// k8s.io/kubernetes/cmd/kube-apiserver), built from the module proxy at the
// version go.mod pins, for the kubernetes backend's tests. A package main
// cannot be imported, so its five lines are repeated here.
package main

import (
	"os"
	_ "time/tzdata"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
