package sandboxd_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/kubeclip/kubeclip/pkg/sandboxd"
)

// A client's output streams share read buffers (a stream read to its exit frame gives its
// buffer to the next one): streams running at once, long ones spanning many frames and short
// ones, streams closed halfway, must each get exactly their own exec's output. Run with -race:
// a buffer handed on while its stream still read from it is a data race.
func TestOutputStreamsRecycleTheirBuffers(t *testing.T) {
	h := startServer(t, nil)
	const workers, execs = 4, 12
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range execs {
				marker := fmt.Sprintf("w%d-e%d", w, i)
				script := "printf " + marker
				want := marker
				if i%2 == 0 { // 96 KiB: several frames, more than a buffer
					script = "head -c 98304 /dev/zero | tr '\\0' x; printf " + marker
					want = strings.Repeat("x", 98304) + marker
				}
				id := newID()
				if _, err := h.tls.Start(t.Context(), sandboxd.Spec{ID: id, Command: "sh", Args: sh(script)}); err != nil {
					t.Error(err)
					return
				}
				if i%3 == 2 { // a stream closed before its end, then read again in full
					s, err := h.tls.Output(t.Context(), id, 1)
					if err != nil {
						t.Error(err)
						return
					}
					_, _ = s.Next()
					_ = s.Close()
				}
				chunks, exit, err := output(t.Context(), h.tls, id, 1)
				if err != nil {
					t.Error(err)
					return
				}
				if got := summarize(t, chunks, exit); got.Stdout != want {
					t.Errorf("exec %s printed %d bytes ending %q, want %d ending %q", marker, len(got.Stdout), tail(got.Stdout), len(want), tail(want))
				}
			}
		})
	}
	wg.Wait()
}

func tail(s string) string { return s[max(0, len(s)-12):] }
