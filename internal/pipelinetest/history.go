package pipelinetest

import (
	"context"
	"fmt"
	"slices"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// History reads a run's events from the run stream, from its first event to the last one
// stored when it got there, the way a Paperclip that restarted rebuilds a run. ctx bounds it:
// a run with no event at all is waited for until ctx ends.
func History(ctx context.Context, env *Env, companyID, runID string) ([]events.Received, error) {
	var out []events.Received
	err := events.Follow(ctx, env.JS, env.Subjects, companyID, runID, events.FollowOptions{}, func(r events.Received) error {
		out = append(out, r)
		if r.Pending == 0 {
			return events.ErrStopFollowing
		}
		return nil
	})
	if err != nil {
		return out, fmt.Errorf("replaying run %s: %w", runID, err)
	}
	return out, nil
}

// Want is what a finished run's history must show.
type Want struct {
	// Lines is the stub's STUB_LINES: "stub line 1" … "stub line <Lines>", each exactly once
	// and in order.
	Lines int
	// Outcome is the result's outcome (default succeeded).
	Outcome events.Outcome
}

// CheckHistory checks a run's events in stream order against the contract and want, and
// returns every violation (none: nil):
//   - every message decodes;
//   - exactly one created and exactly one result, with want's outcome;
//   - log seq counts 1, 2, 3, … without gaps or repeats, in stream order;
//   - every stub line 1..want.Lines exactly once, in order;
//   - no log event after the result.
func CheckHistory(evs []events.Received, want Want) []string {
	if want.Outcome == "" {
		want.Outcome = events.OutcomeSucceeded
	}
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	created, results := 0, 0
	var logs []events.RunLogEvent
	for i, r := range evs {
		switch ev := r.Event.(type) {
		case nil:
			add("event #%d (%s) does not decode: %v", r.StreamSeq, r.Subject, r.Err)
		case events.RunCreatedEvent:
			created++
		case events.RunResultEvent:
			results++
			if ev.Outcome != want.Outcome {
				add("result #%d: outcome %s (reason %q, %s), want %s", r.StreamSeq, ev.Outcome, ev.Reason, ev.Message, want.Outcome)
			}
		case events.RunLogEvent:
			if results > 0 {
				add("log seq %d (event #%d) stored after the result", ev.Seq, r.StreamSeq)
			}
			if want := uint64(len(logs) + 1); ev.Seq != want {
				add("log event %d in stream order (#%d) has seq %d, want %d", len(logs)+1, evs[i].StreamSeq, ev.Seq, want)
			}
			logs = append(logs, ev)
		case events.RunFailedEvent:
			add("failed event #%d: %s %s", r.StreamSeq, ev.Code, ev.Message)
		}
	}
	if created != 1 {
		add("%d created events, want 1", created)
	}
	if results != 1 {
		add("%d result events, want 1", results)
	}
	if got := StubLines(logs); !slices.Equal(got, WantStubLines(want.Lines)) {
		add("stub lines: %s", lineDiff(got, want.Lines))
	}
	return problems
}

// lineDiff summarises how got differs from stub lines 1..n: missing, repeated, out of order.
func lineDiff(got []string, n int) string {
	count := map[string]int{}
	for _, l := range got {
		count[l]++
	}
	var missing, repeated []int
	for i, l := range WantStubLines(n) {
		switch c := count[l]; {
		case c == 0:
			missing = append(missing, i+1)
		case c > 1:
			repeated = append(repeated, i+1)
		}
	}
	s := fmt.Sprintf("got %d lines, want %d", len(got), n)
	if len(missing) > 0 {
		s += fmt.Sprintf("; missing %v", missing)
	}
	if len(repeated) > 0 {
		s += fmt.Sprintf("; repeated %v", repeated)
	}
	if len(missing) == 0 && len(repeated) == 0 {
		s += "; out of order"
	}
	return s
}
