// Command kube-apiserver runs the upstream Kubernetes API server, built at the
// version pinned in ../go.mod, for the vgpu end-to-end tests.
package main

import (
	"os"

	_ "k8s.io/component-base/logs/json/register"
	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
