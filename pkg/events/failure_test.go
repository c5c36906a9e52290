package events_test

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/events"
)

// TestFailureRefReadsRunIDStrictly pins that a lease request's failure is reported to the run
// its runId names only when the key is spelled exactly as the decoders read it: a case variant
// (`RUNID`, `runid`) or a repeated key names no run, since the request itself is refused for
// that key and a failure must never reach a run the request did not name the decoders' way.
// Only the top level is read: what a request holds deeper never hides its run.
func TestFailureRefReadsRunIDStrictly(t *testing.T) {
	const subject = "paperclip.lease.c1.acquire"
	tests := []struct {
		name    string
		data    string
		wantRun string
	}{
		{name: "exact key", data: `{"runId":"r1"}`, wantRun: "r1"},
		{name: "upper case key", data: `{"RUNID":"r1"}`},
		{name: "lower case key", data: `{"runid":"r1"}`},
		{name: "a dotless i makes another key", data: `{"runId":"r1","runıd":"r2"}`, wantRun: "r1"},
		{name: "case variant beside the key", data: `{"runId":"r1","RunId":"r2"}`},
		{name: "repeated key", data: `{"runId":"r1","runId":"r2"}`},
		{name: "repeated key nested elsewhere is fine", data: `{"runId":"r1","config":{"a":1}}`, wantRun: "r1"},
		{name: "not a string", data: `{"runId":7}`},
		{name: "malformed", data: `{"runId":"r1"`},
		{name: "config nested 5,000 deep", data: `{"runId":"r1","config":` + nested(5000) + `}`, wantRun: "r1"},
		{name: "repeated key inside config", data: `{"runId":"r1","config":{"a":1,"a":2}}`, wantRun: "r1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ref, kind := events.FailureRef(received{subject: subject, data: []byte(tc.data)})
			if want := events.Ref("c1", tc.wantRun); ref != want || kind != events.LeaseAcquire {
				t.Errorf("FailureRef(%.80s) = %+v, %q; want %+v, %q", tc.data, ref, kind, want, events.LeaseAcquire)
			}
		})
	}
}

// nested is an object nested depth levels deep.
func nested(depth int) string {
	return strings.Repeat(`{"a":`, depth) + `1` + strings.Repeat(`}`, depth)
}

// TestTooDeepRequestIsAnswered is issue 26's "a request nested too deep gets no answer": an
// acquire whose config nests 5,000 objects deep, with valid top-level ids, is refused by the
// decoder for its depth, and its run hears `failed` naming the field; a payload whose run id is
// invalid still gets no event, and that is logged.
func TestTooDeepRequestIsAnswered(t *testing.T) {
	_, _, js := natstest.Start(t)
	ctx := t.Context()
	if err := events.EnsureStreams(ctx, js, events.Options{}); err != nil {
		t.Fatal(err)
	}
	var s events.Subjects
	cons, err := js.CreateOrUpdateConsumer(ctx, s.LeaseStream(), events.TenantWorkerConsumerConfig(s))
	if err != nil {
		t.Fatal(err)
	}
	p := newPublisher(t, js)
	var logs syncBuffer
	log := zerolog.New(zerolog.MultiLevelWriter(&logs, zerolog.NewTestWriter(t)))
	startConsume(t, cons, func(ctx context.Context, m jetstream.Msg) error {
		_, err := s.DecodeAcquire(m.Subject(), m.Data())
		return err
	}, events.ConsumeOptions{
		Logger: log,
		OnTerminal: func(ctx context.Context, m jetstream.Msg, te *events.TerminalError) error {
			return events.PublishFailure(ctx, p, log, m, te)
		},
	})

	deep := `{"runId":"r1","companyId":"c1","environmentId":"e","agentId":"a","config":` + nested(5000) + `}`
	if _, err := js.Publish(ctx, "paperclip.lease.c1.acquire", []byte(deep)); err != nil {
		t.Fatal(err)
	}
	invalid := `{"runId":"no such run!","companyId":"c1","config":` + nested(5000) + `}`
	if _, err := js.Publish(ctx, "paperclip.lease.c1.acquire", []byte(invalid)); err != nil {
		t.Fatal(err)
	}

	var failed events.RunFailedEvent
	fctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	err = events.Follow(fctx, js, s, "c1", "r1", events.FollowOptions{}, func(r events.Received) error {
		if f, ok := r.Event.(events.RunFailedEvent); ok {
			failed = f
			return events.ErrStopFollowing
		}
		return nil
	})
	if err != nil {
		t.Fatalf("no failed event for run r1: %v", err)
	}
	if failed.Code != events.CodeInvalidRequest || !strings.HasPrefix(failed.Field, "config.a.a") || !strings.Contains(failed.Message, "nested more than 64 levels deep") {
		t.Errorf("failed event = code %s, field %.40s…, message %.80s…", failed.Code, failed.Field, failed.Message)
	}
	eventually(t, "both requests termed", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.AckFloor.Stream == 2 && info.NumAckPending == 0
	})
	if !strings.Contains(logs.String(), "request names no valid run; its failure cannot be reported") {
		t.Error("the request with an invalid run id was not logged as unreportable")
	}
	runs, err := js.Stream(ctx, s.RunStream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := runs.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Errorf("the run stream holds %d events, want 1 (r1's failed)", info.State.Msgs)
	}
}

// syncBuffer is a bytes.Buffer a logger may write from several goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
