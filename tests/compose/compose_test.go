// Package compose_test brings up docker-compose.yaml (NATS with JetStream and kubeclip's users,
// the four workers and the credential broker, images built here from Go sources and loaded into
// Docker, random secrets from hack/compose/secrets.sh) against the local cluster, and runs one
// lease and one exec end to end through it, as Paperclip's NATS user. The exec-worker takes
// compose's default route, the Kubernetes exec API: containers outside a cluster rarely reach
// its pod IPs. The credential broker (no lease here uses it yet) is checked on its own: its
// secrets, its NATS user, a mint and its proxy's refusals (broker_test.go).
//
// It needs a Docker engine and Compose: internal/dockertest runs hack/docker/docker.sh, which
// installs Debian's docker.io and docker-compose when they are missing and starts dockerd (with
// its own containerd, apart from the cluster's) for the duration of the test. It does not skip
// without them.
package compose_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	"github.com/kubeclip/kubeclip/internal/dockertest"
	"github.com/kubeclip/kubeclip/internal/leasetest"
	"github.com/kubeclip/kubeclip/pkg/inbox"
)

const root = "../.."

func TestComposeStackRunsALease(t *testing.T) {
	cs := clustertest.Clientset(t) // fails with instructions when no cluster answers
	dockertest.Start(t)            // the engine, with the images built here loaded
	// The workers run as uid 65532 and read the kubeconfig from a bind mount.
	kubeconfig := dockertest.Kubeconfig(t)
	// The NATS passwords, the sandbox key and the broker's CA and sealing key, as `make
	// compose-up` makes them.
	secretsDir := t.TempDir()
	printed := runSecrets(t, secretsDir)
	envFile := filepath.Join(secretsDir, "secrets.env")
	secrets := readEnvFile(t, envFile)
	checkComposeSecrets(t, secretsDir, printed)

	project := "kubeclip-test-" + strings.ToLower(leasetest.NewID("")[1:])[20:]
	compose := composeCommand(t)
	env := append(os.Environ(),
		"KUBECLIP_COMPOSE_KUBECONFIG="+kubeconfig,
		"KUBECLIP_NATS_PORT=127.0.0.1:", // any free port on the loopback
		"KUBECLIP_BROKER_PORT=127.0.0.1:",
		"KUBECLIP_LOG_LEVEL=debug",
	)
	run := func(args ...string) string {
		t.Helper()
		full := append(append([]string(nil), compose...), append([]string{"--env-file", envFile, "-p", project, "-f", filepath.Join(root, "docker-compose.yaml")}, args...)...)
		cmd := exec.Command(full[0], full[1:]...)
		cmd.Env = env
		var out, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("%s: %v\n%s%s", strings.Join(full, " "), err, out.String(), stderr.String())
		}
		return out.String()
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("compose logs:\n%s", tail(run("logs", "--no-color"), 120))
		}
		run("down", "--volumes", "--remove-orphans", "--timeout", "45")
	})
	run("up", "-d")

	// NATS from this host through the published port; the workers' readiness on their own IPs.
	port := strings.TrimSpace(run("port", "nats", "4222"))
	workers := map[string]string{}
	for _, w := range []string{"tenant-worker", "dispatcher", "run-watcher", "exec-worker", "credential-broker"} {
		id := strings.TrimSpace(run("ps", "-q", w))
		workers[w] = strings.TrimSpace(sh(t, "docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", id))
	}
	natsIP := strings.TrimSpace(sh(t, "docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", strings.TrimSpace(run("ps", "-q", "nats"))))
	for w, ip := range workers {
		want := "ok nats\nok kubernetes\nok permissions\n"
		switch w {
		case "exec-worker":
			want += "ok exec\n"
		case "credential-broker":
			// NATS only (no Kubernetes client): its user's permissions held, its grant cache
			// loaded (it started, so it read the CA and the sealing key of secrets.sh's
			// DIR/broker through the read-only mount).
			want = "ok nats\nok permissions\nok grants\n"
		}
		eventually(t, 2*time.Minute, w+" ready", func() error {
			body, err := get(fmt.Sprintf("http://%s:8080/readyz", ip))
			if err != nil {
				return err
			}
			if body != want {
				return fmt.Errorf("/readyz: %q, want %q", body, want)
			}
			return nil
		})
	}

	// The broker on its own NATS user (the workers' may not read grants).
	checkBrokerNATSUser(t, natsIP, workers["credential-broker"])

	// NATS users are on: nobody gets in without credentials.
	if nc, err := nats.Connect("nats://"+port, nats.NoReconnect()); !errors.Is(err, nats.ErrAuthorization) {
		if err == nil {
			nc.Close()
		}
		t.Errorf("connecting without credentials: %v, want %v", err, nats.ErrAuthorization)
	}
	nc, err := nats.Connect("nats://"+port, nats.Name(t.Name()), nats.UserInfo("paperclip", secrets["KUBECLIP_NATS_PASSWORD_PAPERCLIP"]), nats.CustomInboxPrefix(inbox.PaperclipPrefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	checkBrokerServes(t, nc, secrets["KUBECLIP_COMPOSE_BROKER_DIR"], strings.TrimSpace(run("port", "credential-broker", "8443")), workers["credential-broker"])

	res := leasetest.Run(t, js, cs)
	t.Logf("lease %s through the compose stack: %d log events, result %s, released %s",
		res.Created.ProviderLeaseID, len(res.Logs), res.Result.Outcome, res.Released.State)

	x := leasetest.Exec(t, nc, js, cs)
	t.Logf("exec in lease %s through the compose stack's exec-worker %s: %d bytes of output, released %s",
		x.Created.ProviderLeaseID, x.Exec.Replica, len(x.Exec.Stdout)+len(x.Exec.Stderr), x.Released.State)
}

// readEnvFile reads the NAME=value lines of a compose env file.
func readEnvFile(t *testing.T, path string) map[string]string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(k, "#") {
			out[k] = v
		}
	}
	for _, k := range []string{"KUBECLIP_NATS_PASSWORD_WORKERS", "KUBECLIP_NATS_PASSWORD_EXEC_WORKER", "KUBECLIP_NATS_PASSWORD_BROKER", "KUBECLIP_NATS_PASSWORD_PAPERCLIP", "KUBECLIP_NATS_PASSWORD_CLI", "KUBECLIP_NATS_PASSWORD_STATUS", "KUBECLIP_COMPOSE_SANDBOX_KEY", "KUBECLIP_COMPOSE_BROKER_DIR"} {
		if out[k] == "" {
			t.Fatalf("%s sets no %s", path, k)
		}
	}
	return out
}

// composeCommand is `docker compose` (v2) when the Docker CLI has it, else docker-compose (v1).
func composeCommand(t *testing.T) []string {
	if exec.Command("docker", "compose", "version").Run() == nil {
		return []string{"docker", "compose"}
	}
	if p, err := exec.LookPath("docker-compose"); err == nil {
		return []string{p}
	}
	t.Fatal("neither `docker compose` nor docker-compose is installed; hack/docker/docker.sh up installs docker-compose")
	return nil
}

func sh(t *testing.T, name string, args ...string) string {
	t.Helper()
	var out, stderr bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out.String(), stderr.String())
	}
	return out.String()
}

func get(url string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return string(body), err
}

func eventually(t *testing.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, timeout, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
