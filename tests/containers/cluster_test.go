package containers

import (
	"io"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/network"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	"github.com/kubeclip/kubeclip/internal/dockertest"
	"github.com/kubeclip/kubeclip/pkg/events"
)

// ready is the run-watcher's /readyz body once it is connected to NATS and the API server
// answers, and its self-check found every permission it needs.
const ready = "ok nats\nok kubernetes\nok permissions\n"

func TestRunWatcherContainerAgainstCluster(t *testing.T) {
	clustertest.Config(t) // fails with instructions when no cluster answers
	ctx := t.Context()

	// One network for both containers, so that the run-watcher finds NATS by name, as in
	// docker-compose.yaml.
	nw, err := network.New(ctx)
	testcontainers.CleanupNetwork(t, nw)
	if err != nil {
		t.Fatalf("creating a Docker network: %v", err)
	}
	nats := startNATS(t, func(req *testcontainers.ContainerRequest) {
		req.Networks = []string{nw.Name}
		req.NetworkAliases = map[string][]string{nw.Name: {"nats"}}
	})

	// The kubeconfig is bind-mounted read-only, as in docker-compose.yaml.
	kubeconfig := dockertest.Kubeconfig(t)
	start(t, testcontainers.ContainerRequest{
		Image:    dockertest.Image("run-watcher"),
		Networks: []string{nw.Name},
		Env: map[string]string{
			"KUBECLIP_NATS_URL":   "nats://nats:4222",
			"KUBECLIP_KUBECONFIG": "/etc/kubeclip/kubeconfig",
		},
		Cmd:          []string{"--ops-addr", ":8080"},
		ExposedPorts: []string{"8080/tcp"},
		HostConfigModifier: func(hc *container.HostConfig) {
			hc.Binds = append(hc.Binds, kubeconfig+":/etc/kubeclip/kubeconfig:ro")
		},
		// Ready: connected to NATS and the API server answers, through the container's network.
		WaitingFor: wait.ForHTTP("/readyz").WithPort("8080/tcp").
			WithResponseMatcher(func(body io.Reader) bool {
				b, err := io.ReadAll(body)
				return err == nil && string(b) == ready
			}).
			WithStartupTimeout(2 * time.Minute),
	})

	// Ready means it set up the run stream on the NATS server it reached through the network.
	subjects, err := events.NewSubjects(events.DefaultPrefix)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := connectNATS(t, nats).Stream(ctx, subjects.RunStream()); err != nil {
		t.Errorf("stream %s on the NATS container: %v", subjects.RunStream(), err)
	}
}
