// Command claude-stub stands in for the Claude Code CLI in the sandbox test image
// (kubeclip.local/sandbox:dev, installed as /usr/local/bin/claude). It behaves like
//
//	claude --print --output-format stream-json --verbose [--model M] [--resume ID] ...
//
// as Paperclip's claude_local adapter runs it: it reads the prompt from stdin to EOF (or takes it
// from a positional argument), then prints Claude Code stream-json lines on stdout, pausing
// between them so that a test can watch them stream: a system/init line (session_id, model), an
// assistant line about the prompt, one line on stderr, an assistant line per Paperclip API call,
// a closing assistant line, and a result line (subtype "success", is_error false, usage,
// modelUsage and total_cost_usd). Every line also carries `timestamp`, when the stub wrote it,
// so that a test can measure how long a line takes to reach Paperclip. `claude --version` prints
// a version. `claude setup-token` plays the sign-in screen Paperclip's setup-token login reads
// (setuptoken.go). Other flags Paperclip passes (--allowedTools, --append-system-prompt-file,
// --mcp-config, --add-dir, ...) are accepted and ignored.
//
// With PAPERCLIP_API_URL and PAPERCLIP_API_KEY set (Paperclip's in-sandbox API bridge), it calls
// GET $PAPERCLIP_API_URL/api/agents/me with "Authorization: Bearer $PAPERCLIP_API_KEY" and, when
// PAPERCLIP_TASK_ID is set, PATCH $PAPERCLIP_API_URL/api/issues/$PAPERCLIP_TASK_ID with
// {"status":"done"}, so that an issue-assigned run closes its issue as a real agent would. A
// failed call ends the run: an error result line, the error on stderr, exit code 1.
//
// Environment:
//
//	CLAUDE_STUB_INTERVAL        Go duration of the pause between lines (default 1s; 0 for none)
//	KUBECLIP_STUB_ENV_DUMP      non-empty: right after the init line, one system/kubeclip_env line
//	                            with the stub's own environment (names and SHA-256 of the values,
//	                            never a value), then one per environment the sh wrapper saw
//	                            (envdump.go)
//	KUBECLIP_STUB_ENV_DIR       where the sh wrapper leaves its reports (default /tmp/kubeclip-stub-env)
//	KUBECLIP_STUB_FILLER_BYTES  after the first assistant line, about this many bytes of
//	                            system/kubeclip_filler lines (64 KiB each, words, no pauses): a large
//	                            output for the tests that bound what holds it (default 0)
//	KUBECLIP_STUB_STATE         non-empty: keep the session under $HOME/.claude/kubeclip-stub, append
//	                            PAPERCLIP_RUN_ID to .kubeclip-stub-runs in the working directory and
//	                            in $HOME, and say on stderr what earlier runs left: the resumed
//	                            session's run count, the other sessions kept there, the run ids
//	                            found in each (state.go)
//	KUBECLIP_STUB_LINKS         non-empty: before the result line, leave links that lead out of the
//	                            working directory in it: etc -> /etc, up -> ../../.. (hostile.go)
//	KUBECLIP_STUB_PAX_FLOOD     before the result line, leave a process behind that writes about this
//	                            many bytes of PAX headers into the archive of the working directory
//	                            that the next `sandboxd tar` sends (sync out), and the 32 MiB of
//	                            files it needs to find its place (hostile.go; default 0: none)
//	KUBECLIP_STUB_MODEL_CALL    non-empty: after the Paperclip calls, one streamed Anthropic Messages
//	                            call to $ANTHROPIC_BASE_URL (default https://api.anthropic.com) with
//	                            x-api-key $ANTHROPIC_API_KEY, trusting $NODE_EXTRA_CA_CERTS as Node
//	                            does; its answer becomes an assistant line and part of the result
//	                            (model.go)
//	KUBECLIP_STUB_SECRET_SEARCH <sha256 hex>:<length>:<prefix> of a credential the stub must not
//	                            know: then one system/kubeclip_secret_search line counting where
//	                            it found it (its environment, every readable file, /proc/*/environ
//	                            and /proc/*/cmdline) and the broker placeholders it saw (search.go)
//
// Installed as sh (argv[0] "sh"), the stub is the sh wrapper instead: see envdump.go.
//
// Exit codes: 0 success, 1 a failed run (as the real CLI), 2 bad arguments or environment.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if isShell(os.Args[0]) {
		os.Exit(shellMain(os.Args, os.Environ(), os.Stderr))
	}
	if len(os.Args) > 1 && os.Args[1] == floodCommand {
		os.Exit(floodMain(os.Args[2:], os.Stderr))
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	err := run(ctx, os.Args[1:], os.Environ(), os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(exitCode(err, os.Stderr))
}

// exitCode reports err on stderr and maps it to the process's exit code.
func exitCode(err error, stderr io.Writer) int {
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "claude:", err)
	if isUsage(err) {
		return 2
	}
	return 1
}
