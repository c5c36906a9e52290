// Package compose_test brings up docker-compose.yaml (NATS with JetStream and the three
// workers, images built here from Go sources and loaded into Docker) against the local cluster,
// and runs one lease end to end through it.
//
// It needs a Docker engine and Compose: internal/dockertest runs hack/docker/docker.sh, which
// installs Debian's docker.io and docker-compose when they are missing and starts dockerd (with
// its own containerd, apart from the cluster's) for the duration of the test. It does not skip
// without them.
package compose_test

import (
	"bytes"
	"context"
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
)

const root = "../.."

func TestComposeStackRunsALease(t *testing.T) {
	cs := clustertest.Clientset(t) // fails with instructions when no cluster answers
	dockertest.Start(t)            // the engine, with the images built here loaded
	// The workers run as uid 65532 and read the kubeconfig from a bind mount.
	kubeconfig := dockertest.Kubeconfig(t)

	project := "kubeclip-test-" + strings.ToLower(leasetest.NewID("")[1:])[20:]
	compose := composeCommand(t)
	env := append(os.Environ(),
		"KUBECLIP_COMPOSE_KUBECONFIG="+kubeconfig,
		"KUBECLIP_NATS_PORT=127.0.0.1:", // any free port on the loopback
		"KUBECLIP_LOG_LEVEL=debug",
	)
	run := func(args ...string) string {
		t.Helper()
		full := append(append([]string(nil), compose...), append([]string{"-p", project, "-f", filepath.Join(root, "docker-compose.yaml")}, args...)...)
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
	for _, w := range []string{"tenant-worker", "dispatcher", "run-watcher"} {
		id := strings.TrimSpace(run("ps", "-q", w))
		workers[w] = strings.TrimSpace(sh(t, "docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", id))
	}
	for w, ip := range workers {
		eventually(t, 2*time.Minute, w+" ready", func() error {
			body, err := get(fmt.Sprintf("http://%s:8080/readyz", ip))
			if err != nil {
				return err
			}
			if body != "ok nats\nok kubernetes\n" {
				return fmt.Errorf("/readyz: %q", body)
			}
			return nil
		})
	}

	nc, err := nats.Connect("nats://"+port, nats.Name(t.Name()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	res := leasetest.Run(t, js, cs)
	t.Logf("lease %s through the compose stack: %d log events, result %s, released %s",
		res.Created.ProviderLeaseID, len(res.Logs), res.Result.Outcome, res.Released.State)
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
