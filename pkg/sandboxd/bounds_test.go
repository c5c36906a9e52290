package sandboxd_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kubeclip/kubeclip/pkg/sandboxd"
)

// TestClientBoundsAnswers: a hostile pod's sandboxd answers every call with a body without end;
// the client reads at most a small bound of it, fails with a clear error, and allocates little.
func TestClientBoundsAnswers(t *testing.T) {
	const huge = 256 << 20
	chunk := bytes.Repeat([]byte("a"), 64<<10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		status := http.StatusOK
		if r.Method == http.MethodPost && r.URL.Path == "/v1/execs" {
			status = http.StatusCreated
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(`{"id":"`))
		for n := 0; n < huge; n += len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
		_, _ = w.Write([]byte(`"}`))
	}))
	defer srv.Close()
	c, err := sandboxd.NewClient(sandboxd.ClientOptions{Dial: sandboxd.DialTCP(strings.TrimPrefix(srv.URL, "http://"))})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	for _, tc := range []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"start", func(ctx context.Context) error {
			_, err := c.Start(ctx, sandboxd.Spec{ID: "x", Command: "true"})
			return err
		}},
		{"info", func(ctx context.Context) error { _, err := c.Info(ctx); return err }},
		{"stdin", func(ctx context.Context) error { _, err := c.WriteStdin(ctx, "x", 0, []byte("in"), false); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			err := tc.call(ctx)
			runtime.ReadMemStats(&after)
			if err == nil || !strings.Contains(err.Error(), "answer") {
				t.Errorf("err = %v, want an error about the answer's size", err)
			}
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 8<<20 {
				t.Errorf("the call allocated %d MiB for a %d MiB answer, want a bounded few", alloc>>20, huge>>20)
			}
		})
	}
}
