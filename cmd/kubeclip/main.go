// Command kubeclip is the operator's and developer's CLI: it publishes lease requests, follows
// a run's events in a readable form, shows a lease's state and resumes or destroys a reusable
// lease, runs commands in exec-capable leases' pods and copies files in and out of them, shows the
// installation on one screen (status), and runs the whole pipeline locally (demo).
package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/kubeclip/kubeclip/internal/app"
	"github.com/kubeclip/kubeclip/internal/config"
)

const usage = `kubeclip publishes Paperclip lease requests and follows run events.

Usage:
  kubeclip acquire  --company ID --agent ID [--run ID] [--config FILE] [--reuse-lease] [--follow]
  kubeclip release  --company ID --run ID [--lease NAME] [--destroy] [--cancel=false] [--wait]
  kubeclip lease    show|resume|destroy --company ID --run ID [--lease NAME]
  kubeclip runs     replay|follow <runId> [--from-seq N | --since DURATION]
  kubeclip exec     <runId> --company ID [-t] [--cwd DIR] [-e K=V]... [--timeout D] -- command [args...]
  kubeclip attach   <runId> <execId> --company ID [--from-seq N]
  kubeclip cp       <runId> --company ID [flags] LOCAL :DIR | :PATH LOCALDIR
  kubeclip status   [--company ID] [--metrics-url URL]... [--watch] [-o json]
  kubeclip demo     [--kubeconfig FILE]

Run "kubeclip <command> --help" for a command's flags.
`

func main() { os.Exit(app.Main("kubeclip", run)) }

func run(ctx context.Context, args []string, lookupEnv config.LookupEnv, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stdout, usage)
		if len(args) == 0 {
			return &app.UsageError{Err: fmt.Errorf("no command given")}
		}
		return nil
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "acquire":
		return runAcquire(ctx, rest, lookupEnv, stdout)
	case "release":
		return runRelease(ctx, rest, lookupEnv, stdout)
	case "lease":
		return runLease(ctx, rest, lookupEnv, stdout)
	case "follow":
		return runFollow(ctx, rest, lookupEnv, stdout)
	case "runs":
		return runRuns(ctx, rest, lookupEnv, stdout)
	case "exec":
		return runExec(ctx, rest, lookupEnv, stdout, stderr)
	case "attach":
		return runAttach(ctx, rest, lookupEnv, stdout, stderr)
	case "cp":
		return runCp(ctx, rest, lookupEnv, stdout, stderr)
	case "status":
		return runStatus(ctx, rest, lookupEnv, stdout)
	case "demo":
		return runDemo(ctx, rest, lookupEnv, stdout, stderr)
	default:
		fmt.Fprint(stderr, usage)
		return &app.UsageError{Err: fmt.Errorf("unknown command %q", cmd)}
	}
}
