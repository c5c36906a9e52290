package k8s

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
)

var t0 = time.Date(2026, 8, 1, 12, 0, 0, 0, time.UTC)

// at is t0 plus sec seconds and nsec nanoseconds.
func at(sec, nsec int) time.Time {
	return t0.Add(time.Duration(sec)*time.Second + time.Duration(nsec))
}

// kl formats one kubelet log line.
func kl(ts time.Time, text string) string {
	return ts.Format("2006-01-02T15:04:05.000000000Z07:00") + " " + text + "\n"
}

var errCut = errors.New("connection reset by peer")

// stream is one log request's body as the decoder sees it.
type stream struct {
	data  string
	err   error // returned after data; nil means io.EOF
	final bool  // a non-follow read after the container terminated
}

func (s stream) reader() io.Reader {
	if s.err == nil {
		return strings.NewReader(s.data)
	}
	return io.MultiReader(strings.NewReader(s.data), errReader{s.err})
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

// cursorOf is the cursor after the given kubelet lines were delivered.
func cursorOf(lines ...string) Cursor {
	var c Cursor
	for _, l := range lines {
		i := strings.IndexByte(l, ' ')
		ts, err := time.Parse(time.RFC3339Nano, l[:i])
		if err != nil {
			panic(err)
		}
		c.Add(Line{Time: ts, Text: strings.TrimSuffix(l[i+1:], "\n")})
	}
	return c
}

// replay is the kubelet's answer to a request resuming at c: every line from SinceTime on.
func replay(c Cursor, lines ...string) string {
	since := sinceTime(c).Time
	var b strings.Builder
	for _, l := range lines {
		ts, err := time.Parse(time.RFC3339Nano, l[:strings.IndexByte(l, ' ')])
		if err != nil || !ts.Before(since) {
			b.WriteString(l)
		}
	}
	return b.String()
}

func TestLogDecoder(t *testing.T) {
	a := kl(at(1, 100), "a")
	b := kl(at(1, 200), "b")
	c := kl(at(1, 300), "c")
	d := kl(at(2, 0), "d")
	same1, same2, same3 := kl(at(3, 5), "s1"), kl(at(3, 5), "s2"), kl(at(3, 5), "s3")
	long := kl(at(4, 0), strings.Repeat("x", 25))
	huge := kl(at(8, 0), strings.Repeat("0123456789", 15_000)) // 150 kB of text
	var hugePieces []string
	for range 15 {
		hugePieces = append(hugePieces, strings.Repeat("0123456789", 1000))
	}

	tests := []struct {
		name      string
		from      Cursor
		maxLine   int
		streams   []stream
		wantTexts []string
		wantTime  time.Time
		// wantPerStream, when set, is how many lines each stream delivered.
		wantPerStream []int
	}{
		{
			name:      "one stream",
			streams:   []stream{{data: a + b + c}},
			wantTexts: []string{"a", "b", "c"},
			wantTime:  at(1, 300),
		},
		{
			name: "same-second lines across a reconnect",
			streams: []stream{
				{data: a + b + c[:10], err: errCut},
				{data: replay(cursorOf(a, b), a, b, c, d)},
			},
			wantTexts:     []string{"a", "b", "c", "d"},
			wantTime:      at(2, 0),
			wantPerStream: []int{2, 2},
		},
		{
			name: "identical nanosecond timestamps across a reconnect",
			streams: []stream{
				{data: same1 + same2, err: errCut},
				{data: same1 + same2 + same3},
			},
			wantTexts: []string{"s1", "s2", "s3"},
			wantTime:  at(3, 5),
		},
		{
			name:      "resume from a cursor given by the caller",
			from:      cursorOf(a, same1, same2),
			streams:   []stream{{data: replay(cursorOf(a, same1, same2), a, same1, same2, same3, long)}},
			maxLine:   1 << 20,
			wantTexts: []string{"s3", strings.Repeat("x", 25)},
			wantTime:  at(4, 0),
		},
		{
			name: "partial final line of a follow stream is held back",
			streams: []stream{
				{data: a + strings.TrimSuffix(b, "\n")},
			},
			wantTexts: []string{"a"},
			wantTime:  at(1, 100),
		},
		{
			name: "partial final line of the final read is delivered",
			streams: []stream{
				{data: a + strings.TrimSuffix(b, "\n")},
				{data: a + strings.TrimSuffix(b, "\n"), final: true},
			},
			wantTexts: []string{"a", "b"},
			wantTime:  at(1, 200),
		},
		{
			name: "a cut final read holds back its partial line",
			streams: []stream{
				{data: a + b[:20], err: errCut, final: true},
			},
			wantTexts: []string{"a"},
			wantTime:  at(1, 100),
		},
		{
			name:      "long line split into pieces",
			maxLine:   10,
			streams:   []stream{{data: long + kl(at(5, 0), "e")}},
			wantTexts: []string{"xxxxxxxxxx", "xxxxxxxxxx", "xxxxx", "e"},
			wantTime:  at(5, 0),
		},
		{
			name:    "long line cut mid-way resumes at the next piece",
			maxLine: 10,
			streams: []stream{
				{data: long[:len(long)-10], err: errCut}, // prefix + 15 bytes: one whole piece
				{data: long + kl(at(5, 0), "e")},
			},
			wantTexts: []string{"xxxxxxxxxx", "xxxxxxxxxx", "xxxxx", "e"},
			wantTime:  at(5, 0),
		},
		{
			// The first stream gets past the 64 KiB read buffer, so some pieces go out before
			// the cut; the replay must skip exactly those.
			name:    "huge line cut after some pieces went out",
			maxLine: 10_000,
			streams: []stream{
				{data: huge[:100_000], err: errCut},
				{data: huge + kl(at(9, 0), "e")},
			},
			wantTexts:     append(hugePieces, "e"),
			wantTime:      at(9, 0),
			wantPerStream: []int{6, 10},
		},
		{
			name:      "line of exactly maxLine bytes is one piece",
			maxLine:   25,
			streams:   []stream{{data: long}},
			wantTexts: []string{strings.Repeat("x", 25)},
			wantTime:  at(4, 0),
		},
		{
			name:      "line longer than the read buffer",
			maxLine:   1 << 20,
			streams:   []stream{{data: kl(at(1, 0), strings.Repeat("y", 200_000)) + d}},
			wantTexts: []string{strings.Repeat("y", 200_000), "d"},
			wantTime:  at(2, 0),
		},
		{
			name:      "empty line",
			streams:   []stream{{data: kl(at(1, 0), "") + d}},
			wantTexts: []string{"", "d"},
			wantTime:  at(2, 0),
		},
		{
			name:      "line without timestamp takes the previous one",
			streams:   []stream{{data: a + "no timestamp here\n" + d}},
			wantTexts: []string{"a", "no timestamp here", "d"},
			wantTime:  at(2, 0),
		},
		{
			name:      "stderr line a little older than a delivered stdout line",
			from:      cursorOf(kl(at(5, 0), "out")),
			streams:   []stream{{data: kl(at(5, 0), "out") + kl(at(4, 999_999_000), "err") + kl(at(6, 0), "next")}},
			wantTexts: []string{"err", "next"},
			wantTime:  at(6, 0),
		},
		{
			name: "stderr line older than a stdout line, across a reconnect",
			streams: []stream{
				{data: kl(at(5, 0), "out"), err: errCut},
				{data: kl(at(5, 0), "out") + kl(at(4, 999_999_000), "err") + kl(at(6, 0), "next")},
			},
			wantTexts: []string{"out", "err", "next"},
			wantTime:  at(6, 0),
		},
		{
			name:      "lines older than the reorder window were delivered",
			from:      cursorOf(kl(at(9, 0), "late")),
			streams:   []stream{{data: kl(at(6, 0), "old") + kl(at(7, 500), "recent") + kl(at(9, 0), "late")}},
			wantTexts: []string{"recent"},
			wantTime:  at(9, 0),
		},
		{
			name:      "windows line ending kept as text",
			streams:   []stream{{data: strings.TrimSuffix(a, "\n") + "\r\n"}},
			wantTexts: []string{"a\r"},
			wantTime:  at(1, 100),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			maxLine := tc.maxLine
			if maxLine == 0 {
				maxLine = DefaultMaxLineBytes
			}
			dec := newLogDecoder(tc.from, maxLine)
			var got []string
			var perStream []int
			for i, s := range tc.streams {
				before := len(got)
				err := dec.decode(s.reader(), s.final, func(l Line) error {
					got = append(got, l.Text)
					return nil
				})
				if !errors.Is(err, s.err) {
					t.Fatalf("stream %d: decode error = %v, want %v", i, err, s.err)
				}
				perStream = append(perStream, len(got)-before)
			}
			if tc.wantPerStream != nil {
				if diff := cmp.Diff(tc.wantPerStream, perStream); diff != "" {
					t.Errorf("lines per stream (-want +got):\n%s", diff)
				}
			}
			if diff := cmp.Diff(tc.wantTexts, got); diff != "" {
				t.Errorf("delivered lines (-want +got):\n%s", diff)
			}
			if !dec.cur.Time.Equal(tc.wantTime) {
				t.Errorf("cursor time = %v, want %v", dec.cur.Time, tc.wantTime)
			}
			// Resuming from the final cursor, a replay of the last stream delivers nothing.
			last := tc.streams[len(tc.streams)-1]
			if last.err == nil {
				again := newLogDecoder(dec.cur, maxLine)
				var more []string
				_ = again.decode(strings.NewReader(last.data), last.final, func(l Line) error {
					more = append(more, l.Text)
					return nil
				})
				if len(more) != 0 {
					t.Errorf("resuming from the final cursor delivered %q again", more)
				}
			}
		})
	}
}

