package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kubeclip/kubeclip/internal/app"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
)

// TestLeaseFlags: every lease command refuses a missing or bad flag before it connects, naming
// the flag and its environment variable (exit status 2).
func TestLeaseFlags(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr string
	}{
		{name: "no subcommand", args: []string{"lease"}, wantErr: "lease needs a subcommand: show, resume or destroy"},
		{name: "unknown subcommand", args: []string{"lease", "stop"}, wantErr: `unknown lease subcommand "stop"`},
		{name: "show without flags", args: []string{"lease", "show"}, wantErr: "--company (KUBECLIP_COMPANY) and --run (KUBECLIP_RUN) are required"},
		{name: "show without run", args: []string{"lease", "show", "--company", "acme"}, wantErr: "--run (KUBECLIP_RUN) is required"},
		{name: "show with a bad company", args: []string{"lease", "show", "--company", "ac.me", "--run", "r1"}, wantErr: "companyId"},
		{name: "resume without company", args: []string{"lease", "resume", "--run", "r1"}, wantErr: "--company (KUBECLIP_COMPANY) is required"},
		{name: "resume with a bad run", args: []string{"lease", "resume", "--company", "acme", "--run", "r*"}, wantErr: "runId"},
		{name: "resume without timeout", args: []string{"lease", "resume", "--company", "acme", "--run", "r1", "--timeout", "0s"}, wantErr: "--timeout (KUBECLIP_ANSWER_TIMEOUT) must be > 0"},
		{name: "destroy without run", args: []string{"lease", "destroy"}, env: map[string]string{"KUBECLIP_COMPANY": "acme"}, wantErr: "--run (KUBECLIP_RUN) is required"},
		{name: "destroy has no --destroy", args: []string{"lease", "destroy", "--company", "acme", "--run", "r1", "--destroy"}, wantErr: "flag provided but not defined: -destroy"},
		{name: "release without flags", args: []string{"release"}, wantErr: "--company (KUBECLIP_COMPANY) and --run (KUBECLIP_RUN) are required"},
		{name: "release with a bad lease", args: []string{"release", "--company", "acme", "--run", "r1", "--lease", strings.Repeat("x", 300)}, wantErr: "providerLeaseId"},
		{name: "acquire without agent", args: []string{"acquire", "--company", "acme"}, wantErr: "--agent (KUBECLIP_AGENT) is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lookup := func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }
			var out bytes.Buffer
			// No NATS server: a command that got past its flags would fail to connect instead.
			err := run(t.Context(), tc.args, lookup, &out, &out)
			if app.ExitCode(err) != 2 || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("got %v (exit %d), want a usage error with %q", err, app.ExitCode(err), tc.wantErr)
			}
		})
	}
	for _, args := range [][]string{{"lease", "--help"}, {"lease", "show", "--help"}, {"lease", "resume", "-h"}, {"lease", "destroy", "--help"}} {
		var out bytes.Buffer
		if err := run(t.Context(), args, func(string) (string, bool) { return "", false }, &out, &out); app.ExitCode(err) != 0 || !strings.Contains(out.String(), "kubeclip lease resume") {
			t.Errorf("%v: exit %d, help %q", args, app.ExitCode(err), out.String())
		}
	}
}

