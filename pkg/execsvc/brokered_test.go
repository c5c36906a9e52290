package execsvc_test

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/kubeclip/kubeclip/pkg/broker"
	"github.com/kubeclip/kubeclip/pkg/execclient"
	"github.com/kubeclip/kubeclip/pkg/execproto"
	"github.com/kubeclip/kubeclip/pkg/execsvc"
	"github.com/rs/zerolog"
)

// placeholderText is a well-formed placeholder (the broker's shape, random parts): the
// exec-worker checks the shape only; the broker alone knows whether it resolves.
func placeholderText(t *testing.T) string {
	t.Helper()
	id, secret := make([]byte, 16), make([]byte, 32)
	_, _ = rand.Read(id)
	_, _ = rand.Read(secret)
	p := broker.PlaceholderPrefix + base64.RawURLEncoding.EncodeToString(id) + "_" + base64.RawURLEncoding.EncodeToString(secret)
	if _, err := broker.ParsePlaceholder(p); err != nil {
		t.Fatalf("the test's placeholder does not parse: %v", err)
	}
	return p
}

// TestBrokeredKeys: with brokered keys set, a start carrying a brokered key's real value is
// refused with an invalid_request naming the key (never the value) and its command never runs;
// a placeholder, an empty value and a key not brokered pass; with none set (the default) a real
// value passes as before.
func TestBrokeredKeys(t *testing.T) {
	keys, err := execsvc.NewBrokeredKeys([]string{"ANTHROPIC_API_KEY", "OPENAI_API_KEY"})
	if err != nil {
		t.Fatal(err)
	}
	// Everything the worker logs, at every level, is kept to show the value is never in it.
	logs := &lockedBuffer{}
	e := newEnvTuned(t, 1, func(o *execsvc.Options) {
		o.BrokeredKeys = keys
		o.Logger = zerolog.New(zerolog.MultiLevelWriter(zerolog.NewTestWriter(t), logs)).Level(zerolog.TraceLevel)
	})
	off := newEnv(t, 1)
	const realValue = "sk-ant-real-value-0123456789"
	ph := placeholderText(t)

	for _, tc := range []struct {
		name      string
		e         *env
		env       map[string]string
		wantField string // empty: runs
	}{
		{name: "real value", e: e, env: map[string]string{"ANTHROPIC_API_KEY": realValue}, wantField: "env.ANTHROPIC_API_KEY"},
		{name: "second key real", e: e, env: map[string]string{"ANTHROPIC_API_KEY": ph, "OPENAI_API_KEY": realValue}, wantField: "env.OPENAI_API_KEY"},
		{name: "placeholder prefix only", e: e, env: map[string]string{"ANTHROPIC_API_KEY": broker.PlaceholderPrefix + realValue}, wantField: "env.ANTHROPIC_API_KEY"},
		{name: "placeholder", e: e, env: map[string]string{"ANTHROPIC_API_KEY": ph}},
		{name: "empty value", e: e, env: map[string]string{"ANTHROPIC_API_KEY": ""}},
		{name: "not brokered", e: e, env: map[string]string{"GEMINI_API_KEY": realValue}},
		{name: "other case not brokered", e: e, env: map[string]string{"anthropic_api_key": realValue}},
		{name: "off", e: off, env: map[string]string{"ANTHROPIC_API_KEY": realValue}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mark := filepath.Join(t.TempDir(), "ran")
			l := tc.e.newLease(newID("co"))
			_, err := tc.e.try(l, execclient.Exec{Command: "sh", Args: []string{"-c", "env; : > " + mark}, Env: tc.env})
			_, statErr := os.Stat(mark)
			ran := statErr == nil
			if tc.wantField == "" {
				if err != nil || !ran {
					t.Fatalf("exec refused (%v) or did not run (%v), want it run", err, statErr)
				}
				return
			}
			var perr *execproto.Error
			if !errors.As(err, &perr) {
				t.Fatalf("exec error %v, want an *execproto.Error", err)
			}
			t.Logf("refused: code=%s field=%s message=%q", perr.Code, perr.Field, perr.Message)
			if perr.Code != execproto.CodeInvalidRequest || perr.Field != tc.wantField {
				t.Errorf("refused with %s on %q, want %s on %q", perr.Code, perr.Field, execproto.CodeInvalidRequest, tc.wantField)
			}
			key := strings.TrimPrefix(tc.wantField, "env.")
			if !strings.Contains(perr.Message, key) || strings.Contains(err.Error(), realValue) {
				t.Errorf("message %q must name %s and never quote the value", err.Error(), key)
			}
			if ran {
				t.Error("the command ran")
			}
		})
	}
	// Only the worker that refuses is watched: "off" ran the real value in its command's env.
	n := strings.Count(logs.String(), realValue)
	t.Logf("log bytes=%d realValueInLog=%d", len(logs.String()), n)
	if n != 0 {
		t.Errorf("the exec-worker logged the real value %d times", n)
	}
}

// lockedBuffer is an io.Writer safe for the replica's goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
