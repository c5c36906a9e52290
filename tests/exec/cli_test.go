package exec

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	pt "github.com/kubeclip/kubeclip/internal/pipelinetest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execclient"
	"github.com/kubeclip/kubeclip/pkg/execsvc"
)

// cli runs the kubeclip CLI with stdin and returns its stdout, stderr and exit status.
func cli(t *testing.T, stdin string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(env.Bin, pt.CLI), args...)
	cmd.Env = append(os.Environ(), "KUBECLIP_NATS_URL="+env.NATS.URL())
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return stdout.String(), stderr.String(), exit.ExitCode()
	case err != nil:
		t.Fatalf("kubeclip %s: %v", strings.Join(args, " "), err)
	}
	return stdout.String(), stderr.String(), 0
}

// TestCLI acquires a pod lease with `kubeclip acquire`, then runs commands in it with
// `kubeclip exec` and follows one with `kubeclip attach`.
func TestCLI(t *testing.T) {
	execWorkers(t, execsvc.RouteDaemon, 1)
	company := pt.NewID("co")
	pt.CleanupTenant(t, clustertest.Clientset(t), company)
	cfg := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(cfg, podConfig(), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := cli(t, "", "acquire", "--company", company, "--agent", pt.NewID("agent"), "--config", cfg)
	m := regexp.MustCompile(`run (\S+)`).FindStringSubmatch(out)
	if code != 0 || m == nil {
		t.Fatalf("acquire: exit %d, %q %q", code, out, errOut)
	}
	runID := m[1]

	for _, tc := range []struct {
		name, stdin      string
		args             []string
		wantOut, wantErr string
		wantCode         int
	}{
		{name: "stdin, stdout, stderr, exit code", stdin: "through the pod\n", args: []string{"--", "sh", "-c", "cat; echo oops >&2; exit 3"},
			wantOut: "through the pod\n", wantErr: "oops\n", wantCode: 3},
		{name: "cwd and env", args: []string{"--cwd", "/tmp", "-e", "A=1", "-e", "B=two", "--", "sh", "-c", `echo "$PWD $A $B"`},
			wantOut: "/tmp 1 two\n"},
		{name: "signal", args: []string{"--", "sh", "-c", "kill -TERM $$"}, wantCode: 128 + 15},
		{name: "timeout", args: []string{"--timeout", "1s", "--", "sleep", "60"}, wantCode: 124},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := cli(t, tc.stdin, append([]string{"exec", runID, "--company", company}, tc.args...)...)
			if out != tc.wantOut || errOut != tc.wantErr || code != tc.wantCode {
				t.Errorf("got exit %d, stdout %q, stderr %q; want %d, %q, %q", code, out, errOut, tc.wantCode, tc.wantOut, tc.wantErr)
			}
		})
	}

	t.Run("attach", func(t *testing.T) {
		created := pt.WaitKind[events.RunCreatedEvent](collect(t, company, runID), runTimeout)
		x := countdown(300)
		x.Lease = execclient.Lease{CompanyID: company, RunID: runID, ProviderLeaseID: created.ProviderLeaseID}
		x.ID = pt.NewID("x")
		owner := &lines{}
		x.Stdout = owner
		done := make(chan error, 1)
		go func() {
			_, err := run(t, newClient(t), &lease{Lease: x.Lease}, x)
			done <- err
		}()
		eventually(t, time.Minute, "output flows", func() bool { return owner.count() > 10 })
		out, errOut, code := cli(t, "", "attach", runID, x.ID, "--company", company)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if code != 0 || out != wantCountdown(300) {
			t.Errorf("attach: exit %d, %d lines (stderr %q), want the whole output", code, strings.Count(out, "\n"), errOut)
		}
	})
}

// collect follows a run the test did not acquire through pipelinetest.
func collect(t *testing.T, company, runID string) *pt.Run {
	t.Helper()
	r := env.NewRun(t, company, "")
	r.RunID = runID
	r.Collect()
	return r
}