// TestLeaseAnswers pins which run event answers which lease request, and that a refusal is an
// error with its code and field.
func TestLeaseAnswers(t *testing.T) {
	resume := events.ResumeRequest{CompanyID: "acme", RunID: "r1", ProviderLeaseID: "pc-1", ResumeID: "res-2"}
	release := events.ReleaseRequest{CompanyID: "acme", RunID: "r1", ProviderLeaseID: "pc-1", ReleaseID: "rel-2"}
	destroy := events.ReleaseRequest{CompanyID: "acme", RunID: "r1", ProviderLeaseID: "pc-1", Destroy: true}
	failed := func(kind events.LeaseKind, id string) events.RunFailedEvent {
		return events.RunFailedEvent{RunID: "r1", Code: events.CodeLeaseNotFound, Field: "runId", Message: "no lease", Request: kind, RequestID: id}
	}
	for _, tc := range []struct {
		name        string
		answer      answerFunc
		ev          events.Event
		want        bool
		wantRefusal bool
	}{
		{"resumed of this resume", resumeAnswer(resume), events.RunResumedEvent{ResumeID: "res-2"}, true, false},
		{"resumed of an earlier resume", resumeAnswer(resume), events.RunResumedEvent{ResumeID: "res-1"}, false, false},
		{"resume refused", resumeAnswer(resume), failed(events.LeaseResume, "res-2"), true, true},
		{"another resume refused", resumeAnswer(resume), failed(events.LeaseResume, "res-1"), false, false},
		{"a release refused", resumeAnswer(resume), failed(events.LeaseRelease, "res-2"), false, false},
		{"status", resumeAnswer(resume), events.RunStatusEvent{Phase: events.PhaseRunning}, false, false},
		{"released of this release", releaseAnswer(release), events.RunReleasedEvent{State: events.ReleaseStopped, ReleaseID: "rel-2"}, true, false},
		{"released of another release", releaseAnswer(release), events.RunReleasedEvent{State: events.ReleaseStopped, ReleaseID: "rel-1"}, false, false},
		{"released of a lease not reusable", releaseAnswer(release), events.RunReleasedEvent{State: events.ReleaseStopped}, true, false},
		{"release refused", releaseAnswer(release), failed(events.LeaseRelease, "rel-2"), true, true},
		{"destroyed", releaseAnswer(destroy), events.RunReleasedEvent{State: events.ReleaseDestroyed}, true, false},
		{"stopped is no destroy's answer", releaseAnswer(destroy), events.RunReleasedEvent{State: events.ReleaseStopped, ReleaseID: "rel-1"}, false, false},
		{"destroy refused", releaseAnswer(destroy), failed(events.LeaseDestroy, ""), true, true},
		{"an unknown lease's receipt answers a destroy", releaseAnswer(destroy), events.RunReleasedEvent{State: events.ReleaseDestroyed, Unknown: true}, true, false},
		{"an unknown lease's receipt answers a named release", releaseAnswer(release), events.RunReleasedEvent{State: events.ReleaseDestroyed, ReleaseID: "rel-2", Unknown: true}, true, false},
		{"a resume refused is no destroy's", releaseAnswer(destroy), failed(events.LeaseResume, "res-2"), false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.answer(tc.ev)
			var r *refusal
			if got != tc.want || errors.As(err, &r) != tc.wantRefusal {
				t.Fatalf("answers %v, refusal %v; want %v, %v", got, err, tc.want, tc.wantRefusal)
			}
			if r != nil && !strings.HasSuffix(err.Error(), " of run r1 refused: lease_not_found (field runId): no lease") {
				t.Errorf("refusal %q", err)
			}
		})
	}
	for _, tc := range []struct {
		name       string
		req        events.ReleaseRequest
		ev         events.RunReleasedEvent
		resumedSeq uint64
		want       bool
	}{
		{"destroyed ends a destroy", destroy, events.RunReleasedEvent{State: events.ReleaseDestroyed}, 0, true},
		{"destroyed ends a release", release, events.RunReleasedEvent{State: events.ReleaseDestroyed}, 0, true},
		{"a plain release ends a release", release, events.RunReleasedEvent{State: events.ReleaseStopped}, 0, true},
		{"a plain release does not end a destroy", destroy, events.RunReleasedEvent{State: events.ReleaseStopped}, 0, false},
		{"a reusable lease's release ends nothing", release, events.RunReleasedEvent{State: events.ReleaseStopped, ReleaseID: "rel-1"}, 0, false},
		{"a plain release resumed since ends nothing", release, events.RunReleasedEvent{State: events.ReleaseStopped}, 8, false},
		{"a resume before the plain release", release, events.RunReleasedEvent{State: events.ReleaseStopped}, 6, true},
	} {
		if got := releasedFinal(tc.req, events.Received{Event: tc.ev, StreamSeq: 7}, tc.resumedSeq); got != tc.want {
			t.Errorf("%s: final %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestLeaseView pins what show prints of a suspended reusable lease's record and events.
func TestLeaseView(t *testing.T) {
	created := time.Date(2026, 11, 26, 5, 0, 0, 0, time.UTC)
	retained, suspended := created.Add(time.Minute), created.Add(2*time.Minute)
	v := leaseView{
		Ref: events.Ref("acme", "r1"),
		Record: &lease.Record{
			RunID: "r1", CompanyID: "acme", State: lease.StateSuspended, Namespace: "kc-acme", WorkloadName: "pc-1",
			Backend: "pod", CreatedAt: created, Reusable: true, VolumeClaim: "pc-1-data", Generation: 1, Resumes: 2,
			RetainedAt: &retained, SuspendedAt: &suspended,
		},
		Events: []events.Received{
			{Event: events.RunReleasedEvent{ProviderLeaseID: "pc-1", State: events.ReleaseStopped, ReleaseID: "1"}, StreamSeq: 7},
			{Event: events.RunSuspendedEvent{ProviderLeaseID: "pc-1", Generation: 1, VolumeClaim: "pc-1-data"}, StreamSeq: 9},
		},
	}
	var out bytes.Buffer
	v.write(&out, suspended.Add(30*time.Second))
	want := `lease       pc-1 (run r1 of company acme)
state       suspended
reusable    yes
backend     pod, namespace kc-acme
volume      pc-1-data
generation  1 (resumes 2)
created     2026-11-26T05:00:00Z (2m30s ago)
retained    2026-11-26T05:01:00Z (1m30s ago)
suspended   2026-11-26T05:02:00Z (30s ago)
expires     never
last events:
[released] lease pc-1 stopped
[suspended] lease pc-1: pod of generation 1 deleted, volume pc-1-data kept
`
	if diff := cmp.Diff(want, out.String()); diff != "" {
		t.Errorf("show (-want +got):\n%s", diff)
	}
}
