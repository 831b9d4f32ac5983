// Command etcd runs the upstream etcd server, built at the version pinned in
// ../go.mod, as the storage of the vgpu end-to-end test API server.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
