package dispatch

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
)

// TestResumeContextEndsWithItsLease pins resumeContext: a resume's wait ends within about
// resumeEndPoll once its lease's destroy began (the record releasing), and not while the lease
// lives on (here: released again and suspended, which a resume's own answer handles); its
// cancel returns once the poll stopped.
func TestResumeContextEndsWithItsLease(t *testing.T) {
	_, _, js := natstest.Start(t)
	if err := lease.EnsureBuckets(t.Context(), js, lease.BucketOptions{}); err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(t.Context(), lease.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	records := lease.Records{KV: kv}
	resuming := func(runID string) events.RunRef {
		t.Helper()
		rec := lease.Record{RunID: runID, CompanyID: "c1", State: lease.StateResuming, Reusable: true, Generation: 1,
			Namespace: "paperclip-c1", WorkloadName: "pc-" + runID, Backend: "pod", VolumeClaim: "pc-" + runID + "-data"}
		if _, _, err := records.Create(t.Context(), rec); err != nil {
			t.Fatal(err)
		}
		return rec.Ref()
	}

	t.Run("destroyed", func(t *testing.T) {
		ref := resuming("r-destroyed")
		ctx, cancel := resumeContext(t.Context(), records, ref, time.Minute)
		defer cancel()
		destroyed := time.Now()
		if _, err := records.Modify(t.Context(), ref, lease.BeginRelease(events.LeaseDestroy, false)); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(10 * resumeEndPoll):
			t.Fatalf("the resume's context still live %s after its lease's destroy began", 10*resumeEndPoll)
		}
		t.Logf("ended %s after the destroy began", time.Since(destroyed).Round(time.Millisecond))
		if cause := context.Cause(ctx); cause == nil || !strings.Contains(cause.Error(), "ended (releasing)") {
			t.Errorf("cause %v, want the lease ended (releasing)", cause)
		}
	})

	t.Run("live", func(t *testing.T) {
		ref := resuming("r-live")
		ctx, cancel := resumeContext(t.Context(), records, ref, time.Minute)
		for _, step := range []func(*lease.Record) (bool, error){lease.Release(time.Now(), true), lease.BeginSuspend(time.Now(), 0)} {
			if _, err := records.Modify(t.Context(), ref, step); err != nil {
				t.Fatal(err)
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the resume's context ended (%v) with its lease suspending, not ended", context.Cause(ctx))
		case <-time.After(4 * resumeEndPoll):
		}
		cancel()
		if !errors.Is(context.Cause(ctx), context.Canceled) {
			t.Errorf("cause after cancel %v, want context.Canceled", context.Cause(ctx))
		}
	})
}
