package dispatch

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/rs/zerolog"
)

// TestStepTimerSplitsTheAcquire: each step is the time since the previous one ended (the first
// since the timer started), the queue wait is counted from the message's stream timestamp, and
// the record carries them in milliseconds under logKeyTookMs, which tests/scale reads.
func TestStepTimerSplitsTheAcquire(t *testing.T) {
	base := time.Unix(1700000000, 0)
	clock := base
	now := func() time.Time { return clock }
	tm := newStepTimer(now, base.Add(-1500*time.Millisecond))
	clock = clock.Add(2 * time.Millisecond)
	tm.done(stepCheck)
	clock = clock.Add(250500 * time.Microsecond)
	tm.done(stepCreate)

	var buf bytes.Buffer
	log := zerolog.New(&buf)
	log.Info().Dict(logKeyTookMs, tm.dict()).Msg("run created")
	var got struct {
		Took map[string]float64 `json:"took_ms"`
	}
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{stepQueued: 1500, stepCheck: 2, stepCreate: 250.5}
	if diff := cmp.Diff(want, got.Took); diff != "" {
		t.Errorf("took_ms (-want +got):\n%s", diff)
	}

	// A message with no timestamp has no queue wait.
	if tm := newStepTimer(now, time.Time{}); len(tm.names) != 0 {
		t.Errorf("steps of a timer without a queue time = %v, want none", tm.names)
	}
}
