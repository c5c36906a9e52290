package sandboxd_test

import (
	"encoding/binary"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kubeclip/kubeclip/pkg/execspec"
	"github.com/kubeclip/kubeclip/pkg/sandboxd"
)

// frame is a frame as sandboxd writes it: type, stream, seq, length, payload.
func frame(typ byte, stream sandboxd.Stream, seq uint64, payload string) []byte {
	b := make([]byte, 14, 14+len(payload))
	b[0], b[1] = typ, byte(stream)
	binary.BigEndian.PutUint64(b[2:10], seq)
	binary.BigEndian.PutUint32(b[10:14], uint32(len(payload)))
	return append(b, payload...)
}

// slowBudget grants every Take after wait, and counts what is held.
type slowBudget struct {
	wait time.Duration
	mu   sync.Mutex
	held int
}

func (b *slowBudget) Take(n int) error {
	time.Sleep(b.wait)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.held += n
	return nil
}

func (b *slowBudget) Release(n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.held -= n
}

// TestOutputWaitsForItsBudget: a stream charged to a budget reads each frame's payload only once
// its bytes are granted; a grant that takes longer than the stall timeout is not a stall. Chunks
// stay charged until the caller releases them; heartbeat and exit frames are released by Next.
func TestOutputWaitsForItsBudget(t *testing.T) {
	wire := append(frame('o', sandboxd.Stdout, 1, "hello "), frame('h', 0, 1, "")...)
	wire = append(wire, frame('o', sandboxd.Stdout, 2, "world")...)
	wire = append(wire, frame('x', 0, 2, `{"exitCode":0,"lastSeq":2}`)...)
	// The first header alone, then the rest: the first payload is still on the wire while its
	// Take waits.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(wire[:14])
		w.(http.Flusher).Flush()
		time.Sleep(50 * time.Millisecond)
		_, _ = w.Write(wire[14:])
	}))
	defer srv.Close()
	const stall = 200 * time.Millisecond
	c, err := sandboxd.NewClient(sandboxd.ClientOptions{Dial: sandboxd.DialTCP(strings.TrimPrefix(srv.URL, "http://")), StallTimeout: stall})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.Output(t.Context(), "x", 1)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	b := &slowBudget{wait: 3 * stall}
	s.Charge(b)
	var out strings.Builder
	for {
		f, err := s.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("after %q: %v", out.String(), err)
		}
		switch f := f.(type) {
		case *sandboxd.Chunk:
			if b.held != len(f.Data) {
				t.Errorf("a chunk of %d bytes returned with %d held, want it held until released", len(f.Data), b.held)
			}
			out.Write(f.Data)
			b.Release(len(f.Data))
		case *execspec.Exit:
			if b.held != 0 {
				t.Errorf("%d bytes held after the exit frame, want 0", b.held)
			}
		}
	}
	if out.String() != "hello world" {
		t.Errorf("output %q, want %q", out.String(), "hello world")
	}
}
