package events_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/events"
)

// benchLogEvent is a log event of one stub-like assistant line, as bench (h) publishes them.
func benchLogEvent(runID string, seq uint64) events.RunLogEvent {
	return events.RunLogEvent{
		RunID: runID, CompanyID: "c1", At: fixedNow, Seq: seq, Pod: "pod-" + runID, Container: "agent",
		Lines: []events.LogLine{{TS: ts, Text: fmt.Sprintf(`{"type":"assistant","session_id":"session-01","message":{"id":"msg_%d","content":[{"type":"text","text":"stub line %d"}]}}`, seq, seq)}},
	}
}

// BenchmarkDecodeRunEvent decodes one single-line log event: what Follow pays per event on top
// of reading the message.
func BenchmarkDecodeRunEvent(b *testing.B) {
	_, _, js := natstest.Start(b)
	p, err := events.NewPublisher(events.PublisherOptions{JS: js, Now: clock})
	if err != nil {
		b.Fatal(err)
	}
	m, err := p.Msg(benchLogEvent("r1", 1))
	if err != nil {
		b.Fatal(err)
	}
	s := events.Subjects{}
	b.SetBytes(int64(len(m.Data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.DecodeRunEvent(m.Subject, m.Data); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReplay reads a run of replayEvents single-line log events from its first event until
// caught up, with events.Follow (decoding included) and with a bare ordered consumer (no
// decoding), as bench (h) does; ev/s is the figure (h) reports.
func BenchmarkReplay(b *testing.B) {
	const replayEvents = 20_000
	_, _, js := natstest.Start(b)
	ctx := b.Context()
	if err := events.EnsureStreams(ctx, js, events.Options{}); err != nil {
		b.Fatal(err)
	}
	p, err := events.NewPublisher(events.PublisherOptions{JS: js, Now: clock})
	if err != nil {
		b.Fatal(err)
	}
	for i := range uint64(replayEvents) {
		m, err := p.Msg(benchLogEvent("r1", i+1))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := js.PublishMsgAsync(m); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		b.Fatal("the run's events were not all stored within a minute")
	}
	s := events.Subjects{}
	b.Run("follow", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			n := 0
			err := events.Follow(ctx, js, s, "c1", "r1", events.FollowOptions{}, func(r events.Received) error {
				if r.Err != nil {
					return r.Err
				}
				n++
				if r.Pending == 0 {
					return events.ErrStopFollowing
				}
				return nil
			})
			if err != nil || n != replayEvents {
				b.Fatalf("Follow = %v after %d events, want nil after %d", err, n, replayEvents)
			}
		}
		b.ReportMetric(float64(b.N*replayEvents)/b.Elapsed().Seconds(), "ev/s")
	})
	b.Run("bare", func(b *testing.B) {
		filter, err := s.RunFilter("c1", "r1")
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if n := bareReplay(ctx, b, js, filter); n != replayEvents {
				b.Fatalf("bare replay read %d messages, want %d", n, replayEvents)
			}
		}
		b.ReportMetric(float64(b.N*replayEvents)/b.Elapsed().Seconds(), "ev/s")
	})
}

// bareReplay reads filter's messages with an ordered consumer until caught up, parsing each
// message's metadata and nothing else, and returns how many it read.
func bareReplay(ctx context.Context, b *testing.B, js jetstream.JetStream, filter string) int {
	cons, err := js.OrderedConsumer(ctx, events.Subjects{}.RunStream(), jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{filter}, DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		b.Fatal(err)
	}
	it, err := cons.Messages()
	if err != nil {
		b.Fatal(err)
	}
	defer it.Stop()
	for n := 1; ; n++ {
		m, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			b.Fatal(err)
		}
		meta, err := m.Metadata()
		if err != nil {
			b.Fatal(err)
		}
		if meta.NumPending == 0 {
			return n
		}
	}
}
