package sandboxd

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kubeclip/kubeclip/pkg/execspec"
)

func appendChunk(j *journal, stream Stream, data string) {
	buf := make([]byte, frameHeaderSize+len(data))
	copy(buf[frameHeaderSize:], data)
	j.append(stream, buf)
}

// readAll follows j from seq from to its exit frame.
func readAll(t *testing.T, j *journal, from uint64) ([]Frame, error) {
	t.Helper()
	f, err := j.follow(from)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := f.stream(t.Context(), &buf, func() error { return nil }, time.Hour); err != nil {
		t.Fatal(err)
	}
	var frames []Frame
	hdr := make([]byte, frameHeaderSize)
	for {
		fr, err := readFrame(&buf, hdr)
		if errors.Is(err, io.EOF) {
			return frames, nil
		}
		if err != nil {
			t.Fatal(err)
		}
		frames = append(frames, fr)
	}
}

// TestJournalFollowFrom reads a journal from seqs on both sides of sparse-index marks, with the
// journal in memory, on disk, and moved to disk part way.
func TestJournalFollowFrom(t *testing.T) {
	const n = 3*markStride + 5 // several marks, and a partial last stride
	for _, tc := range []struct {
		name        string
		budget      int64
		wantSpilled bool
	}{
		{"in memory", DefaultJournalMemory, false},
		{"on disk", 0, true},
		{"moved to disk", 5000, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := newJournal(filepath.Join(t.TempDir(), "x"+journalExt), 1<<20, newByteBudget(tc.budget), newByteBudget(DefaultJournalDisk))
			var want []Frame
			for i := 1; i <= n; i++ {
				stream := Stream(1 + i%2)
				data := fmt.Sprintf("chunk %d %s", i, bytes.Repeat([]byte("x"), i%17))
				appendChunk(j, stream, data)
				want = append(want, &Chunk{Seq: uint64(i), Stream: stream, Data: []byte(data)})
			}
			code := 0
			exit := j.finish(execspec.Exit{ExitCode: &code})
			if exit.LastSeq != n || exit.Error != "" {
				t.Fatalf("exit %+v, want LastSeq %d", exit, n)
			}
			if j.view().spilled != tc.wantSpilled {
				t.Errorf("spilled = %v, want %v", !tc.wantSpilled, tc.wantSpilled)
			}
			want = append(want, &exit)
			for _, from := range []uint64{1, 2, markStride, markStride + 1, markStride + 2, 2*markStride + 77, n, n + 1} {
				got, err := readAll(t, j, from)
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(want[from-1:], got); diff != "" {
					t.Errorf("from %d: frames (-want +got):\n%s", from, diff)
				}
			}
			for _, from := range []uint64{0, n + 2} {
				if _, err := j.follow(from); !errors.Is(err, errFromBeyond) {
					t.Errorf("follow(%d) = %v, want errFromBeyond", from, err)
				}
			}
			if err := j.remove(); err != nil {
				t.Fatal(err)
			}
			if left := j.budget.left.Load(); left != tc.budget {
				t.Errorf("memory budget after remove: %d, want %d back", left, tc.budget)
			}
		})
	}
}

// TestJournalFollowAcrossSpill: a follower reading the in-memory journal continues in the file
// when the journal moves there.
func TestJournalFollowAcrossSpill(t *testing.T) {
	j := newJournal(filepath.Join(t.TempDir(), "x"+journalExt), 1<<20, newByteBudget(DefaultJournalMemory), newByteBudget(DefaultJournalDisk))
	appendChunk(j, Stdout, "small")
	f, err := j.follow(1)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	done := make(chan error, 1)
	go func() { done <- f.stream(t.Context(), &buf, func() error { return nil }, time.Hour) }()
	eventually(t, "the follower sent the first chunk", func() bool { return j.view().size > 0 && !j.view().spilled })
	big := string(bytes.Repeat([]byte("y"), memJournalMax))
	appendChunk(j, Stderr, big)
	if !j.view().spilled {
		t.Fatal("a journal over memJournalMax is still in memory")
	}
	j.finish(execspec.Exit{})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var got []Frame
	hdr := make([]byte, frameHeaderSize)
	for buf.Len() > 0 {
		fr, err := readFrame(&buf, hdr)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, fr)
	}
	want := []Frame{
		&Chunk{Seq: 1, Stream: Stdout, Data: []byte("small")},
		&Chunk{Seq: 2, Stream: Stderr, Data: []byte(big)},
		&execspec.Exit{StdoutBytes: 5, StderrBytes: memJournalMax, LastSeq: 2},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("frames (-want +got):\n%s", diff)
	}
}

// eventually polls cond every 10 ms for up to 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestJournalCap: the cap bounds the file (payload plus a header per chunk); the chunk that
// crosses it is cut, later ones are dropped, seqs stay contiguous.
func TestJournalCap(t *testing.T) {
	const limit = 3*frameHeaderSize + 25
	j := newJournal(filepath.Join(t.TempDir(), "x"+journalExt), limit, newByteBudget(DefaultJournalMemory), newByteBudget(DefaultJournalDisk))
	appendChunk(j, Stdout, "0123456789")           // 24 bytes: fits
	appendChunk(j, Stderr, "abcdefghij")           // 48: fits
	appendChunk(j, Stdout, "ABCDEFGHIJKLMNOPQRST") // 5 of 20 fit
	appendChunk(j, Stdout, "dropped")
	exit := j.finish(execspec.Exit{})
	got, err := readAll(t, j, 1)
	if err != nil {
		t.Fatal(err)
	}
	want := []Frame{
		&Chunk{Seq: 1, Stream: Stdout, Data: []byte("0123456789")},
		&Chunk{Seq: 2, Stream: Stderr, Data: []byte("abcdefghij")},
		&Chunk{Seq: 3, Stream: Stdout, Data: []byte("ABCDE")},
		&execspec.Exit{StdoutBytes: 15, StderrBytes: 10, Truncated: true, LastSeq: 3},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("frames (-want +got):\n%s", diff)
	}
	if exit.LastSeq != 3 || !exit.Truncated {
		t.Errorf("exit = %+v", exit)
	}
}

// TestJournalFollowAfterRemove: the exec's own client deletes the journal (its close) while an
// observer still streams it; the observer gets the rest and the exit, not a panicking handler.
func TestJournalFollowAfterRemove(t *testing.T) {
	j := newJournal(filepath.Join(t.TempDir(), "x"+journalExt), 1<<20, newByteBudget(DefaultJournalMemory), newByteBudget(DefaultJournalDisk))
	appendChunk(j, Stdout, "line 1\n")
	f, err := j.follow(1)
	if err != nil {
		t.Fatal(err)
	}
	appendChunk(j, Stdout, "line 2\n")
	j.finish(execspec.Exit{})
	if err := j.remove(); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := f.stream(t.Context(), &buf, func() error { return nil }, time.Hour); err != nil {
		t.Fatal(err)
	}
	var got []string
	hdr := make([]byte, frameHeaderSize)
	for buf.Len() > 0 {
		fr, err := readFrame(&buf, hdr)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%T", fr))
	}
	if diff := cmp.Diff([]string{"*sandboxd.Chunk", "*sandboxd.Chunk", "*execspec.Exit"}, got); diff != "" {
		t.Errorf("frames after remove (-want +got):\n%s", diff)
	}
}
