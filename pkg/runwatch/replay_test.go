package runwatch

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// A replay whose pull comes back empty before the run's last chunk fails the load, which the
// step retries; it never takes the empty pull for the end of the log. It did once in 10,000
// resumes (bench-scale, Job leases): the cursor stayed empty, the chunk number said 1, and the
// follower published the run's three lines again as chunk 2.
func TestReplayNeverEndsShortOfTheLastChunk(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	ref := events.Ref(testCompany, "r1")
	lines := []events.LogLine{
		{TS: "2026-11-26T11:39:00.000000001Z", Text: "scale: agent started"},
		{TS: "2026-11-26T11:39:00.000000002Z", Text: "scale: working"},
	}
	h.publish(t, events.RunLogEvent{RunID: "r1", CompanyID: testCompany, Seq: 1, Pod: "p", Container: "c", Lines: lines})

	stream := &emptyFirstPull{runStream: h.stream}
	opts := journalOptions{subjects: events.Subjects{}, pub: h.pub, stream: stream, now: clock, interval: time.Hour}
	if j, err := loadJournal(ctx, ref, opts); err == nil {
		t.Fatalf("loading the journal through an empty pull = nil error with the cursor at %s; want an error", j.cursor().Time)
	}

	j, err := loadJournal(ctx, ref, opts) // the step's retry: this pull delivers
	if err != nil {
		t.Fatal(err)
	}
	want, err := time.Parse(time.RFC3339Nano, lines[1].TS)
	if err != nil {
		t.Fatal(err)
	}
	if got := j.cursor().Time; !got.Equal(want) || j.lastSeq() != 1 {
		t.Errorf("journal resumed at chunk %d with the cursor at %s, want chunk 1 and %s", j.lastSeq(), got, want)
	}
}

// emptyFirstPull is the run stream whose first pull of any consumer comes back empty, as a
// busy server's can.
type emptyFirstPull struct {
	runStream
	pulls int
}

func (s *emptyFirstPull) OrderedConsumer(ctx context.Context, cfg jetstream.OrderedConsumerConfig) (jetstream.Consumer, error) {
	c, err := s.runStream.OrderedConsumer(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &emptyFirstConsumer{Consumer: c, s: s}, nil
}

type emptyFirstConsumer struct {
	jetstream.Consumer
	s *emptyFirstPull
}

func (c *emptyFirstConsumer) Fetch(n int, opts ...jetstream.FetchOpt) (jetstream.MessageBatch, error) {
	if c.s.pulls++; c.s.pulls == 1 {
		return emptyBatch{}, nil
	}
	return c.Consumer.Fetch(n, opts...)
}

func (c *emptyFirstConsumer) FetchNoWait(n int) (jetstream.MessageBatch, error) {
	if c.s.pulls++; c.s.pulls == 1 {
		return emptyBatch{}, nil
	}
	return c.Consumer.FetchNoWait(n)
}

type emptyBatch struct{}

func (emptyBatch) Messages() <-chan jetstream.Msg {
	ch := make(chan jetstream.Msg)
	close(ch)
	return ch
}

func (emptyBatch) Error() error { return nil }
