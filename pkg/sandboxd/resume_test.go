package sandboxd_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kubeclip/kubeclip/pkg/execspec"
	"github.com/kubeclip/kubeclip/pkg/sandboxd"
)

// TestResume: a reader that drops its connection mid-stream and continues from the seq after
// its last chunk ends up with exactly what a full read gets: no gap, no duplicate, one exit.
func TestResume(t *testing.T) {
	h := startServer(t, nil)
	ctx := t.Context()
	id := newID()
	script := `i=0; while [ $i -lt 60 ]; do echo "line $i"; [ $((i % 7)) -eq 0 ] && echo "err $i" >&2; i=$((i+1)); sleep 0.01; done`
	if _, err := h.tls.Start(ctx, sandboxd.Spec{ID: id, Command: "sh", Args: sh(script)}); err != nil {
		t.Fatal(err)
	}

	// First connection: ten chunks from seq 1, then the connection is dropped.
	s, err := h.tls.Output(ctx, id, 1)
	if err != nil {
		t.Fatal(err)
	}
	var got []*sandboxd.Chunk
	for len(got) < 10 {
		f, err := s.Next()
		if err != nil {
			t.Fatal(err)
		}
		if c, ok := f.(*sandboxd.Chunk); ok {
			got = append(got, c)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// Second connection (the unix socket: another route to the same journal) from N+1.
	rest, exit, err := output(ctx, h.unix, id, got[len(got)-1].Seq+1)
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, rest...)

	full, fullExit, err := output(ctx, h.tls, id, 1)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(full, got); diff != "" {
		t.Errorf("resumed chunks differ from a full read (-full +resumed):\n%s", diff)
	}
	if diff := cmp.Diff(fullExit, exit); diff != "" {
		t.Errorf("exit frames differ (-full +resumed):\n%s", diff)
	}
	summarize(t, got, exit) // seqs 1..n, counts match
	if len(full) < 60 {
		t.Errorf("%d chunks for 60 lines written 10 ms apart: reads were merged?", len(full))
	}

	// The exit frame alone, from the seq after the last chunk.
	tail, tailExit, err := output(ctx, h.tls, id, exit.LastSeq+1)
	if err != nil || len(tail) != 0 || tailExit == nil {
		t.Errorf("read from lastSeq+1: %d chunks, exit %v, %v; want the exit frame only", len(tail), tailExit, err)
	}
}

// TestHeartbeat: an idle stream carries heartbeats, then the exit frame.
func TestHeartbeat(t *testing.T) {
	h := startServer(t, func(o *sandboxd.Options) { o.Heartbeat = 20 * time.Millisecond })
	ctx := t.Context()
	id := newID()
	if _, err := h.tls.Start(ctx, sandboxd.Spec{ID: id, Command: "cat", Stdin: true}); err != nil {
		t.Fatal(err)
	}
	s, err := h.tls.Output(ctx, id, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for beats := 0; beats < 3; {
		f, err := s.Next()
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := f.(*sandboxd.Heartbeat); !ok {
			t.Fatalf("frame %T on an idle stream, want heartbeats", f)
		}
		beats++
	}
	if _, err := h.tls.WriteStdin(ctx, id, 0, []byte("x"), true); err != nil {
		t.Fatal(err)
	}
	for {
		f, err := s.Next()
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := f.(*execspec.Exit); ok {
			return
		}
	}
}
