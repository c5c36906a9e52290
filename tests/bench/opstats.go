package main

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/util/flowcontrol"
)

// opStats records how long the workers' operations take, per component and kind of operation:
// Kubernetes requests (send → response headers, so without client-side throttling), the wait
// for the client-side rate limiter, and JetStream publishes and KV operations. It is the
// bench's view into the pipeline, from the outside: transport, rate limiter and JetStream
// wrappers around what the workers are given.
type opStats struct {
	mu  sync.Mutex
	ops map[op]*samples
	// marks holds, per run, when a worker first did something with it (markLeaseRead,
	// markCreatedPublished), to split a stage into queueing and handling.
	marks map[mark]time.Time
}

// mark is one per-run event seen by a wrapper.
type mark struct {
	what  string
	runID string
}

// Per-run marks.
const (
	// markLeaseRead: the dispatcher read the run's lease record, the first thing its dispatch
	// handler does: the message left the queue.
	markLeaseRead = "lease read"
	// markPublishing + kind: a worker's publish of the run's first event of kind (created,
	// result) began; markPublished + kind: it returned.
	markPublishing = "publishing "
	markPublished  = "published "
	// markCreatedPublished: the dispatcher's publish of the created event returned.
	markCreatedPublished = markPublished + "created"
)

// op names a kind of operation: {"dispatcher", "API", "POST jobs"}.
type op struct {
	component string
	kind      string // API, throttle, NATS
	what      string
}

func newOpStats() *opStats { return &opStats{ops: map[op]*samples{}, marks: map[mark]time.Time{}} }

// mark notes the first time what happened to runID.
func (o *opStats) mark(what, runID string, at time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	k := mark{what, runID}
	if _, ok := o.marks[k]; !ok {
		o.marks[k] = at
	}
}

// marked returns when what first happened to runID.
func (o *opStats) marked(what, runID string) (time.Time, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	t, ok := o.marks[mark{what, runID}]
	return t, ok
}

// record adds one operation; a failed one (a KV get of a missing key, say) took its time too,
// so it counts in the durations and in the errors.
func (o *opStats) record(k op, d time.Duration, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	s, ok := o.ops[k]
	if !ok {
		s = &samples{}
		o.ops[k] = s
	}
	s.d = append(s.d, d)
	if err != nil {
		s.errs++
	}
}

// reset forgets the operations recorded so far (between phases); marks stay.
func (o *opStats) reset() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ops = map[op]*samples{}
}

// rows returns one row per kind of operation recorded since the last reset, by component and
// kind, most frequent first. Throttle waits under a millisecond are left out as noise.
func (o *opStats) rows(phase string) []breakdownRow {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]breakdownRow, 0, len(o.ops))
	for k, s := range o.ops {
		if k.kind == "throttle" && (s.p99() == nil || *s.p99() < 1) {
			continue
		}
		out = append(out, stageRow(phase, k.kind+" "+k.component+" "+k.what, *s))
	}
	slices.SortFunc(out, func(x, y breakdownRow) int {
		if c := kindRank(x.What) - kindRank(y.What); c != 0 {
			return c
		}
		if x.N != y.N {
			return y.N - x.N
		}
		return strings.Compare(x.What, y.What)
	})
	return out
}

// combined returns the durations of every operation of kind and what recorded since the last
// reset by components whose name starts with component ("dispatcher" covers its replicas).
func (o *opStats) combined(kind, component, what string) samples {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out samples
	for k, s := range o.ops {
		if k.kind == kind && k.what == what && strings.HasPrefix(k.component, component) {
			out.d = append(out.d, s.d...)
			out.errs += s.errs
		}
	}
	return out
}

// kindRank orders breakdown rows: Kubernetes requests, then throttling, then NATS.
func kindRank(what string) int {
	switch {
	case strings.HasPrefix(what, "API "):
		return 0
	case strings.HasPrefix(what, "throttle "):
		return 1
	default:
		return 2
	}
}

// wrapTransport returns a transport wrapper (rest.Config.Wrap) timing component's requests.
// Watches are left out: they last as long as the informer.
func (o *opStats) wrapTransport(component string) func(http.RoundTripper) http.RoundTripper {
	return func(next http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			start := time.Now()
			resp, err := next.RoundTrip(req)
			if req.URL.Query().Get("watch") != "true" {
				o.record(op{component, "API", req.Method + " " + resourceOf(req.URL.Path)}, time.Since(start), err)
			}
			return resp, err
		})
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// rateLimiter is the token bucket client-go builds from QPS and burst when rest.Config has no
// RateLimiter, with its waits timed.
func (o *opStats) rateLimiter(component string, qps float32, burst int) flowcontrol.RateLimiter {
	return timedLimiter{RateLimiter: flowcontrol.NewTokenBucketRateLimiter(qps, burst), stats: o, component: component}
}

type timedLimiter struct {
	flowcontrol.RateLimiter
	stats     *opStats
	component string
}

func (l timedLimiter) Wait(ctx context.Context) error {
	start := time.Now()
	err := l.RateLimiter.Wait(ctx)
	l.stats.record(op{l.component, "throttle", "client-side rate limiter wait"}, time.Since(start), err)
	return err
}

// resourceOf turns a request path into its resource: /api/v1/namespaces/ns/pods/p/log →
// pods/log, /apis/batch/v1/namespaces/ns/jobs → jobs, /api/v1/namespaces/ns → namespaces.
func resourceOf(path string) string {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		parts = parts[3:]
	default:
		return path
	}
	if len(parts) >= 3 && parts[0] == "namespaces" {
		parts = parts[2:] // namespaced: <resource>[/<name>[/<sub>]]
	}
	switch len(parts) {
	case 0:
		return "namespaces"
	case 1, 2:
		return parts[0]
	default:
		return parts[0] + "/" + parts[2]
	}
}
