package execsvc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/kubeclip/kubeclip/pkg/execproto"
	"github.com/kubeclip/kubeclip/pkg/sandboxd"
)

// TestSandboxdMeanings pins what each sandboxd error means for each call.
func TestSandboxdMeanings(t *testing.T) {
	api := func(code string) error {
		return fmt.Errorf("calling sandboxd: %w", &sandboxd.APIError{Status: 409, Code: code, Message: "m"})
	}
	transport := fmt.Errorf("dialing: %w", io.ErrUnexpectedEOF)
	for _, tc := range []struct {
		call     call
		err      error
		wantFate fate
		wantCode execproto.Code
	}{
		{callStart, api(sandboxd.CodeSpecMismatch), fateRefused, execproto.CodeInvalidRequest},
		{callStart, api(sandboxd.CodeInvalidRequest), fateRefused, execproto.CodeInvalidRequest},
		{callStart, api(sandboxd.CodeTooLarge), fateRefused, execproto.CodeInvalidRequest},
		{callStart, api(sandboxd.CodeDraining), fateRefused, execproto.CodeWorkloadLost},
		{callStart, api(sandboxd.CodeInternal), fateRefused, execproto.CodeUnavailable},
		{callStart, api(sandboxd.CodeUnauthorized), fateRefused, execproto.CodeUnavailable},
		{callStart, sandboxd.ErrServerKeyMismatch, fateTransient, ""},
		{callStart, transport, fateTransient, ""},
		{callOpen, api(sandboxd.CodeNotFound), fateRefused, execproto.CodeExecNotFound},
		{callOpen, api(sandboxd.CodeInvalidRequest), fateRefused, execproto.CodeInvalidRequest},
		{callOpen, sandboxd.ErrStalled, fateTransient, ""},
		{callReopen, api(sandboxd.CodeNotFound), fateRefused, execproto.CodeWorkloadLost},
		{callReopen, api(sandboxd.CodeInvalidRequest), fateTransient, ""},
		{callReopen, transport, fateTransient, ""},
		{callStdinState, api(sandboxd.CodeOffsetMismatch), fateDone, ""},
		{callStdinState, api(sandboxd.CodeStdinClosed), fateStdinClosed, ""},
		{callStdinState, api(sandboxd.CodeNotFound), fateRefused, execproto.CodeExecNotFound},
		{callStdinState, context.DeadlineExceeded, fateRefused, execproto.CodeUnavailable},
		{callStdin, api(sandboxd.CodeOffsetMismatch), fateDone, ""},
		{callStdin, api(sandboxd.CodeStdinClosed), fateStdinClosed, ""},
		{callStdin, api(sandboxd.CodeNotFound), fateTransient, ""},
		{callStdin, transport, fateTransient, ""},
		{callSignal, api(sandboxd.CodeExited), fateExited, ""},
		{callSignal, api(sandboxd.CodeNotFound), fateRefused, execproto.CodeExecNotFound},
		{callSignal, api(sandboxd.CodeInvalidRequest), fateRefused, execproto.CodeInvalidRequest},
		{callSignal, transport, fateRefused, execproto.CodeUnavailable},
		{callResize, api(sandboxd.CodeExited), fateExited, ""},
		{callResize, api(sandboxd.CodeNotFound), fateRefused, execproto.CodeExecNotFound},
		{callResize, api(sandboxd.CodeInvalidRequest), fateRefused, execproto.CodeInvalidRequest},
		{callResize, transport, fateRefused, execproto.CodeUnavailable},
		{callDelete, api(sandboxd.CodeRunning), fateDone, ""},
		{callDelete, api(sandboxd.CodeNotFound), fateDone, ""},
		{callDelete, transport, fateTransient, ""},
	} {
		t.Run(fmt.Sprintf("%s/%v", tc.call, tc.err), func(t *testing.T) {
			m := meaningOf(tc.call, tc.err)
			if m.fate != tc.wantFate || m.code != tc.wantCode {
				t.Errorf("meaningOf(%s, %v) = %s %q, want %s %q", tc.call, tc.err, m.fate, m.code, tc.wantFate, tc.wantCode)
			}
			if m.fate == fateRefused {
				e := m.err("x1", "pc-1")
				if !e.Code.Valid() || e.Message == "" {
					t.Errorf("exec error %+v: want a documented code and a message", e)
				}
			}
		})
	}
}

// TestEverySandboxdMeaningIsReachable: every row names a sandboxd sentinel of its call once, so
// a row is never shadowed by an earlier one.
func TestEverySandboxdMeaningIsReachable(t *testing.T) {
	seen := map[string]bool{}
	for _, row := range sandboxdMeanings {
		k := fmt.Sprintf("%s/%v", row.call, row.sentinel)
		if seen[k] {
			t.Errorf("row %s is shadowed by an earlier one", k)
		}
		seen[k] = true
		if got := meaningOf(row.call, fmt.Errorf("wrapped: %w", row.sentinel)); got.fate != row.meaning.fate || got.code != row.meaning.code {
			t.Errorf("row %s: meaningOf gives %s %q", k, got.fate, got.code)
		}
	}
	if !errors.Is(&sandboxd.APIError{Code: sandboxd.CodeNotFound}, sandboxd.ErrNotFound) {
		t.Fatal("sandboxd's APIError no longer matches its sentinels")
	}
}
