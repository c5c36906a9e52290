package natsauth_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/internal/embeddednats"
	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
)

// shippedConfigs are the server configs kubeclip ships, each including nats-auth.conf.
var shippedConfigs = []string{
	"../../deploy/kustomize/base/nats.conf",
	"../../deploy/kustomize/overlays/production/nats.conf",
	"../../hack/compose/nats.conf",
}

// loadConfig parses a shipped server config as the server's pod has it: nats-auth.conf beside it
// (the kustomize ConfigMap, the compose mount), the users' passwords and the pod's name in the
// environment.
func loadConfig(t *testing.T, path string) *server.Options {
	t.Helper()
	dir := t.TempDir()
	routes := natstest.NewRouteTLS(t, filepath.Join(dir, "routes")) // the production overlay's route TLS
	for src, dst := range map[string]string{path: "nats.conf", natsAuthConf: "nats-auth.conf"} {
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		data = bytes.ReplaceAll(data, []byte(natstest.RouteTLSMount), []byte(routes.Dir+"/"))
		if err := os.WriteFile(filepath.Join(dir, dst), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	path = filepath.Join(dir, "nats.conf")
	natstest.SetAuthPasswords(t)
	t.Setenv("POD_NAME", "nats-0")
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("loading %s: %v", path, err)
	}
	return opts
}

// TestShippedConfigsRaiseDefaultMaxConsumers: nats-server refuses a stream's 1,001st consumer
// unless its config raises default_max_consumers (also for a stream with MaxConsumers -1). Every
// shipped config raises it to the test and demo servers' bound.
func TestShippedConfigsRaiseDefaultMaxConsumers(t *testing.T) {
	for _, path := range shippedConfigs {
		t.Run(filepath.Base(filepath.Dir(path)), func(t *testing.T) {
			if got := loadConfig(t, path).JetStreamLimits.DefaultMaxConsumers; got != embeddednats.DefaultMaxConsumers {
				t.Errorf("%s: default_max_consumers %d, want %d", path, got, embeddednats.DefaultMaxConsumers)
			}
		})
	}
}

// TestRunStreamTakes1100OrderedConsumers runs the base's server config (nats.conf and its
// nats-auth.conf): the workers create the run stream, and Paperclip's user opens 1,100 ordered
// consumers on it, one per run followed (the CLI's way; the plugin shares one among all the
// leases it waits on, docs/architecture.md, Following thousands of leases); the 1,001st was refused.
func TestRunStreamTakes1100OrderedConsumers(t *testing.T) {
	opts := loadConfig(t, shippedConfigs[0])
	opts.Host, opts.Port, opts.HTTPPort, opts.PidFile = "127.0.0.1", -1, 0, ""
	opts.NoLog, opts.NoSigs, opts.StoreDir = true, true, t.TempDir()
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	worker := connect(t, srv, "kubeclip")
	var s events.Subjects
	if err := events.EnsureStreams(t.Context(), worker.js, events.Options{}); err != nil {
		t.Fatal(err)
	}
	if err := lease.EnsureBuckets(t.Context(), worker.js, lease.BucketOptions{}); err != nil {
		t.Fatal(err)
	}
	client := connect(t, srv, "paperclip")
	for i := range 1100 {
		// What an ordered consumer asks for (nats.go and nats.js alike).
		_, err := client.js.CreateConsumer(t.Context(), s.RunStream(), jetstream.ConsumerConfig{
			FilterSubject: s.Prefix() + ".run.company.r" + strconv.Itoa(i) + ".>", DeliverPolicy: jetstream.DeliverAllPolicy,
			AckPolicy: jetstream.AckNonePolicy, MaxDeliver: 1, InactiveThreshold: time.Minute, MemoryStorage: true, Replicas: 1,
		})
		if err != nil {
			t.Fatalf("ordered consumer %d: %v", i+1, err)
		}
	}
}
