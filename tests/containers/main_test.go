// Package containers runs kubeclip's production images (hack/images/images.sh: static Go binaries
// FROM scratch, uid 65532, no shell) as containers through testcontainers-go and checks what the
// manifests and docker-compose.yaml rely on: NATS serves JetStream with its store in /data, the
// workers start, print their configuration and run as the non-root user with nothing else in the
// image, and a run-watcher in a container becomes ready against NATS and the local cluster.
//
// internal/dockertest brings up the Docker engine (hack/docker/docker.sh installs docker.io and
// starts dockerd when none answers) and loads the images built from this checkout. Nothing is
// pulled: no registry is reachable here. The tests do not skip without Docker; they fail and say
// how to get it.
package containers

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
	tclog "github.com/testcontainers/testcontainers-go/log"
	"go.uber.org/goleak"

	"github.com/kubeclip/kubeclip/internal/dockertest"
)

func TestMain(m *testing.M) {
	// Ryuk, testcontainers' reaper, is an image on Docker Hub, which is not reachable; every test
	// terminates its containers itself (testcontainers.CleanupContainer).
	if err := os.Setenv("TESTCONTAINERS_RYUK_DISABLED", "true"); err != nil {
		fmt.Fprintln(os.Stderr, "containers:", err)
		os.Exit(1)
	}
	// Published ports are on this machine. Left to itself, testcontainers takes a machine with a
	// /.dockerenv for a container (these machines' image has one) and looks for published ports
	// at the gateway of Docker's default bridge network, else at the gateway of the default
	// route. A dockerd started for the first time on a machine (no docker0 yet) reports no
	// gateway for its bridge network, so every port check dialled the machine's router, which
	// drops the connection: on a fresh machine every test timed out, on the next run (docker0
	// left from the first) they passed.
	if _, set := os.LookupEnv("TESTCONTAINERS_HOST_OVERRIDE"); !set {
		if err := os.Setenv("TESTCONTAINERS_HOST_OVERRIDE", dockertest.PublishedHost); err != nil {
			fmt.Fprintln(os.Stderr, "containers:", err)
			os.Exit(1)
		}
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx := context.Background()
	engine, err := dockertest.Up(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "containers:", err)
		return 1
	}
	code := m.Run()
	if err := engine.Release(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "containers: releasing the Docker engine:", err)
		code = 1
	}
	// client-go keeps its HTTP/2 connection to the API server (clustertest.Config) for the
	// process; testcontainers closes its Docker clients.
	if err := goleak.Find(goleak.IgnoreAnyFunction("golang.org/x/net/http2.(*ClientConn).readLoop")); err != nil {
		fmt.Fprintln(os.Stderr, "containers: leaked goroutines:", err)
		code = 1
	}
	return code
}

// dockerClient is a client of the engine testcontainers uses, for what testcontainers.Container
// does not expose: the image's configuration and the container's processes.
func dockerClient(t *testing.T) *testcontainers.DockerClient {
	t.Helper()
	cli, err := testcontainers.NewDockerClientWithOpts(t.Context())
	if err != nil {
		t.Fatalf("connecting to Docker: %v", err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// imageUser is the user the image is configured to run as.
func imageUser(t *testing.T, cli *testcontainers.DockerClient, ref string) string {
	t.Helper()
	img, err := cli.ImageInspect(t.Context(), ref)
	if err != nil {
		t.Fatalf("inspecting image %s: %v", ref, err)
	}
	if img.Config == nil {
		t.Fatalf("image %s has no configuration", ref)
	}
	return img.Config.User
}

// processUIDs are the uids of the container's processes as the host sees them (docker top),
// which is what the image's user actually became, whatever the configuration says.
func processUIDs(t *testing.T, cli *testcontainers.DockerClient, id string) []string {
	t.Helper()
	top, err := cli.ContainerTop(t.Context(), id, client.ContainerTopOptions{Arguments: []string{"-o", "pid,uid,comm"}})
	if err != nil {
		t.Fatalf("listing the processes of container %s: %v", id, err)
	}
	col := slices.Index(top.Titles, "UID")
	if col < 0 {
		t.Fatalf("docker top of %s has no UID column: %q", id, top.Titles)
	}
	uids := make([]string, 0, len(top.Processes))
	for _, p := range top.Processes {
		uids = append(uids, p[col])
	}
	if len(uids) == 0 {
		t.Fatalf("container %s runs no process", id)
	}
	return uids
}

// wantUID fails t unless every process of the container runs as the images' non-root user.
func wantUID(t *testing.T, cli *testcontainers.DockerClient, id string) {
	t.Helper()
	for _, uid := range processUIDs(t, cli, id) {
		if uid != fmt.Sprint(dockertest.UID) {
			t.Errorf("a process of container %s runs as uid %s, want %d", id, uid, dockertest.UID)
		}
	}
}

// logs is everything the container wrote to stdout and stderr so far.
func logs(t *testing.T, ctr testcontainers.Container) string {
	t.Helper()
	out, err := readLogs(t.Context(), ctr)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// start runs the container and waits for req.WaitingFor; the container is terminated when t
// ends, and its logs are added to the output if t failed.
func start(t *testing.T, req testcontainers.ContainerRequest) testcontainers.Container {
	t.Helper()
	ctr, err := testcontainers.GenericContainer(t.Context(), testcontainers.GenericContainerRequest{
		ContainerRequest: req,
		Started:          true,
		Logger:           tclog.TestLogger(t),
	})
	testcontainers.CleanupContainer(t, ctr)
	// On error ctr may be nil, or a nil *DockerContainer when nothing was created.
	if ctr != nil && !reflect.ValueOf(ctr).IsNil() {
		t.Cleanup(func() { // before CleanupContainer's: last in, first out
			if t.Failed() {
				// t.Context() has ended by now.
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				out, err := readLogs(ctx, ctr)
				t.Logf("%s %s logs (%v):\n%s", req.Image, strings.Join(req.Cmd, " "), err, out)
			}
		})
	}
	if err != nil {
		t.Fatalf("starting %s %s: %v", req.Image, strings.Join(req.Cmd, " "), err)
	}
	return ctr
}

func readLogs(ctx context.Context, ctr testcontainers.Container) (string, error) {
	rc, err := ctr.Logs(ctx)
	if err != nil {
		return "", fmt.Errorf("reading the container's logs: %w", err)
	}
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		return string(data), fmt.Errorf("reading the container's logs: %w", err)
	}
	return string(data), nil
}

// endpoint is http://host:port of the container's port, as published on this host.
func endpoint(t *testing.T, ctr testcontainers.Container, port string) string {
	t.Helper()
	ep, err := ctr.PortEndpoint(t.Context(), port, "http")
	if err != nil {
		t.Fatalf("finding the published port %s: %v", port, err)
	}
	return ep
}

// get returns the status and body of a GET.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, strings.TrimSpace(string(body))
}
