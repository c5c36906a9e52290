package sandboxd

import (
	"bytes"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubeclip/kubeclip/pkg/execspec"
)

// TestTailRing: the ring holds the last bytes written, whatever the sizes of the writes.
func TestTailRing(t *testing.T) {
	for _, tc := range []struct {
		name   string
		size   int
		writes []int
	}{
		{"under the size", 8, []int{3, 2}},
		{"exactly the size", 8, []int{5, 3}},
		{"wraps", 8, []int{5, 5, 5}},
		{"one write over the size", 8, []int{3, 20}},
		{"many small", 7, []int{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &tailRing{buf: make([]byte, tc.size)}
			var all []byte
			for i, n := range tc.writes {
				p := bytes.Repeat([]byte{byte('a' + i)}, n)
				for k := range p {
					p[k] += byte(k % 2) // not all one byte, so an order mistake shows
				}
				r.write(p)
				all = append(all, p...)
			}
			got, dropped := r.kept()
			want := all[max(0, len(all)-tc.size):]
			if !bytes.Equal(got, want) || dropped != int64(len(all)-len(want)) {
				t.Errorf("kept %q dropped %d; want %q dropped %d", got, dropped, want, len(all)-len(want))
			}
		})
	}
}

// stdoutOf follows j from seq 1 and returns its stdout and the exit.
func stdoutOf(t *testing.T, j *journal) (string, *execspec.Exit) {
	t.Helper()
	frames, err := readAll(t, j, 1)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	var exit *execspec.Exit
	for i, f := range frames {
		switch f := f.(type) {
		case *Chunk:
			if f.Seq != uint64(i+1) {
				t.Fatalf("frame %d has seq %d", i, f.Seq)
			}
			if f.Stream == Stdout {
				out.Write(f.Data)
			}
		case *execspec.Exit:
			exit = f
		}
	}
	if exit == nil {
		t.Fatal("no exit frame")
	}
	return out.String(), exit
}

// TestJournalKeepsTail (issue 26 item 16): a command that prints far more than its cap and
// then its result line gets the head and the tail journaled, the result line last, within the
// cap; a marker says how much was skipped. Before, the journal kept the first bytes only and
// the result line never reached the client.
func TestJournalKeepsTail(t *testing.T) {
	const limit = 1 << 20 // tailKeep: 64 KiB per stream
	budget := newByteBudget(DefaultJournalMemory)
	j := newJournal(filepath.Join(t.TempDir(), "x"+journalExt), limit, budget, newByteBudget(DefaultJournalDisk))
	var printed int
	for i := 0; printed < 4*limit; i++ {
		line := fmt.Sprintf(`{"type":"assistant","n":%d,"filler":"%s"}`+"\n", i, strings.Repeat("w", i%300))
		appendChunk(j, Stdout, line)
		printed += len(line)
	}
	appendChunk(j, Stderr, "a warning\n")
	result := `{"type":"result","subtype":"success","result":"done"}` + "\n"
	appendChunk(j, Stdout, result)
	exit := j.finish(execspec.Exit{})

	out, last := stdoutOf(t, j)
	if !strings.HasPrefix(out, `{"type":"assistant","n":0,`) {
		t.Errorf("stdout starts %q; want the first line", out[:min(len(out), 60)])
	}
	if !strings.HasSuffix(out, result) {
		t.Errorf("stdout ends %q; want the result line", out[max(0, len(out)-120):])
	}
	marker := strings.Index(out, "\n[sandboxd: ")
	if marker < 0 {
		t.Fatal("no marker where output was skipped")
	}
	// After the marker, whole lines: the tail starts at a line's beginning.
	after := out[marker+1:]
	after = after[strings.IndexByte(after, '\n')+1:]
	if !strings.HasPrefix(after, `{"type":"assistant","n":`) {
		t.Errorf("the tail starts %q; want a whole line", after[:min(len(after), 60)])
	}
	if !exit.Truncated || !last.Truncated {
		t.Errorf("exit %+v: want truncated", exit)
	}
	if j.size > limit {
		t.Errorf("journal holds %d bytes; cap %d", j.size, limit)
	}
	if got := int64(len(out)); got != last.StdoutBytes {
		t.Errorf("read %d bytes of stdout; the exit counts %d", got, last.StdoutBytes)
	}
	if left := budget.left.Load(); left != DefaultJournalMemory-int64(len(j.mem)) {
		t.Errorf("memory budget left %d after finish; want the tails' memory back", left)
	}
}

// TestJournalTailFits: output past the head that fits within the cap is journaled whole, with no
// marker and not truncated.
func TestJournalTailFits(t *testing.T) {
	const limit = 1 << 20
	j := newJournal(filepath.Join(t.TempDir(), "x"+journalExt), limit, newByteBudget(DefaultJournalMemory), newByteBudget(DefaultJournalDisk))
	var want strings.Builder
	past := 0 // chunks past the head: 16 KiB, well within the 64 KiB tail
	for i := 0; past < 16; i++ {
		if j.size >= j.head {
			past++
		}
		line := fmt.Sprintf("%-1023d\n", i)
		appendChunk(j, Stdout, line)
		want.WriteString(line)
	}
	j.finish(execspec.Exit{})
	out, exit := stdoutOf(t, j)
	if out != want.String() {
		t.Errorf("stdout differs from what was printed (%d bytes read, %d printed)", len(out), want.Len())
	}
	if exit.Truncated {
		t.Errorf("exit %+v: want not truncated", exit)
	}
}

// TestJournalTailWithoutMemory: with the journals' memory budget spent, output past the head is
// dropped as before tails, and the exit says truncated.
func TestJournalTailWithoutMemory(t *testing.T) {
	const limit = 1 << 20
	j := newJournal(filepath.Join(t.TempDir(), "x"+journalExt), limit, newByteBudget(0), newByteBudget(DefaultJournalDisk))
	for range 2 * limit / 1024 {
		appendChunk(j, Stdout, strings.Repeat("x", 1023)+"\n")
	}
	appendChunk(j, Stdout, "last\n")
	j.finish(execspec.Exit{})
	out, exit := stdoutOf(t, j)
	if strings.HasSuffix(out, "last\n") || !exit.Truncated {
		t.Errorf("exit %+v, stdout ends %q: want the head only, truncated", exit, out[max(0, len(out)-20):])
	}
}
