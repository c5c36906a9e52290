package sandboxd

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kubeclip/kubeclip/pkg/execspec"
)

func TestFramesRoundTrip(t *testing.T) {
	code := 3
	var wire []byte
	chunk := make([]byte, frameHeaderSize+5)
	copy(chunk[frameHeaderSize:], "hello")
	putHeader(chunk, frameOutput, Stderr, 7, 5)
	wire = append(wire, chunk...)
	wire = appendControlFrame(wire, frameHeartbeat, 7, nil)
	wire = append(wire, exitFrame(&execspec.Exit{ExitCode: &code, StderrBytes: 5, LastSeq: 7})...)

	want := []Frame{
		&Chunk{Seq: 7, Stream: Stderr, Data: []byte("hello")},
		&Heartbeat{Seq: 7},
		&execspec.Exit{ExitCode: &code, StderrBytes: 5, LastSeq: 7},
	}
	var got []Frame
	r := bytes.NewReader(wire)
	hdr := make([]byte, frameHeaderSize)
	for {
		f, err := readFrame(r, hdr)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, f)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("frames (-want +got):\n%s", diff)
	}
}

func TestReadFrameRejects(t *testing.T) {
	header := func(typ byte, stream Stream, n int) []byte {
		b := make([]byte, frameHeaderSize)
		putHeader(b, typ, stream, 1, n)
		return b
	}
	for _, tc := range []struct {
		name string
		wire []byte
	}{
		{"truncated header", []byte{'o', 1, 0}},
		{"truncated payload", append(header(frameOutput, Stdout, 10), "abc"...)},
		{"oversized payload", header(frameOutput, Stdout, MaxFramePayload+1)},
		{"unknown type", header('z', 0, 0)},
		{"output without stream", header(frameOutput, 0, 0)},
		{"exit not JSON", append(header(frameExit, 0, 3), "abc"...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := readFrame(bytes.NewReader(tc.wire), make([]byte, frameHeaderSize))
			if !errors.Is(err, ErrProtocol) {
				t.Errorf("err = %v, want ErrProtocol", err)
			}
		})
	}
}

// A stream cut inside a frame is a truncated frame, never the clean end between frames that
// io.EOF means. FuzzReadFrame found a stream cut right after a header read as its end.
func TestReadFrameCutStream(t *testing.T) {
	wire := make([]byte, frameHeaderSize+5)
	copy(wire[frameHeaderSize:], "hello")
	putHeader(wire, frameOutput, Stdout, 1, 5)
	wire = appendControlFrame(wire, frameHeartbeat, 1, nil)
	boundaries := map[int]bool{0: true, frameHeaderSize + 5: true, len(wire): true}
	for cut := range len(wire) + 1 {
		r := bytes.NewReader(wire[:cut])
		hdr := make([]byte, frameHeaderSize)
		var err error
		for err == nil {
			_, err = readFrame(r, hdr)
		}
		if boundaries[cut] {
			if !errors.Is(err, io.EOF) || errors.Is(err, ErrProtocol) {
				t.Errorf("cut at %d, a frame boundary: err = %v, want io.EOF", cut, err)
			}
			continue
		}
		if !errors.Is(err, ErrProtocol) || !errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			t.Errorf("cut at %d, inside a frame: err = %v, want ErrProtocol and io.ErrUnexpectedEOF", cut, err)
		}
	}
}

// countingBudget records what a stream takes and gives back.
type countingBudget struct {
	held, taken int
	refuse      bool
}

func (b *countingBudget) Take(n int) error {
	if b.refuse {
		return errors.New("no budget")
	}
	b.held += n
	b.taken += n
	return nil
}

func (b *countingBudget) Release(n int) { b.held -= n }

// TestReadFrameCharged: a frame's payload is taken from the budget before it is read; a
// truncated payload gives it back, and a refused take reads nothing of the payload.
func TestReadFrameCharged(t *testing.T) {
	chunk := make([]byte, frameHeaderSize+5)
	copy(chunk[frameHeaderSize:], "hello")
	putHeader(chunk, frameOutput, Stdout, 1, 5)
	hdr := make([]byte, frameHeaderSize)

	b := &countingBudget{}
	if _, err := readFrameCharged(bytes.NewReader(chunk), hdr, b); err != nil {
		t.Fatal(err)
	}
	if b.held != 5 {
		t.Errorf("a chunk read holds %d bytes of the budget, want its 5 until the caller releases them", b.held)
	}

	b = &countingBudget{}
	if _, err := readFrameCharged(bytes.NewReader(chunk[:frameHeaderSize+2]), hdr, b); !errors.Is(err, ErrProtocol) {
		t.Fatalf("truncated payload: %v, want ErrProtocol", err)
	}
	if b.held != 0 || b.taken != 5 {
		t.Errorf("a truncated payload: %d held of %d taken, want 0 of 5", b.held, b.taken)
	}

	r := bytes.NewReader(chunk)
	if _, err := readFrameCharged(r, hdr, &countingBudget{refuse: true}); err == nil {
		t.Fatal("a frame read without its budget")
	}
	if r.Len() != 5 {
		t.Errorf("a refused take read %d bytes of the payload", 5-r.Len())
	}
}
