package containers

import (
	"bytes"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/kubeclip/kubeclip/internal/dockertest"
)

// natsArgs are the NATS image's arguments in docker-compose.yaml: JetStream with its file store
// in /data, the directory the image creates for the non-root user.
var natsArgs = []string{"--jetstream", "--store_dir", "/data", "--http_port", "8222", "--server_name", "kubeclip-containers"}

// startNATS runs the NATS image, ready for clients on its published port 4222; customize adds
// to the request (networks).
func startNATS(t *testing.T, customize func(*testcontainers.ContainerRequest)) testcontainers.Container {
	t.Helper()
	req := testcontainers.ContainerRequest{
		Image:        dockertest.Image("nats"),
		Cmd:          natsArgs,
		ExposedPorts: []string{"4222/tcp"},
		WaitingFor: wait.ForAll(
			wait.ForLog("Server is ready"),
			// The image has no shell for testcontainers' check from inside; dialling the
			// published port from here is the check that matters.
			wait.ForListeningPort("4222/tcp").SkipInternalCheck(),
		).WithDeadline(time.Minute),
	}
	if customize != nil {
		customize(&req)
	}
	return start(t, req)
}

// connectNATS connects to the container's published client port.
func connectNATS(t *testing.T, ctr testcontainers.Container) jetstream.JetStream {
	t.Helper()
	url, err := ctr.PortEndpoint(t.Context(), "4222/tcp", "nats")
	if err != nil {
		t.Fatalf("finding NATS's published port: %v", err)
	}
	nc, err := nats.Connect(url, nats.Name(t.Name()))
	if err != nil {
		t.Fatalf("connecting to %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func TestNATSImageServesJetStream(t *testing.T) {
	ctx := t.Context()
	ctr := startNATS(t, nil)
	cli := dockerClient(t)

	// Non-root: configured so, and so it runs.
	info, err := ctr.Inspect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.User != dockertest.User {
		t.Errorf("container user %q, want %q", info.Config.User, dockertest.User)
	}
	wantUID(t, cli, ctr.GetContainerID())

	// The published port is reached on this machine (TestMain), whatever Docker's networks say.
	if host, err := ctr.Host(ctx); err != nil || host != dockertest.PublishedHost {
		t.Errorf("published ports are looked for on %q (%v), want %s", host, err, dockertest.PublishedHost)
	}

	js := connectNATS(t, ctr)
	const stream = "CONTAINERS"
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:     stream,
		Subjects: []string{"containers.>"},
		Storage:  jetstream.FileStorage,
	})
	if err != nil {
		t.Fatalf("creating stream %s: %v", stream, err)
	}
	if got := s.CachedInfo().Config.Storage; got != jetstream.FileStorage {
		t.Fatalf("stream storage %v, want file", got)
	}
	want := []string{"first message from the test", "second message from the test", "third message from the test"}
	for _, m := range want {
		if _, err := js.Publish(ctx, "containers.test", []byte(m)); err != nil {
			t.Fatalf("publishing %q: %v", m, err)
		}
	}

	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(len(want), jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for m := range batch.Messages() {
		got = append(got, string(m.Data()))
	}
	if err := batch.Error(); err != nil {
		t.Fatalf("reading the stream back: %v", err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("messages read back (-want +got):\n%s", diff)
	}

	// The messages are in /data, the store docker-compose.yaml mounts its volume on: the first
	// message block of the stream in the global account ($G). The server writes blocks from its
	// cache shortly after a publish, so wait for the file to hold every message.
	block := "/data/jetstream/$G/streams/" + stream + "/msgs/1.blk"
	err = wait.ForFile(block).
		WithStartupTimeout(30*time.Second).
		WithPollInterval(200*time.Millisecond).
		WithMatcher(func(r io.Reader) error {
			data, err := io.ReadAll(r)
			if err != nil {
				return err
			}
			for _, m := range want {
				if !bytes.Contains(data, []byte(m)) {
					return fmt.Errorf("%s has no %q yet", block, m)
				}
			}
			return nil
		}).
		WaitUntilReady(ctx, ctr)
	if err != nil {
		t.Errorf("stream data in /data: %v", err)
	}
}
