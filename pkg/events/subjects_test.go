package events_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kubeclip/kubeclip/pkg/events"
)

func TestValidateToken(t *testing.T) {
	tests := []struct {
		name    string
		value   string
		wantErr string // substring; "" means valid
	}{
		{name: "uuid", value: "3f0e9a4c-8a61-4a1e-9d0b-6f3b2c1d0e9f"},
		{name: "unicode", value: "société"},
		{name: "max length", value: strings.Repeat("a", events.MaxTokenLen)},
		{name: "empty", value: "", wantErr: "must not be empty"},
		{name: "too long", value: strings.Repeat("a", events.MaxTokenLen+1), wantErr: "at most 128 bytes"},
		{name: "dot", value: "a.b", wantErr: `must not contain '.'`},
		{name: "star", value: "a*", wantErr: `must not contain '*'`},
		{name: "gt", value: ">", wantErr: `must not contain '>'`},
		{name: "space", value: "a b", wantErr: "whitespace"},
		{name: "tab", value: "a\tb", wantErr: "whitespace"},
		{name: "newline", value: "a\nb", wantErr: "whitespace"},
		{name: "nbsp", value: "a\u00a0b", wantErr: "whitespace"},
		{name: "control", value: "a\x00b", wantErr: "control"},
		{name: "invalid utf-8", value: "a\xffb", wantErr: "UTF-8"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := events.ValidateToken("companyId", tc.value)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("ValidateToken(%q) = %v, want nil", tc.value, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("ValidateToken(%q) = nil, want an error containing %q", tc.value, tc.wantErr)
			}
			if !errors.Is(err, events.ErrInvalidToken) {
				t.Errorf("error %v does not wrap ErrInvalidToken", err)
			}
			te, ok := events.AsTerminal(err)
			if !ok {
				t.Fatalf("error %v is not a TerminalError", err)
			}
			if te.Code != events.CodeInvalidRequest || te.Field != "companyId" {
				t.Errorf("got code %q field %q, want invalid_request companyId", te.Code, te.Field)
			}
			if !strings.HasPrefix(err.Error(), "companyId: ") || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("message %q should name the field and contain %q", err, tc.wantErr)
			}
		})
	}
}

