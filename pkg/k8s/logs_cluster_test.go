package k8s

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/runwatch/verdict"
)

// stubLineRE finds the number of the stub's assistant line "stub line <i>".
var stubLineRE = regexp.MustCompile(`"stub line (\d+)"`)

// checkStubLog fails t unless texts are the stub's log for STUB_LINES=n with STUB_STDERR set
// (an init line, the stderr line, n assistant lines, a result line), every line exactly once and
// the assistant lines in order.
func checkStubLog(t *testing.T, texts []string, n int, stderr string) {
	t.Helper()
	var numbers []int
	var inits, results, errs int
	for _, s := range texts {
		switch {
		case stubLineRE.MatchString(s):
			i, _ := strconv.Atoi(stubLineRE.FindStringSubmatch(s)[1])
			numbers = append(numbers, i)
		case strings.Contains(s, `"subtype":"init"`):
			inits++
		case strings.Contains(s, `"type":"result"`):
			results++
		case s == stderr:
			errs++
		default:
			t.Errorf("unexpected line %q", s)
		}
	}
	want := make([]int, n)
	for i := range want {
		want[i] = i + 1
	}
	if diff := cmp.Diff(want, numbers); diff != "" {
		t.Errorf("assistant lines, by number (-want +got):\n%s", diff)
	}
	if inits != 1 || results != 1 || errs != 1 {
		t.Errorf("init, result and stderr lines seen %d, %d, %d times; want once each", inits, results, errs)
	}
	if len(texts) > 0 && !strings.Contains(texts[len(texts)-1], `"type":"result"`) {
		t.Errorf("last line %q is not the result", texts[len(texts)-1])
	}
}

// streamCutter cuts the first cuts follow streams of pod logs: each delivers cutAfter lines plus
// a few bytes of the next line, then fails as a reset connection would.
type streamCutter struct {
	rt       http.RoundTripper
	cuts     int32
	cutAfter int
	streams  atomic.Int32
	cut      atomic.Int32
}

var errStreamCut = errors.New("test: stream cut")

func (c *streamCutter) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.rt.RoundTrip(req)
	if err != nil || resp.StatusCode != http.StatusOK || !strings.HasSuffix(req.URL.Path, "/log") || req.URL.Query().Get("follow") != "true" {
		return resp, err
	}
	if n := c.streams.Add(1); n <= c.cuts {
		resp.Body = &cutBody{rc: resp.Body, lines: c.cutAfter, extra: 7, onCut: func() { c.cut.Add(1) }}
	}
	return resp, nil
}

type cutBody struct {
	rc    io.ReadCloser
	lines int // newlines still to pass
	extra int // bytes to pass after the last newline
	onCut func()
	once  sync.Once
}

func (b *cutBody) Read(p []byte) (int, error) {
	if b.lines == 0 && b.extra == 0 {
		b.once.Do(b.onCut)
		return 0, errStreamCut
	}
	n, err := b.rc.Read(p)
	for i := 0; i < n; i++ {
		switch {
		case b.lines > 0:
			if p[i] == '\n' {
				b.lines--
			}
		case b.extra > 0:
			b.extra--
		default:
			return i, nil
		}
	}
	return n, err
}

func (b *cutBody) Close() error { return b.rc.Close() }

