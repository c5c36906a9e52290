package events

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestClassify(t *testing.T) {
	backoff := func(attempt uint64) time.Duration { return time.Duration(attempt) * time.Second }
	bad := InvalidRequest("runId", "must not be empty")
	tests := []struct {
		name     string
		err      error
		attempt  uint64
		stopping bool
		// maxDeliver is the consumer's MaxDeliver; 0 means 8, the same as maxAttempts.
		maxDeliver int
		want       action
		wantDelay  time.Duration
		wantCode   Code
	}{
		{name: "success acks", err: nil, attempt: 1, want: actionAck},
		{name: "success on the last delivery acks", err: nil, attempt: 8, want: actionAck},
		{name: "success while stopping acks finished work", err: nil, attempt: 1, stopping: true, want: actionAck},
		{name: "terminal terms", err: bad, attempt: 1, want: actionTerm, wantCode: CodeInvalidRequest},
		{name: "wrapped terminal terms", err: fmt.Errorf("decoding: %w", bad), attempt: 2, want: actionTerm, wantCode: CodeInvalidRequest},
		{name: "retryable naks with backoff", err: errors.New("503"), attempt: 3, want: actionNak, wantDelay: 3 * time.Second},
		{name: "retryable while stopping naks at once", err: errors.New("503"), attempt: 3, stopping: true, want: actionNak},
		{name: "retryable on the last delivery is terminal", err: errors.New("503"), attempt: 8, want: actionTerm, wantCode: CodeInternal},
		{name: "interrupted on the last delivery is terminal", err: errShutdown, attempt: 8, stopping: true, want: actionTerm, wantCode: CodeInternal},
		{name: "deferred naks after its own delay", err: &RetryableError{Code: CodeAgentBusy, After: 7 * time.Second, Err: errors.New("agent busy")}, attempt: 2, want: actionNak, wantDelay: 7 * time.Second},
		{name: "deferred while stopping keeps its delay", err: &RetryableError{Code: CodeAgentBusy, After: 7 * time.Second, Err: errors.New("agent busy")}, attempt: 2, stopping: true, want: actionNak, wantDelay: 7 * time.Second},
		{name: "exhausted deferral fails with its code", err: &RetryableError{Code: CodeAgentBusy, After: time.Second, Err: errors.New("agent busy")}, attempt: 8, want: actionTerm, wantCode: CodeAgentBusy},
		{name: "exhausted retryable keeps its code", err: &RetryableError{Code: CodeBackendUnavailable, Err: errors.New("dial tcp: refused")}, attempt: 9, want: actionTerm, wantCode: CodeBackendUnavailable},
		{name: "deferral may use the raised MaxDeliver", err: &RetryableError{Code: CodeAgentBusy, After: time.Second, Err: errors.New("agent busy")}, attempt: 50, maxDeliver: 400, want: actionNak, wantDelay: time.Second},
		{name: "deferral ends at MaxDeliver", err: &RetryableError{Code: CodeAgentBusy, After: time.Second, Err: errors.New("agent busy")}, attempt: 400, maxDeliver: 400, want: actionTerm, wantCode: CodeAgentBusy},
		{name: "real failures still stop at MaxAttempts", err: errors.New("503"), attempt: 8, maxDeliver: 400, want: actionTerm, wantCode: CodeInternal},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			maxDeliver := tc.maxDeliver
			if maxDeliver == 0 {
				maxDeliver = 8
			}
			d := classify(tc.err, tc.attempt, 8, maxDeliver, backoff, tc.stopping)
			got := struct {
				Action action
				Delay  time.Duration
				Code   Code
			}{d.action, d.delay, ""}
			if d.terminal != nil {
				got.Code = d.terminal.Code
			}
			want := struct {
				Action action
				Delay  time.Duration
				Code   Code
			}{tc.want, tc.wantDelay, tc.wantCode}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestExponentialBackoffDoesNotOverflow: DefaultBackoff's doubling stops at its cap, whatever
// the attempt.
func TestExponentialBackoffDoesNotOverflow(t *testing.T) {
	if d := exponentialBackoff(time.Millisecond, time.Hour)(1000); d != time.Hour {
		t.Errorf("a large attempt must not overflow: got %s", d)
	}
}
