package main

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/kubeclip/kubeclip/pkg/events"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// A reusable lease answers every release and resume under the run that acquired it: (n) must
// tell the answers apart by the id each request named itself with, not take the run's first.
func TestCollectorTellsALeaseAnswersApart(t *testing.T) {
	const run, company = "run-1", "co-1"
	t0 := time.Date(2026, 11, 26, 3, 0, 0, 0, time.UTC)
	c := newCollector()
	c.record(events.RunReleasedEvent{RunID: run, CompanyID: company, State: events.ReleaseStopped, ReleaseID: "rel-1"}, t0)
	c.record(events.RunResumedEvent{RunID: run, CompanyID: company, From: events.ResumedFromRetained, Resumes: 1, ResumeID: "res-1"}, t0.Add(1*time.Second))
	c.record(events.RunReleasedEvent{RunID: run, CompanyID: company, State: events.ReleaseStopped, ReleaseID: "rel-2"}, t0.Add(2*time.Second))
	c.record(events.RunResumedEvent{RunID: run, CompanyID: company, From: events.ResumedFromSuspended, Generation: 1, Resumes: 2, ResumeID: "res-2"}, t0.Add(3*time.Second))
	// A repeated answer (a redelivered request) keeps the first one's time.
	c.record(events.RunResumedEvent{RunID: run, CompanyID: company, From: events.ResumedFromSuspended, Generation: 1, Resumes: 2, ResumeID: "res-2"}, t0.Add(9*time.Second))
	c.record(events.RunReleasedEvent{RunID: run, CompanyID: company, State: events.ReleaseDestroyed}, t0.Add(4*time.Second))

	tests := []struct {
		name string
		key  answerKey
		want answer
	}{
		{"first release", answerKey{run, events.KindReleased, "rel-1"}, answer{at: t0}},
		{"live resume", answerKey{run, events.KindResumed, "res-1"}, answer{at: t0.Add(1 * time.Second), from: events.ResumedFromRetained}},
		{"second release", answerKey{run, events.KindReleased, "rel-2"}, answer{at: t0.Add(2 * time.Second)}},
		{"suspended resume, first answer", answerKey{run, events.KindResumed, "res-2"}, answer{at: t0.Add(3 * time.Second), from: events.ResumedFromSuspended}},
		{"destroy (names no release)", answerKey{run, events.KindReleased, ""}, answer{at: t0.Add(4 * time.Second)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			got, err := c.answer(ctx, tc.key)
			if err != nil {
				t.Fatalf("answer(%+v): %v", tc.key, err)
			}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(answer{})); diff != "" {
				t.Errorf("answer(%+v) (-want +got):\n%s", tc.key, diff)
			}
		})
	}

	t.Run("a resume not answered yet is waited for", func(t *testing.T) {
		key := answerKey{run, events.KindResumed, "res-3"}
		done := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			_, err := c.answer(ctx, key)
			done <- err
		}()
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel()
		if _, err := c.answer(ctx, key); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("answer before the resumed event: %v, want %v", err, context.DeadlineExceeded)
		}
		c.record(events.RunResumedEvent{RunID: run, CompanyID: company, From: events.ResumedFromRetained, Resumes: 3, ResumeID: "res-3"}, t0.Add(5*time.Second))
		if err := <-done; err != nil {
			t.Fatalf("answer after the resumed event: %v", err)
		}
	})

	t.Run("a failed request ends the wait", func(t *testing.T) {
		c.record(events.RunFailedEvent{RunID: "run-2", CompanyID: company, Code: events.CodeLeaseNotFound, Request: events.LeaseResume, RequestID: "res-4"}, t0)
		_, err := c.answer(t.Context(), answerKey{"run-2", events.KindResumed, "res-4"})
		if !errors.Is(err, errRunFailed) {
			t.Fatalf("answer after failed: %v, want %v", err, errRunFailed)
		}
	})
}

// (o) tells hits from misses by the created event's warm, as it arrives on the run stream.
func TestCollectorRecordsWarm(t *testing.T) {
	s, err := events.NewSubjects("")
	if err != nil {
		t.Fatal(err)
	}
	c := newCollector()
	for run, payload := range map[string]string{
		"run-hit":  `{"runId":"run-hit","companyId":"co-1","at":"2026-11-26T03:00:00Z","providerLeaseId":"pc-1","namespace":"ns","workloadName":"pc-1","secretName":"pc-1","backend":"pod","phase":"Running","warm":true}`,
		"run-miss": `{"runId":"run-miss","companyId":"co-1","at":"2026-11-26T03:00:00Z","providerLeaseId":"pc-2","namespace":"ns","workloadName":"pc-2","secretName":"pc-2","backend":"pod","phase":"Pending"}`,
	} {
		subject, err := s.Run("co-1", run, events.KindCreated)
		if err != nil {
			t.Fatal(err)
		}
		ev, err := s.DecodeRunEvent(subject, []byte(payload))
		if err != nil {
			t.Fatalf("decoding %s's created event: %v", run, err)
		}
		c.record(ev, time.Now())
	}
	if hit, miss := c.snapshot("run-hit"), c.snapshot("run-miss"); !hit.warm || miss.warm || hit.lease != "pc-1" {
		t.Errorf("warm: hit %t (lease %s), miss %t; want the created events' true and absent", hit.warm, hit.lease, miss.warm)
	}
}
