// Package leasetest drives one lease the way Paperclip does, for the tests that run kubeclip as
// it is deployed (tests/deploy, tests/compose): publish an acquire for the agent stub, follow the
// run's events, release the lease, and check that what came back is a complete run; or acquire
// an exec-capable lease and run a command in its pod through the exec-workers (Exec).
package leasetest

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeclip/kubeclip/internal/pipelinetest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// StubLines is how many assistant lines the stub prints in Run.
const StubLines = 20

// Timeout bounds each step of a run on a loaded 2-core machine.
const Timeout = 2 * time.Minute

// NewID returns a fresh id usable as company, agent and run id.
func NewID(prefix string) string { return pipelinetest.NewID(prefix) }

// StubConfig is a Job-backend provider config whose adapter runs the agent stub.
func StubConfig() json.RawMessage {
	return pipelinetest.StubConfig(map[string]string{
		"STUB_LINES": fmt.Sprint(StubLines), "STUB_INTERVAL": "20ms", "STUB_SESSION_ID": "sess-deploy",
	})
}

// Result is what a lease produced.
type Result struct {
	Created  events.RunCreatedEvent
	Logs     []events.RunLogEvent
	Result   events.RunResultEvent
	Released events.RunReleasedEvent
}

// Run acquires a lease for a fresh company and agent, waits for its result, releases it and
// waits for the release receipt. It fails t when any step does not happen or the run did not
// succeed with every stub line. The tenant namespace is deleted when the test ends.
func Run(t *testing.T, js jetstream.JetStream, cs kubernetes.Interface) Result {
	t.Helper()
	subjects, err := events.NewSubjects("")
	if err != nil {
		t.Fatal(err)
	}
	company, agent, runID := NewID("co"), NewID("agent"), NewID("run")
	ns, err := policy.TenantNamespace(policy.DefaultConfig(), company)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
	})

	f := follow(t, js, subjects, company, runID)
	pub, err := events.NewPublisher(events.PublisherOptions{JS: js, Subjects: subjects})
	if err != nil {
		t.Fatal(err)
	}
	publish(t, pub, "acquire", events.AcquireRequest{
		RunID: runID, CompanyID: company, EnvironmentID: "deploy", AgentID: agent, Config: StubConfig(),
	})

	var res Result
	res.Created = wait[events.RunCreatedEvent](t, f)
	res.Result = wait[events.RunResultEvent](t, f)
	res.Logs = all[events.RunLogEvent](f)
	if res.Result.Outcome != events.OutcomeSucceeded || res.Result.ExitCode == nil || *res.Result.ExitCode != 0 {
		t.Fatalf("result = %+v, want succeeded with exit 0", res.Result)
	}
	if a := res.Result.Agent; a == nil || a.SessionID != "sess-deploy" {
		t.Errorf("result agent = %+v, want the stub's session", a)
	}
	if n := countLines(res.Logs); n < StubLines {
		t.Errorf("got %d assistant lines in %d log events, want %d", n, len(res.Logs), StubLines)
	}

	publish(t, pub, "release", events.ReleaseRequest{RunID: runID, CompanyID: company, ProviderLeaseID: res.Created.ProviderLeaseID})
	res.Released = wait[events.RunReleasedEvent](t, f)
	if res.Released.State != events.ReleaseStopped {
		t.Errorf("released = %+v, want stopped", res.Released)
	}
	return res
}

// publish publishes a lease request, bounded on its own: a release goes out after the run, which
// may take longer than a publish should.
func publish(t *testing.T, pub *events.Publisher, what string, req events.Event) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := pub.Publish(ctx, req); err != nil {
		t.Fatalf("publishing %s: %v", what, err)
	}
}

// follower collects a run's events.
type follower struct {
	mu     sync.Mutex
	events []events.Received
	cond   chan struct{}
}

func follow(t *testing.T, js jetstream.JetStream, s events.Subjects, company, run string) *follower {
	t.Helper()
	f := &follower{cond: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() {
		cancel()
		<-done
	})
	go func() {
		defer close(done)
		_ = events.Follow(ctx, js, s, company, run, events.FollowOptions{}, func(r events.Received) error {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.events = append(f.events, r)
			close(f.cond)
			f.cond = make(chan struct{})
			return nil
		})
	}()
	return f
}

func wait[T events.Event](t *testing.T, f *follower) T {
	t.Helper()
	deadline := time.After(Timeout)
	for {
		f.mu.Lock()
		cond := f.cond
		for _, r := range f.events {
			if failed, ok := r.Event.(events.RunFailedEvent); ok {
				f.mu.Unlock()
				t.Fatalf("run failed: %+v", failed)
			}
			if v, ok := r.Event.(T); ok {
				f.mu.Unlock()
				return v
			}
		}
		f.mu.Unlock()
		select {
		case <-cond:
		case <-deadline:
			var zero T
			t.Fatalf("no %T event within %s; events so far: %s", zero, Timeout, f.describe())
		}
	}
}

func all[T events.Event](f *follower) []T {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []T
	for _, r := range f.events {
		if v, ok := r.Event.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

func (f *follower) describe() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b strings.Builder
	for _, r := range f.events {
		data, _ := json.Marshal(r.Event)
		if len(data) > 200 {
			data = append(data[:200], "..."...)
		}
		fmt.Fprintf(&b, "\n  %T %s", r.Event, data)
	}
	return b.String()
}

// countLines counts the stub's assistant lines in the log events.
func countLines(logs []events.RunLogEvent) int {
	n := 0
	for _, ev := range logs {
		for _, l := range ev.Lines {
			if strings.Contains(l.Text, `"type":"assistant"`) {
				n++
			}
		}
	}
	return n
}
