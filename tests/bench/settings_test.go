package main

import (
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/kubeclip/kubeclip/internal/app"
)

func TestSettingsPhasesAndReuseCounts(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantErr string // "" for none
	}{
		{"reusable lease phase", []string{"--phases", "n"}, ""},
		{"with others", []string{"--phases", "k,m,n"}, ""},
		{"no phase o", []string{"--phases", "o"}, "--phases (KUBECLIP_BENCH_PHASES) takes phase letters a to n"},
		{"no leases", []string{"--reuse-leases", "0"}, "--reuse-leases (KUBECLIP_BENCH_REUSE_LEASES) must be > 0"},
		{"no live resumes", []string{"--reuse-live-resumes", "0"}, "--reuse-live-resumes (KUBECLIP_BENCH_REUSE_LIVE_RESUMES) must be > 0"},
		{"no suspended resumes", []string{"--reuse-suspended-resumes", "-1"}, "--reuse-suspended-resumes (KUBECLIP_BENCH_REUSE_SUSPENDED_RESUMES) must be > 0"},
	}
	noEnv := func(string) (string, bool) { return "", false }
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := parseSettings(append([]string{"--kubeconfig", "kc"}, tc.args...), noEnv, io.Discard)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("parseSettings(%q): %v", tc.args, err)
				}
				if !s.runs(phaseReuse) {
					t.Errorf("--phases %s does not run %s", s.phases, phaseReuse)
				}
				return
			}
			var usage *app.UsageError
			if !errors.As(err, &usage) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("parseSettings(%q) = %v, want a usage error containing %q", tc.args, err, tc.wantErr)
			}
		})
	}
}

// make bench runs every phase unless told otherwise: (n) among them.
func TestSettingsDefaultRunsReusableLeasePhase(t *testing.T) {
	s, err := parseSettings([]string{"--kubeconfig", "kc"}, func(string) (string, bool) { return "", false }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !s.runs(phaseReuse) {
		t.Errorf("the default phases (%q) do not run %s", s.phases, phaseReuse)
	}
}
