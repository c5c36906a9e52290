package events_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/events"
)

// TestResultPublishedLooksPastForeignMessages: what JetStream stores on a run's result subject
// for a client that named it as a reply (a publish ack, an API answer: no kubeclip header) is
// not a result; kubeclip's result is found before and after such messages.
func TestResultPublishedLooksPastForeignMessages(t *testing.T) {
	_, nc, js := natstest.Start(t)
	ctx := t.Context()
	opts := events.Options{}
	if err := events.EnsureStreams(ctx, js, opts); err != nil {
		t.Fatal(err)
	}
	runs, err := js.Stream(ctx, "PAPERCLIP_RUNS")
	if err != nil {
		t.Fatal(err)
	}
	subjects := events.Subjects{}
	ref := events.Ref("victim", "r1")
	subj, err := subjects.Run(ref.CompanyID, ref.RunID, events.KindResult)
	if err != nil {
		t.Fatal(err)
	}
	published := func() bool {
		t.Helper()
		ok, err := events.ResultPublished(ctx, runs, subjects, ref)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if published() {
		t.Fatal("a result before any was published")
	}
	// The deputy: a client publishes a lease request with the victim's result subject as its
	// reply, and an API request likewise; JetStream stores its answers there.
	if err := nc.PublishRequest("paperclip.lease.attacker.release", subj, []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishRequest("$JS.API.INFO", subj, nil); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		info, err := runs.Info(ctx, jetstream.WithSubjectFilter(subj))
		if err == nil && info.State.Subjects[subj] == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("JetStream's answers were not stored on %s: %v", subj, err)
		}
	}
	if published() {
		t.Error("JetStream's answers on the result subject were taken for kubeclip's result")
	}
	pub, err := events.NewPublisher(events.PublisherOptions{JS: js})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(ctx, events.RunResultEvent{RunID: ref.RunID, CompanyID: ref.CompanyID, Outcome: events.OutcomeSucceeded}); err != nil {
		t.Fatal(err)
	}
	if !published() {
		t.Error("kubeclip's result behind foreign messages was not found")
	}
	// A follower of the run sees kubeclip's result only.
	var seen []events.Received
	err = events.Follow(ctx, js, subjects, ref.CompanyID, ref.RunID, events.FollowOptions{}, func(r events.Received) error {
		seen = append(seen, r)
		return events.ErrStopFollowing
	})
	if err != nil || len(seen) != 1 || seen[0].Err != nil {
		t.Fatalf("following the run: %v, %+v", err, seen)
	}
	if _, ok := seen[0].Event.(events.RunResultEvent); !ok {
		t.Errorf("the follower's first event is %T, want kubeclip's result", seen[0].Event)
	}
}

// TestResultPublishedTakesNoCopy: JetStream's answer to a direct get of another run's result,
// stored on this run's result subject (a client of the single account of issue 15 named it as
// its reply: issue 26, item 5), carries the result's ce-type but is not this run's result.
func TestResultPublishedTakesNoCopy(t *testing.T) {
	_, nc, js := natstest.Start(t)
	ctx := t.Context()
	if err := events.EnsureStreams(ctx, js, events.Options{}); err != nil {
		t.Fatal(err)
	}
	runs, err := js.Stream(ctx, "PAPERCLIP_RUNS")
	if err != nil {
		t.Fatal(err)
	}
	subjects := events.Subjects{}
	ref := events.Ref("victim", "r1")
	subj, err := subjects.Run(ref.CompanyID, ref.RunID, events.KindResult)
	if err != nil {
		t.Fatal(err)
	}
	// Another company's result as kubeclip stores it (past the duplicate window, without the
	// message id a copy would share with it).
	other := nats.NewMsg("paperclip.run.other.r2.result")
	other.Header.Set(events.HeaderType, events.EncodeHeaderValue(events.RunResultEvent{}.Type()))
	other.Data = []byte(`{"runId":"r2","companyId":"other","outcome":"failed"}`)
	ack, err := js.PublishMsg(ctx, other)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishRequest("$JS.API.DIRECT.GET.PAPERCLIP_RUNS", subj, []byte(`{"seq":`+strconv.FormatUint(ack.Sequence, 10)+`}`)); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		info, err := runs.Info(ctx, jetstream.WithSubjectFilter(subj))
		if err == nil && info.State.Subjects[subj] == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("JetStream's answer was not stored on %s: %v", subj, err)
		}
	}
	if ok, err := events.ResultPublished(ctx, runs, subjects, ref); err != nil || ok {
		t.Errorf("a copy of another run's result on %s: published %v, %v; want not", subj, ok, err)
	}
}