func TestLogDecoderLineFields(t *testing.T) {
	raw := "2026-08-01T12:00:01.000000100Z"
	dec := newLogDecoder(Cursor{}, DefaultMaxLineBytes)
	var got []Line
	err := dec.decode(strings.NewReader(raw+" hello world\nplain\n"), false, func(l Line) error {
		got = append(got, l)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []Line{
		{Time: at(1, 100), TimeRaw: raw, Text: "hello world"},
		{Time: at(1, 100), TimeRaw: "", Text: "plain"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("lines (-want +got):\n%s", diff)
	}
}

func TestLogDecoderEmitErrorKeepsLine(t *testing.T) {
	data := kl(at(1, 0), "a") + kl(at(1, 0), "b") + kl(at(2, 0), "c")
	errFull := errors.New("publish failed")
	dec := newLogDecoder(Cursor{}, DefaultMaxLineBytes)
	var got []string
	err := dec.decode(strings.NewReader(data), false, func(l Line) error {
		if l.Text == "b" {
			return errFull
		}
		got = append(got, l.Text)
		return nil
	})
	var ee *emitError
	if !errors.As(err, &ee) || !errors.Is(err, errFull) {
		t.Fatalf("decode error = %v, want the emit error", err)
	}
	if diff := cmp.Diff(cursorOf(kl(at(1, 0), "a")), dec.cur); diff != "" {
		t.Fatalf("cursor after failed emit (-want +got):\n%s", diff)
	}
	// A new decoder from that cursor retries "b".
	dec = newLogDecoder(dec.cur, DefaultMaxLineBytes)
	if err := dec.decode(strings.NewReader(data), false, func(l Line) error {
		got = append(got, l.Text)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"a", "b", "c"}, got); diff != "" {
		t.Errorf("lines (-want +got):\n%s", diff)
	}
}

func TestPieceLenKeepsRunes(t *testing.T) {
	text := []byte(strings.Repeat("é€", 50)) // 2- and 3-byte runes
	for maxLine := 4; maxLine < 12; maxLine++ {
		dec := newLogDecoder(Cursor{}, maxLine)
		var got []string
		if err := dec.decode(strings.NewReader(kl(at(1, 0), string(text))), false, func(l Line) error {
			got = append(got, l.Text)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if joined := strings.Join(got, ""); joined != string(text) {
			t.Fatalf("maxLine %d: pieces do not join up to the line", maxLine)
		}
		for _, p := range got {
			if len(p) > maxLine || !utf8.ValidString(p) {
				t.Fatalf("maxLine %d: piece %q is too long or cuts a rune", maxLine, p)
			}
		}
	}
}

func TestSinceTime(t *testing.T) {
	if got := sinceTime(Cursor{}); got != nil {
		t.Errorf("sinceTime(zero) = %v, want nil (whole log)", got)
	}
	got := sinceTime(cursorOf(kl(at(7, 999_999_999), "x")))
	if !got.Time.Equal(at(5, 0)) {
		t.Errorf("sinceTime = %v, want %v (the reorder window's start, truncated to the second)", got.Time, at(5, 0))
	}
}

func TestReconnectBackoff(t *testing.T) {
	minWait, maxWait := 250*time.Millisecond, 2*time.Second
	want := []time.Duration{0, 250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 2 * time.Second}
	for i, w := range want {
		if got := reconnectBackoff(i+1, minWait, maxWait); got != w {
			t.Errorf("reconnectBackoff(%d) = %v, want %v", i+1, got, w)
		}
	}
	if got := reconnectBackoff(1000, minWait, maxWait); got != maxWait {
		t.Errorf("reconnectBackoff(1000) = %v, want the cap", got)
	}
}

func TestFollowOptionsDefaults(t *testing.T) {
	got := FollowOptions{}.withDefaults()
	if got.MaxLineBytes != 1<<20 || got.MinBackoff != 250*time.Millisecond || got.MaxBackoff != 5*time.Second {
		t.Errorf("defaults = %d, %v, %v; want 1 MiB, 250ms, 5s", got.MaxLineBytes, got.MinBackoff, got.MaxBackoff)
	}
}

func BenchmarkLogDecoder(b *testing.B) {
	var sb strings.Builder
	for i := range 1000 {
		sb.WriteString(kl(at(i/100, i), fmt.Sprintf(`{"type":"assistant","message":{"content":[{"type":"text","text":"stub line %d"}]}}`, i)))
	}
	data := sb.String()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		dec := newLogDecoder(Cursor{}, DefaultMaxLineBytes)
		if err := dec.decode(strings.NewReader(data), false, func(Line) error { return nil }); err != nil {
			b.Fatal(err)
		}
	}
}

// TestLogGap: a stream resuming from a cursor whose last line the kubelet no longer serves (its
// log rotated away) is a gap, told once with the cursor's time and the first new line's; a stream
// that begins with lines already delivered, or the first stream of a log, is not.
func TestLogGap(t *testing.T) {
	lines := []string{kl(at(1, 0), "a"), kl(at(2, 0), "b"), kl(at(5, 0), "c"), kl(at(6, 0), "d")}
	cur := cursorOf(lines[:2]...)
	tests := []struct {
		name string
		from Cursor
		data string
		want []LogGap
		emit []string
	}{
		{"the file still holds the cursor's line", cur, replay(cur, lines...), nil, []string{"c", "d"}},
		{"rotated past the cursor", cur, lines[2] + lines[3], []LogGap{{After: at(2, 0), Next: at(5, 0)}}, []string{"c", "d"}},
		{"rotated, only the tail left", cur, lines[3], []LogGap{{After: at(2, 0), Next: at(6, 0)}}, []string{"d"}},
		{"the first stream of a log", Cursor{}, lines[2] + lines[3], nil, []string{"c", "d"}},
		{"nothing new", cur, replay(cur, lines[:2]...), nil, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dec := newLogDecoder(tc.from, DefaultMaxLineBytes)
			var gaps []LogGap
			dec.onGap = func(g LogGap) { gaps = append(gaps, g) }
			var got []string
			if err := dec.decode(strings.NewReader(tc.data), true, func(l Line) error {
				got = append(got, l.Text)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, gaps); diff != "" {
				t.Errorf("gaps (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.emit, got); diff != "" {
				t.Errorf("lines (-want +got):\n%s", diff)
			}
		})
	}
}
