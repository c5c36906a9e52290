package ops_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/internal/ops"
)

// wantNotOK is the self-check's metrics before it found anything.
const wantNotOK = `
# HELP kubeclip_self_check_ok 1 once the start-up self-check found every permission the worker needs (Kubernetes and NATS), 0 while one is missing or could not be checked.
# TYPE kubeclip_self_check_ok gauge
kubeclip_self_check_ok 0
`

// syncBuffer is a log destination the self-check's goroutine writes while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// waitFor polls cond until it holds, failing the test after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// switchable is a probe whose answer the test changes, counting its calls.
type switchable struct {
	granted atomic.Bool
	err     atomic.Pointer[error]
	calls   atomic.Int32
}

func (s *switchable) probe(context.Context) (bool, error) {
	s.calls.Add(1)
	if e := s.err.Load(); e != nil {
		return false, *e
	}
	return s.granted.Load(), nil
}

// TestSelfCheckReportsMissingUntilGranted: a missing permission keeps the check failing with its
// name, logs one error line naming it however many rounds find it missing, and exports it; a
// permission that could not be checked fails the check without a missing series; once both are
// granted the series goes, kubeclip_self_check_ok is 1, the check passes and Run returns. A
// permission held is not asked about again.
func TestSelfCheckReportsMissingUntilGranted(t *testing.T) {
	var held, missing, unknown switchable
	held.granted.Store(true)
	noAnswer := errors.New("API server did not answer")
	unknown.err.Store(&noAnswer)
	reg := prometheus.NewRegistry()
	var logs syncBuffer
	sc, err := ops.NewSelfCheck(ops.SelfCheckOptions{
		Permissions: []ops.Permission{
			{Kind: ops.PermissionKubernetes, Name: "list jobs.batch in all namespaces", Probe: held.probe},
			{Kind: ops.PermissionNATS, Name: "subscribe paperclip.api.ping", Probe: missing.probe},
			{Kind: ops.PermissionKubernetes, Name: "watch pods in all namespaces", Probe: unknown.probe},
		},
		Registerer: reg, Logger: zerolog.New(&logs), Interval: 10 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	check := sc.Check()
	if check.Name != "permissions" {
		t.Errorf("check name %q, want permissions", check.Name)
	}
	if err := check.Func(t.Context()); err == nil || !strings.Contains(err.Error(), "checking") {
		t.Errorf("before the first round: %v, want checking", err)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(wantNotOK), ops.MetricPermissionMissing, ops.MetricSelfCheckOK); err != nil {
		t.Errorf("before the first round: %v", err)
	}

	done := make(chan struct{})
	go func() { defer close(done); sc.Run(t.Context()) }()
	waitFor(t, "three rounds", func() bool { return missing.calls.Load() >= 3 })

	err = check.Func(t.Context())
	if err == nil || !strings.Contains(err.Error(), "missing nats: subscribe paperclip.api.ping") ||
		!strings.Contains(err.Error(), "could not check watch pods in all namespaces") {
		t.Errorf("check = %v, want the missing one and the unchecked one named", err)
	}
	wantSeries := `
# HELP kubeclip_permission_missing 1 for each permission the self-check found missing, by kind (kubernetes, nats) and permission (as the worker's log names it); the series goes when it is granted.
# TYPE kubeclip_permission_missing gauge
kubeclip_permission_missing{kind="nats",permission="subscribe paperclip.api.ping"} 1
# HELP kubeclip_self_check_ok 1 once the start-up self-check found every permission the worker needs (Kubernetes and NATS), 0 while one is missing or could not be checked.
# TYPE kubeclip_self_check_ok gauge
kubeclip_self_check_ok 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(wantSeries), ops.MetricPermissionMissing, ops.MetricSelfCheckOK); err != nil {
		t.Error(err)
	}
	if n := strings.Count(logs.String(), `"level":"error"`); n != 1 {
		t.Errorf("%d error lines after several rounds, want 1:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), `"permission":"subscribe paperclip.api.ping"`) {
		t.Errorf("the error line does not name the permission:\n%s", logs.String())
	}

	missing.granted.Store(true)
	unknown.err.Store(nil)
	unknown.granted.Store(true)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return once every permission was held")
	}
	if err := check.Func(t.Context()); err != nil {
		t.Errorf("check once granted: %v", err)
	}
	wantOK := `
# HELP kubeclip_self_check_ok 1 once the start-up self-check found every permission the worker needs (Kubernetes and NATS), 0 while one is missing or could not be checked.
# TYPE kubeclip_self_check_ok gauge
kubeclip_self_check_ok 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(wantOK), ops.MetricPermissionMissing, ops.MetricSelfCheckOK); err != nil {
		t.Error(err)
	}
	if n := held.calls.Load(); n != 1 {
		t.Errorf("the permission held from the start was probed %d times, want 1", n)
	}
	if !strings.Contains(logs.String(), "permission granted") {
		t.Errorf("no line says the permission was granted:\n%s", logs.String())
	}
}

// TestSelfCheckBoundsProbesInFlight: a round runs its probes at once, at most Concurrency.
func TestSelfCheckBoundsProbesInFlight(t *testing.T) {
	const n, limit = 20, 3
	var inFlight, peak atomic.Int32
	release := make(chan struct{})
	probe := func(ctx context.Context) (bool, error) {
		cur := inFlight.Add(1)
		defer inFlight.Add(-1)
		for {
			p := peak.Load()
			if cur <= p || peak.CompareAndSwap(p, cur) {
				break
			}
		}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return true, nil
	}
	var perms []ops.Permission
	for i := range n {
		perms = append(perms, ops.Permission{Kind: ops.PermissionNATS, Name: fmt.Sprintf("subscribe s%d", i), Probe: probe})
	}
	sc, err := ops.NewSelfCheck(ops.SelfCheckOptions{Permissions: perms, Registerer: prometheus.NewRegistry(), Logger: zerolog.Nop(), Concurrency: limit})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); sc.Run(t.Context()) }()
	waitFor(t, "the first probes", func() bool { return inFlight.Load() == limit })
	close(release)
	<-done
	if p := peak.Load(); p != limit {
		t.Errorf("peak probes in flight %d, want %d", p, limit)
	}
}

func TestNewSelfCheckRejectsBadPermissions(t *testing.T) {
	probe := func(context.Context) (bool, error) { return true, nil }
	tests := []struct {
		name  string
		perms []ops.Permission
		want  string
	}{
		{"unknown kind", []ops.Permission{{Kind: "dns", Name: "x", Probe: probe}}, `kind "dns"`},
		{"no probe", []ops.Permission{{Kind: ops.PermissionNATS, Name: "x"}}, "no probe"},
		{"twice", []ops.Permission{{Kind: ops.PermissionNATS, Name: "x", Probe: probe}, {Kind: ops.PermissionKubernetes, Name: "x", Probe: probe}}, "twice"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ops.NewSelfCheck(ops.SelfCheckOptions{Permissions: tc.perms, Registerer: prometheus.NewRegistry()})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want one containing %q", err, tc.want)
			}
		})
	}
}
