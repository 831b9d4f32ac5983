// Command kube-controller-manager runs the upstream Kubernetes controllers, built at the
// version pinned in ../go.mod, for the vgpu end-to-end tests that install charts: DaemonSets
// and Deployments need their controllers, Helm's uninstall the garbage collector, and pods
// the service-account and root-CA publishers (vgpu_e2e::TestEnvBuilder::cluster_services).
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() {
	os.Exit(cli.Run(app.NewControllerManagerCommand()))
}
