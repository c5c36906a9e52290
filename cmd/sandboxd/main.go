// Command sandboxd runs commands for kubeclip's exec service as PID 1 of an exec-capable agent
// pod, journalling their output so that a client resumes a stream with no gap and no duplicate.
// It is static and links neither the NATS nor the Kubernetes client: an init container copies it
// from kubeclip's image into every such pod (docs/exec.md).
package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/kubeclip/kubeclip/internal/cli"
	"github.com/kubeclip/kubeclip/internal/config"
)

const usage = `sandboxd runs commands in an agent pod for kubeclip's exec service.

Usage:
  sandboxd serve [flags]    the daemon, PID 1 of the pod (seed from --seed-file, or $KUBECLIP_SANDBOXD_SEED;
                            with --unbound, a warm pod's bind seed: it serves only its bind)
  sandboxd install <dst> [<seed-file>]
                            copy this executable to dst, mode 0755, and $KUBECLIP_SANDBOXD_SEED
                            to seed-file, mode 0400 (run by an init container)
  sandboxd proxy [flags]    bridge stdin and stdout to the daemon's unix socket (the route
                            through the Kubernetes exec API)
  sandboxd untar --root DIR [flags]
                            extract the tar on stdin under DIR; one JSON line {"files","bytes"}
  sandboxd tar --root DIR [flags] NAME...
                            write a tar of NAME... (relative to DIR) to stdout
                            (native sync; refusals exit 65, I/O failures 74: docs/exec.md)

"sandboxd <command> --help" lists a command's flags.
`

func main() { os.Exit(cli.Main("sandboxd", run)) }

func run(ctx context.Context, args []string, lookupEnv config.LookupEnv, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return &cli.UsageError{Err: fmt.Errorf("no command (serve, install, proxy, untar or tar)")}
	}
	switch args[0] {
	case "serve":
		return serve(ctx, args[1:], lookupEnv, stdout, stderr)
	case "install":
		return install(args[1:], lookupEnv, stdout)
	case "proxy":
		// stdout is the byte stream itself: nothing else may be written to it.
		return proxy(ctx, args[1:], lookupEnv, os.Stdin, stdout)
	case "untar":
		return untarCmd(args[1:], os.Stdin, stdout, stderr)
	case "tar":
		// stdout is the archive itself: nothing else may be written to it.
		return tarCmd(args[1:], stdout, stderr)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	default:
		fmt.Fprint(stderr, usage)
		return &cli.UsageError{Err: fmt.Errorf("unknown command %q", args[0])}
	}
}
