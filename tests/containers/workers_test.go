package containers

import (
	"crypto/rand"
	"encoding/hex"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
	tcexec "github.com/testcontainers/testcontainers-go/exec"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/kubeclip/kubeclip/internal/dockertest"
)

// unreachableKubeconfig names an API server nobody listens on: enough for a worker to build its
// clients and start, which is all TestWorkerImagesAreStaticNonRoot needs.
const unreachableKubeconfig = `apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: none, user: {token: none}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
`

// sandboxKeyFile is where the exec-worker's container finds its sandbox master key.
const sandboxKeyFile = "/etc/kubeclip/sandbox-key"

func TestWorkerImagesAreStaticNonRoot(t *testing.T) {
	cli := dockerClient(t)
	for _, tc := range []struct {
		image    string
		wantFlag string // one of the worker's own flags, so the image holds the right binary
		wantEnv  string
		needsKey bool // the worker does not start without a sandbox key
	}{
		{image: "tenant-worker", wantFlag: "--tenant-resync", wantEnv: "KUBECLIP_TENANT_RESYNC"},
		{image: "dispatcher", wantFlag: "--agent-busy-timeout", wantEnv: "KUBECLIP_AGENT_BUSY_TIMEOUT"},
		{image: "run-watcher", wantFlag: "--log-flush-interval", wantEnv: "KUBECLIP_LOG_FLUSH_INTERVAL"},
		{image: "exec-worker", wantFlag: "--exec-route", wantEnv: "KUBECLIP_EXEC_ROUTE", needsKey: true},
	} {
		t.Run(tc.image, func(t *testing.T) {
			ref := dockertest.Image(tc.image)
			if got := imageUser(t, cli, ref); got != dockertest.User {
				t.Errorf("image %s runs as %q, want %q", ref, got, dockertest.User)
			}

			// --help: a FROM-scratch image has no C library, so the binary only runs if it is static.
			help := start(t, testcontainers.ContainerRequest{
				Image:      ref,
				Cmd:        []string{"--help"},
				WaitingFor: wait.ForExit().WithExitTimeout(time.Minute),
			})
			state, err := help.State(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			usage := logs(t, help)
			if state.ExitCode != 0 {
				t.Errorf("%s --help exited with %d, want 0\n%s", ref, state.ExitCode, usage)
			}
			for _, want := range []string{
				"--nats-url", "env KUBECLIP_NATS_URL", "--ops-addr", "env KUBECLIP_OPS_ADDR",
				tc.wantFlag, "env " + tc.wantEnv,
			} {
				if !strings.Contains(usage, want) {
					t.Errorf("%s --help does not mention %q:\n%s", ref, want, usage)
				}
			}
			if flags, envs := strings.Count(usage, "\n  --"), strings.Count(usage, "env KUBECLIP_"); flags == 0 || flags != envs {
				t.Errorf("%s --help lists %d flags and %d environment variables, want one per flag:\n%s", ref, flags, envs, usage)
			}

			// Running: with NATS unreachable the worker stays up, live but not ready.
			req := testcontainers.ContainerRequest{
				Image: ref,
				Env: map[string]string{
					"KUBECLIP_NATS_URL":   "nats://127.0.0.1:1",
					"KUBECLIP_KUBECONFIG": "/etc/kubeclip/kubeconfig",
					"KUBECLIP_OPS_ADDR":   ":8080",
				},
				Files: []testcontainers.ContainerFile{{
					Reader:            strings.NewReader(unreachableKubeconfig),
					ContainerFilePath: "/etc/kubeclip/kubeconfig",
					FileMode:          0o644,
				}},
				ExposedPorts: []string{"8080/tcp"},
				WaitingFor:   wait.ForHTTP("/healthz").WithPort("8080/tcp").WithStartupTimeout(time.Minute),
			}
			if tc.needsKey {
				req.Env["KUBECLIP_SANDBOX_KEY_FILE"] = sandboxKeyFile
				req.Files = append(req.Files, testcontainers.ContainerFile{
					Reader: strings.NewReader(randomHex(t, 32)), ContainerFilePath: sandboxKeyFile, FileMode: 0o444,
				})
			}
			worker := start(t, req)
			if code, body := get(t, endpoint(t, worker, "8080/tcp")+"/readyz"); code != http.StatusServiceUnavailable {
				t.Errorf("/readyz without NATS: %d %q, want %d", code, body, http.StatusServiceUnavailable)
			}
			wantUID(t, cli, worker.GetContainerID())

			// No shell: nothing in the image but the binary and the CA bundle. The exec itself
			// works; the runtime cannot find the command (126 from Docker, 127 from others).
			code, out, err := worker.Exec(t.Context(), []string{"/bin/sh", "-c", "true"}, tcexec.Multiplexed())
			if err != nil {
				t.Fatalf("exec in %s: %v", ref, err)
			}
			output, _ := io.ReadAll(out)
			if code != 126 && code != 127 {
				t.Errorf("exec /bin/sh in %s: exit %d, want 126 or 127 (no shell in the image)\n%s", ref, code, output)
			}
		})
	}
}

// randomHex is n random bytes in hex, as `openssl rand -hex n` writes them.
func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}
