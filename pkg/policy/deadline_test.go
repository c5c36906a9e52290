package policy_test

import (
	"errors"
	"testing"
	"time"

	"github.com/kubeclip/kubeclip/pkg/policy"
)

func TestComputeBoundedLeaseDeadline(t *testing.T) {
	now := time.Date(2026, 8, 1, 12, 0, 0, 400e6, time.UTC) // .400 s
	tests := []struct {
		name          string
		requested     string
		wantNil       bool
		wantErr       bool
		wantDeadline  int64
		wantExpiresAt string
	}{
		{name: "none requested", requested: "", wantNil: true},
		{name: "one hour", requested: "2026-08-01T13:00:00Z", wantDeadline: 3599, wantExpiresAt: "2026-08-01T12:59:59.000Z"},
		{name: "whole seconds rounded down", requested: "2026-08-01T12:10:00.900Z", wantDeadline: 600, wantExpiresAt: "2026-08-01T12:10:00.000Z"},
		{name: "zone offset", requested: "2026-08-01T15:00:00+02:00", wantDeadline: 3599, wantExpiresAt: "2026-08-01T12:59:59.000Z"},
		{name: "equal to now", requested: "2026-08-01T14:00:00.4+02:00", wantErr: true},
		{name: "exactly 30s", requested: "2026-08-01T12:00:30.400Z", wantDeadline: 30, wantExpiresAt: "2026-08-01T12:00:30.000Z"},
		{name: "29.999s is too close", requested: "2026-08-01T12:00:30.399Z", wantErr: true},
		{name: "past", requested: "2026-08-01T11:00:00Z", wantErr: true},
		{name: "capped at 24h", requested: "2026-08-05T00:00:00Z", wantDeadline: 86400, wantExpiresAt: "2026-08-02T12:00:00.000Z"},
		{name: "unparseable", requested: "tomorrow", wantErr: true},
		{name: "no zone", requested: "2026-08-01T13:00:00", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := policy.ComputeBoundedLeaseDeadline(tc.requested, now)
			switch {
			case tc.wantErr:
				if !errors.Is(err, policy.ErrInvalidLeaseDeadline) {
					t.Fatalf("error = %v, want ErrInvalidLeaseDeadline", err)
				}
			case err != nil:
				t.Fatal(err)
			case tc.wantNil:
				if got != nil {
					t.Fatalf("got %+v, want nil", got)
				}
			default:
				if got.ActiveDeadlineSeconds != tc.wantDeadline || got.ExpiresAt() != tc.wantExpiresAt {
					t.Errorf("got %d / %s, want %d / %s", got.ActiveDeadlineSeconds, got.ExpiresAt(), tc.wantDeadline, tc.wantExpiresAt)
				}
				if got.HardStopAt.After(mustParse(t, tc.requested)) {
					t.Errorf("hard stop %s is after the requested %s", got.HardStopAt, tc.requested)
				}
			}
		})
	}
}

func mustParse(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
