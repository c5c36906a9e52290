// Command tini is a stand-in for tini in the local test images: it replaces itself with the
// command after "--".
//
// The Job that pkg/policy renders runs `/usr/bin/tini -- /usr/local/bin/paperclip-agent-shim`, as
// Paperclip's runtime images do. The test image only needs that command line to work, so this
// program execs its argument vector (looked up in PATH when not absolute) and forwards nothing
// else: the command becomes PID 1 and must handle its own signals.
package main

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
)

func main() {
	args := os.Args[1:]
	for i, a := range args {
		if a == "--" {
			args = args[i+1:]
			break
		}
	}
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: tini -- command [args...]")
		os.Exit(2)
	}
	cmd, err := exec.LookPath(args[0])
	if err != nil {
		fmt.Fprintf(os.Stderr, "tini: %v\n", err)
		os.Exit(127)
	}
	err = syscall.Exec(cmd, args, os.Environ())
	fmt.Fprintf(os.Stderr, "tini: exec %s: %v\n", cmd, err)
	os.Exit(126)
}
