// Command pause is the pod sandbox ("pause") process of the local test cluster.
//
// No image can be pulled there, so containerd's sandbox_image points at an image built from this
// program. It holds the pod's namespaces open until SIGTERM or SIGINT, then exits 0, and reaps
// zombies in case the pod shares its PID namespace.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
