// Command pause is the sandbox ("pause") container of the dev cluster's real node, written for
// this project: it holds the pod's namespaces while the pod lives, reaps children re-parented to
// it (it is PID 1 when a pod shares its process namespace), and exits at once on SIGINT or
// SIGTERM. Built static (CGO_ENABLED=0) by elastic_gpu.devcluster.images and cached by the hash
// of this file.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
