package natscluster

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/events"
)

// TestRunStreamTakesOverAThousandFollowers: clients that follow runs hold ordered consumers on the
// run stream (the Paperclip plugin now shares one per connection, plugins/paperclip/src/answers.ts;
// `kubeclip runs follow` and other clients hold one each), and nats-server refuses a stream's 1,001st consumer unless
// its config raises default_max_consumers, as the shipped configs do (the production overlay's
// cluster among them; natstest's cluster is configured the same way). On the 3-node cluster, the
// run stream at 3 replicas takes 1,100 followers.
func TestRunStreamTakesOverAThousandFollowers(t *testing.T) {
	const followers = 1100
	ctx := t.Context()
	cluster := natstest.StartCluster(t, 3)
	_, js := cluster.Connect(t)
	opts := events.Options{Replicas: 3, StoreBytes: natstest.ClusterStoreBytes}
	if err := events.EnsureStreams(ctx, js, opts); err != nil {
		t.Fatal(err)
	}
	subjects, _ := events.NewSubjects("")
	stream, err := js.Stream(ctx, subjects.RunStream())
	if err != nil {
		t.Fatal(err)
	}
	for i := range followers {
		// As the plugin follows a run: an ordered consumer filtered on the run's subjects.
		filter, err := subjects.RunFilter("co", fmt.Sprintf("run-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}, InactiveThreshold: 5 * time.Minute}); err != nil {
			t.Fatalf("follower %d: %v", i+1, err)
		}
	}
	// The stream's leader counts a consumer once the meta leader's assignment reached it: on a
	// loaded machine the last one may come a moment after its create was answered.
	var held int
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		info, err := stream.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if held = info.State.Consumers; held == followers || time.Now().After(deadline) {
			break
		}
	}
	if held != followers {
		t.Errorf("the run stream holds %d consumers, want %d", held, followers)
	}
}
