package events

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestSetupRetryable(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"unanswered request (no meta leader yet)", context.DeadlineExceeded, true},
		{"request timeout", nats.ErrTimeout, true},
		{"no responders", nats.ErrNoResponders, true},
		{"between servers", fmt.Errorf("creating: %w", nats.ErrConnectionReconnecting), true},
		{"temporarily unavailable", &jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}, true},
		{"insufficient resources while peers report", &jetstream.APIError{Code: 503, ErrorCode: 10023, Description: "insufficient resources"}, true},
		{"no suitable peers yet", &jetstream.APIError{Code: 400, ErrorCode: jsErrCodeClusterNoPeers, Description: "no suitable peers for placement"}, true},
		{"not enabled yet", jetstream.ErrJetStreamNotEnabled, true},
		{"replicas on a single server", &jetstream.APIError{Code: 500, ErrorCode: 10074, Description: "replicas > 1 not supported in non-clustered mode"}, false},
		{"invalid configuration", &jetstream.APIError{Code: 400, ErrorCode: 10052, Description: "stream configuration invalid"}, false},
		{"cancelled", context.Canceled, false},
		{"connection closed", nats.ErrConnectionClosed, false},
		{"anything else", errors.New("boom"), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := setupRetryable(tc.err); got != tc.want {
				t.Errorf("setupRetryable(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

func TestSettle(t *testing.T) {
	quick := setupRetry{attempt: time.Second, total: 200 * time.Millisecond, backoff: func(uint64) time.Duration { return 10 * time.Millisecond }}
	unavailable := &jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}
	terminal := &jetstream.APIError{Code: 500, ErrorCode: 10074, Description: "replicas > 1 not supported in non-clustered mode"}
	tests := []struct {
		name string
		// errs are the attempts' errors in turn; past the end, attempts fail with the last one.
		errs         []error
		wantErr      error
		wantAttempts int
	}{
		{name: "first attempt succeeds", errs: []error{nil}, wantAttempts: 1},
		{name: "succeeds once the cluster settles", errs: []error{context.DeadlineExceeded, unavailable, nil}, wantAttempts: 3},
		{name: "an error no wait fixes is returned at once", errs: []error{context.DeadlineExceeded, terminal}, wantErr: terminal, wantAttempts: 2},
		{name: "gives up after the bound with the last error", errs: []error{unavailable}, wantErr: unavailable, wantAttempts: -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			attempts := 0
			err := quick.settle(t.Context(), func(ctx context.Context) error {
				if _, ok := ctx.Deadline(); !ok {
					t.Error("an attempt has no deadline")
				}
				attempts++
				return tc.errs[min(attempts, len(tc.errs))-1]
			})
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Errorf("settle = %v, want %v", err, tc.wantErr)
			}
			if tc.wantAttempts > 0 && attempts != tc.wantAttempts {
				t.Errorf("%d attempts, want %d", attempts, tc.wantAttempts)
			}
			if tc.wantAttempts < 0 && attempts < 5 {
				t.Errorf("gave up after %d attempts, before its bound", attempts)
			}
		})
	}
}

// TestSettleStopsWithItsContext: a worker told to stop while it waits for the cluster stops.
func TestSettleStopsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	r := setupRetry{attempt: time.Second, total: time.Hour, backoff: func(uint64) time.Duration { return time.Hour }}
	done := make(chan error, 1)
	go func() {
		done <- r.settle(ctx, func(context.Context) error { return nats.ErrTimeout })
	}()
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("settle succeeded after its context ended")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("settle still waiting after its context ended")
	}
}

// flakyOpener answers its first fails lookups with a timeout, as a forming cluster does.
type flakyOpener struct {
	fails int
	calls int
}

func (f *flakyOpener) KeyValue(ctx context.Context, _ string) (jetstream.KeyValue, error) {
	f.calls++
	if f.calls <= f.fails {
		return nil, context.DeadlineExceeded
	}
	return nil, nil
}

func (f *flakyOpener) Stream(ctx context.Context, name string) (jetstream.Stream, error) {
	_, err := f.KeyValue(ctx, name)
	return nil, err
}

func (f *flakyOpener) CreateOrUpdateConsumer(ctx context.Context, stream string, _ jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	_, err := f.KeyValue(ctx, stream)
	return nil, err
}

// TestOpenersWaitForAFormingCluster: a worker's Run opens its buckets and streams and makes its
// consumers through lookups that are retried, not given up on the first unanswered one (a
// dispatcher exited so on a fresh 3-node cluster).
func TestOpenersWaitForAFormingCluster(t *testing.T) {
	for name, open := range map[string]func(*flakyOpener) error{
		"bucket": func(f *flakyOpener) error { _, err := OpenBucket(t.Context(), f, "B"); return err },
		"stream": func(f *flakyOpener) error { _, err := OpenStream(t.Context(), f, "S"); return err },
		"consumer": func(f *flakyOpener) error {
			_, err := EnsureConsumer(t.Context(), f, "S", jetstream.ConsumerConfig{Durable: "c"})
			return err
		},
	} {
		f := &flakyOpener{fails: 2}
		if err := open(f); err != nil || f.calls != 3 {
			t.Errorf("%s: %v after %d lookups, want success on the third", name, err, f.calls)
		}
	}
}
