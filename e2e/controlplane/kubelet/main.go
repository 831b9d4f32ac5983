// Command kubelet runs the upstream Kubernetes node agent, built at the version
// pinned in ../go.mod, for the real node of the vgpu end-to-end tests
// (e2e/build-node.sh builds it; vgpu_e2e::real_node runs it).
package main

import (
	"context"
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	"k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	os.Exit(cli.Run(app.NewKubeletCommand(context.Background())))
}
