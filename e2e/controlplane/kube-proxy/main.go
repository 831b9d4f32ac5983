// Command kube-proxy runs the upstream Kubernetes service proxy, built at the version
// pinned in ../go.mod, for the real node of the vgpu end-to-end tests
// (e2e/build-node.sh builds it; vgpu_e2e::real_node runs it in iptables mode, so that pods
// reach the API server through the kubernetes Service as in a cluster).
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	"k8s.io/kubernetes/cmd/kube-proxy/app"
)

func main() {
	os.Exit(cli.Run(app.NewProxyCommand()))
}