// TestClusterFollowLogsSurvivesCutStreams follows a stub that prints 200 lines in bursts (many
// share a second, so each reconnect replays lines the cursor must skip) while the transport cuts
// the first two follow streams in the middle of a line.
func TestClusterFollowLogsSurvivesCutStreams(t *testing.T) {
	t.Parallel()
	base := clusterConfig(t)
	setup := newTestClients(t, base)
	ctx := t.Context()
	ns := testNamespace(ctx, t, setup.cs)
	name := runName()
	const lines = 200
	stderr := "stub stderr line"
	secret, job := stubRun(ns, name, "run-logs", map[string]string{
		"STUB_LINES": strconv.Itoa(lines), "STUB_BURST": "25", "STUB_INTERVAL": "300ms", "STUB_STDERR": stderr,
	})
	if _, err := createJobRun(ctx, setup.cs, secret, job); err != nil {
		t.Fatal(err)
	}
	pod := jobPod(ctx, t, setup.cs, ns, name, time.Minute, anyPod)

	cutter := &streamCutter{cuts: 2, cutAfter: 57}
	c := newTestClients(t, wrapped(base, func(rt http.RoundTripper) http.RoundTripper { cutter.rt = rt; return cutter }))

	var texts []string
	fctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	start := time.Now()
	cur, err := FollowLogs(fctx, c.cs, ns, pod.Name, "agent", Cursor{}, func(l Line) error {
		if l.TimeRaw == "" || l.Time.IsZero() {
			t.Errorf("line %q has no timestamp", l.Text)
		}
		texts = append(texts, l.Text)
		return nil
	}, FollowOptions{Logger: testLogger(t)})
	if err != nil {
		t.Fatalf("FollowLogs: %v", err)
	}
	t.Logf("FollowLogs returned after %v with %d lines, %d follow streams, %d cut", time.Since(start), len(texts), cutter.streams.Load(), cutter.cut.Load())
	if got := cutter.cut.Load(); got != 2 {
		t.Errorf("%d streams were cut, want 2 (the test did not exercise reconnects)", got)
	}
	checkStubLog(t, texts, lines, stderr)
	if cur.Time.IsZero() {
		t.Errorf("final cursor %+v, want the last line's", cur)
	}

	// Resuming from the final cursor delivers nothing more.
	var more []string
	if _, err := FollowLogs(fctx, c.cs, ns, pod.Name, "agent", cur, func(l Line) error {
		more = append(more, l.Text)
		return nil
	}, FollowOptions{}); err != nil {
		t.Fatalf("FollowLogs from the final cursor: %v", err)
	}
	if len(more) != 0 {
		t.Errorf("FollowLogs from the final cursor delivered %q, want nothing", more)
	}
}

// TestClusterFollowLogsResumeFromCursor stops following at an emit error and resumes from the
// returned cursor in a new call, as a restarted run-watcher does.
func TestClusterFollowLogsResumeFromCursor(t *testing.T) {
	t.Parallel()
	c := newTestClients(t, clusterConfig(t))
	ctx := t.Context()
	ns := testNamespace(ctx, t, c.cs)
	name := runName()
	const lines = 120
	stderr := "stub stderr line"
	secret, job := stubRun(ns, name, "run-resume", map[string]string{
		"STUB_LINES": strconv.Itoa(lines), "STUB_BURST": "40", "STUB_INTERVAL": "200ms", "STUB_STDERR": stderr,
	})
	if _, err := createJobRun(ctx, c.cs, secret, job); err != nil {
		t.Fatal(err)
	}
	pod := jobPod(ctx, t, c.cs, ns, name, time.Minute, anyPod)

	errStop := errors.New("stop here")
	var texts []string
	cur := Cursor{}
	for stop := 45; ; stop += 45 {
		var err error
		cur, err = FollowLogs(ctx, c.cs, ns, pod.Name, "agent", cur, func(l Line) error {
			if len(texts) == stop {
				return errStop
			}
			texts = append(texts, l.Text)
			return nil
		}, FollowOptions{})
		if err == nil {
			break
		}
		if !errors.Is(err, errStop) {
			t.Fatalf("FollowLogs: %v", err)
		}
		if stop > 10*lines {
			t.Fatal("FollowLogs never finished")
		}
	}
	checkStubLog(t, texts, lines, stderr)
}

