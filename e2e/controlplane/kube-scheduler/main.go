// Command kube-scheduler runs the upstream Kubernetes scheduler, built at the
// version pinned in ../go.mod, for the vgpu end-to-end tests.
package main

import (
	"os"

	_ "k8s.io/component-base/logs/json/register"
	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	os.Exit(cli.Run(app.NewSchedulerCommand()))
}