func TestNewSubjects(t *testing.T) {
	tests := []struct {
		prefix     string
		wantPrefix string
		wantLeases string
		wantRuns   string
		wantErr    bool
	}{
		{prefix: "", wantPrefix: "paperclip", wantLeases: "PAPERCLIP_LEASES", wantRuns: "PAPERCLIP_RUNS"},
		{prefix: "acme-pc", wantPrefix: "acme-pc", wantLeases: "ACME-PC_LEASES", wantRuns: "ACME-PC_RUNS"},
		{prefix: "a.b", wantErr: true},
		{prefix: "a*", wantErr: true},
		{prefix: "$JS", wantErr: true},
		{prefix: strings.Repeat("p", 33), wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.prefix, func(t *testing.T) {
			s, err := events.NewSubjects(tc.prefix)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("NewSubjects(%q) = nil error, want one", tc.prefix)
				}
				return
			}
			if err != nil {
				t.Fatalf("NewSubjects(%q): %v", tc.prefix, err)
			}
			got := []string{s.Prefix(), s.LeaseStream(), s.RunStream()}
			want := []string{tc.wantPrefix, tc.wantLeases, tc.wantRuns}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
	if (events.Subjects{}).Prefix() != events.DefaultPrefix {
		t.Errorf("the zero Subjects should use the default prefix")
	}
}

func TestSubjectBuilders(t *testing.T) {
	var s events.Subjects
	must := func(v string, err error) string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	got := []string{
		must(s.Lease("c1", events.LeaseAcquire)),
		must(s.Lease("c1", events.LeaseRelease)),
		must(s.Lease("c1", events.LeaseDestroy)),
		must(s.Run("c1", "r1", events.KindLog)),
		must(s.RunFilter("c1", "r1")),
		must(events.DispatchSubject("c1", "r1")),
		s.LeaseAll(), s.RunAll(), s.LeaseFilter(events.LeaseAcquire), events.DispatchAll(),
	}
	want := []string{
		"paperclip.lease.c1.acquire",
		"paperclip.lease.c1.release",
		"paperclip.lease.c1.destroy",
		"paperclip.run.c1.r1.log",
		"paperclip.run.c1.r1.*",
		"kubeclip.dispatch.c1.r1",
		"paperclip.lease.>", "paperclip.run.>", "paperclip.lease.*.acquire", "kubeclip.dispatch.>",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}

	if _, err := s.Run("c.1", "r1", events.KindLog); err == nil {
		t.Errorf("Run with a dotted company id should fail")
	}
	if _, err := s.Run("c1", "r 1", events.KindLog); !errors.Is(err, events.ErrInvalidToken) {
		t.Errorf("Run with a spaced run id: got %v, want ErrInvalidToken", err)
	}
	if _, err := s.Run("c1", "r1", "bogus"); !errors.Is(err, events.ErrUnknownSubject) {
		t.Errorf("Run with an unknown kind: got %v, want ErrUnknownSubject", err)
	}
}

func TestParseRunSubject(t *testing.T) {
	s, err := events.NewSubjects("pc")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		subject              string
		wantCompany, wantRun string
		wantKind             events.RunKind
		wantErr              error
	}{
		{subject: "pc.run.c1.r1.created", wantCompany: "c1", wantRun: "r1", wantKind: events.KindCreated},
		{subject: "pc.run.c1.r1.log", wantCompany: "c1", wantRun: "r1", wantKind: events.KindLog},
		{subject: "pc.run.c1.r1.failed", wantCompany: "c1", wantRun: "r1", wantKind: events.KindFailed},
		{subject: "paperclip.run.c1.r1.log", wantErr: events.ErrUnknownSubject},
		{subject: "pc.run.c1.r1.bogus", wantErr: events.ErrUnknownSubject},
		{subject: "pc.run.c1.log", wantErr: events.ErrUnknownSubject},
		{subject: "pc.lease.c1.acquire", wantErr: events.ErrUnknownSubject},
	}
	for _, tc := range tests {
		t.Run(tc.subject, func(t *testing.T) {
			c, r, k, err := s.ParseRunSubject(tc.subject)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("got %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c != tc.wantCompany || r != tc.wantRun || k != tc.wantKind {
				t.Errorf("got (%q, %q, %q), want (%q, %q, %q)", c, r, k, tc.wantCompany, tc.wantRun, tc.wantKind)
			}
		})
	}
}

func TestParseLeaseAndDispatchSubjects(t *testing.T) {
	var s events.Subjects
	c, k, err := s.ParseLeaseSubject("paperclip.lease.c1.destroy")
	if err != nil || c != "c1" || k != events.LeaseDestroy {
		t.Errorf("ParseLeaseSubject = (%q, %q, %v)", c, k, err)
	}
	if _, _, err := s.ParseLeaseSubject("paperclip.lease.c1.renew"); !errors.Is(err, events.ErrUnknownSubject) {
		t.Errorf("unknown lease kind: got %v", err)
	}
	c, r, err := events.ParseDispatchSubject("kubeclip.dispatch.c1.r1")
	if err != nil || c != "c1" || r != "r1" {
		t.Errorf("ParseDispatchSubject = (%q, %q, %v)", c, r, err)
	}
	for _, bad := range []string{"kubeclip.dispatch.c1", "kubeclip.dispatch.c1.r1.x", "other.dispatch.c1.r1"} {
		if _, _, err := events.ParseDispatchSubject(bad); !errors.Is(err, events.ErrUnknownSubject) {
			t.Errorf("ParseDispatchSubject(%q): got %v, want ErrUnknownSubject", bad, err)
		}
	}
}
