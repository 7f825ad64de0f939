// Command kubectl is Kubernetes' own kubectl (the main of
// k8s.io/kubernetes/cmd/kubectl), built at the same version as the API
// server the tests run, so the deployment tests do not depend on whatever
// kubectl, of whatever version skew, a machine happens to have.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"

	_ "k8s.io/client-go/plugin/pkg/client/auth"
)

func main() {
	// The verbosity is set before the command is built, as upstream does,
	// so klog honours -v while kubectl reads its kuberc and plugins.
	logs.GlogSetter(cmd.GetLogVerbosity(os.Args)) // nolint:errcheck
	if err := cli.RunNoErrOutput(cmd.NewDefaultKubectlCommand()); err != nil {
		util.CheckErr(err)
	}
}