// TestClusterClassify runs stubs that end in different ways and checks the verdicts
// (pkg/runwatch/verdict) the real kubelet's statuses produce. The pod is judged on its own, as
// a run without a Job is: the Job's conditions would speak first.
func TestClusterClassify(t *testing.T) {
	t.Parallel()
	c := newTestClients(t, clusterConfig(t))
	ctx := t.Context()
	ns := testNamespace(ctx, t, c.cs)

	tests := []struct {
		name       string
		env        map[string]string
		mutate     func(*corev1.PodSpec)
		wantReason string
		wantExit   *int
		outcome    events.Outcome
		// grace is StartErrorGrace; default 10s, which a transient "failed to sync secret
		// cache" clears well within.
		grace time.Duration
	}{
		{name: "exit 0", env: map[string]string{"STUB_LINES": "1"}, outcome: events.OutcomeSucceeded, wantReason: "Completed", wantExit: ptr(0)},
		{name: "exit 3", env: map[string]string{"STUB_LINES": "1", "STUB_EXIT_CODE": "3"}, outcome: events.OutcomeFailed, wantReason: "Error", wantExit: ptr(3)},
		{name: "OOM", env: map[string]string{"STUB_LINES": "1", "STUB_OOM": "true"}, outcome: events.OutcomeFailed, wantReason: "OOMKilled", wantExit: ptr(137),
			mutate: func(s *corev1.PodSpec) {
				s.Containers[0].Resources.Limits[corev1.ResourceMemory] = resource.MustParse("48Mi")
			}},
		{name: "image never pulled", outcome: events.OutcomeFailed, wantReason: "ErrImageNeverPull",
			mutate: func(s *corev1.PodSpec) { s.Containers[0].Image = "kubeclip.local/no-such-image:dev" }},
		{name: "missing secret", outcome: events.OutcomeFailed, wantReason: "CreateContainerConfigError", grace: 2 * time.Second,
			mutate: func(s *corev1.PodSpec) { s.Containers[0].EnvFrom[0].SecretRef.Name = "no-such-secret" }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			name := runName()
			secret, job := stubRun(ns, name, name, tc.env)
			if tc.mutate != nil {
				tc.mutate(&job.Spec.Template.Spec)
			}
			if _, err := createJobRun(ctx, c.cs, secret, job); err != nil {
				t.Fatal(err)
			}
			grace := 10 * time.Second
			if tc.grace != 0 {
				grace = tc.grace
			}
			start := time.Now()
			pod := jobPod(ctx, t, c.cs, ns, name, 2*time.Minute, func(p *corev1.Pod) bool {
				return podEnd(p, grace) != nil
			})
			v := podEnd(pod, grace)
			if v == nil {
				t.Fatalf("pod %s has no verdict", pod.Name)
			}
			t.Logf("terminal verdict after %v: %+v (exit %s)", time.Since(start), v, fmtExit(v.ExitCode))
			if v.Outcome != tc.outcome || v.Reason != tc.wantReason {
				t.Errorf("verdict %s/%s (%s), want %s/%s", v.Outcome, v.Reason, v.Message, tc.outcome, tc.wantReason)
			}
			if fmtExit(v.ExitCode) != fmtExit(tc.wantExit) {
				t.Errorf("exit code %s, want %s", fmtExit(v.ExitCode), fmtExit(tc.wantExit))
			}
		})
	}
}

// podEnd is how the run-watcher's verdict (pkg/runwatch/verdict) says the run of pod ended, with
// the pod judged on its own as for a run without a Job (the Job's conditions would speak
// first); nil while it goes on.
func podEnd(pod *corev1.Pod, startErrorGrace time.Duration) *verdict.End {
	p := pod.DeepCopy()
	p.OwnerReferences = nil
	return verdict.Decide(verdict.Input{Pod: p}, verdict.Options{Container: "agent", Now: time.Now(), StartErrorGrace: startErrorGrace}).End
}

func fmtExit(p *int) string {
	if p == nil {
		return "none"
	}
	return fmt.Sprint(*p)
}
