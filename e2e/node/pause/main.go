// Command pause is the sandbox ("infra") process of the e2e real node's pods: it holds the
// pod's namespaces, reaps the zombies it inherits as PID 1 of a shared PID namespace, and
// exits 0 on SIGTERM or SIGINT. e2e/build-node.sh packs it alone into the image
// registry.local/vgpu-e2e/pause:1.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		// Several children may have exited for one SIGCHLD: reap until none is left.
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
