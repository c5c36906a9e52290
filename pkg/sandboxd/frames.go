package sandboxd

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/kubeclip/kubeclip/pkg/execspec"
)

// Frame types (the first byte of a frame).
const (
	frameOutput    = 'o'
	frameExit      = 'x'
	frameHeartbeat = 'h'
)

// frameHeaderSize is type (1) + stream (1) + seq (8, big-endian) + length (4, big-endian).
const frameHeaderSize = 14

// MaxFramePayload bounds what a reader accepts, so a pod's hostile frame costs its reader at
// most this: output chunks are at most one pipe read (readSize), exit frames a little JSON.
const MaxFramePayload = 1 << 20

// readSize is the largest pipe read, and so the largest chunk.
const readSize = 64 << 10

// Stream names a command's output stream.
type Stream byte

// The streams of a chunk; 0 (none) is used by exit and heartbeat frames.
const (
	Stdout Stream = 1
	Stderr Stream = 2
)

func (s Stream) String() string {
	switch s {
	case Stdout:
		return "stdout"
	case Stderr:
		return "stderr"
	default:
		return fmt.Sprintf("stream(%d)", byte(s))
	}
}

// Frame is one element of an output stream: *Chunk, *Heartbeat or *execspec.Exit (the exec
// vocabulary's, so the exec protocol sends the exit frame as it is).
type Frame any

// Chunk is one read of a command's stdout or stderr.
type Chunk struct {
	Seq    uint64
	Stream Stream
	Data   []byte
}

// Heartbeat is sent every second while nothing else is; Seq is the journal's last seq.
type Heartbeat struct{ Seq uint64 }

// ErrProtocol marks a malformed frame stream.
var ErrProtocol = errors.New("sandboxd: malformed frame")

func putHeader(b []byte, typ byte, stream Stream, seq uint64, n int) {
	b[0] = typ
	b[1] = byte(stream)
	binary.BigEndian.PutUint64(b[2:10], seq)
	binary.BigEndian.PutUint32(b[10:14], uint32(n))
}

// appendControlFrame appends a heartbeat or exit frame to b.
func appendControlFrame(b []byte, typ byte, seq uint64, payload []byte) []byte {
	var h [frameHeaderSize]byte
	putHeader(h[:], typ, 0, seq, len(payload))
	return append(append(b, h[:]...), payload...)
}

func exitFrame(e *execspec.Exit) []byte {
	payload, err := json.Marshal(e)
	if err != nil {
		panic(fmt.Sprintf("sandboxd: marshalling an exit frame: %v", err)) // plain struct: cannot fail
	}
	return appendControlFrame(nil, frameExit, e.LastSeq, payload)
}

// readFrame reads one frame from r. hdr is scratch space of frameHeaderSize bytes. It returns
// io.EOF only when r ends between frames; a stream cut inside a frame is an ErrProtocol that
// also matches io.ErrUnexpectedEOF.
func readFrame(r io.Reader, hdr []byte) (Frame, error) { return readFrameCharged(r, hdr, nil) }

// readFrameCharged is readFrame that takes the payload's bytes from budget (when not nil) before
// it reads the payload; on an error they are given back.
func readFrameCharged(r io.Reader, hdr []byte, budget Budget) (Frame, error) {
	if _, err := io.ReadFull(r, hdr[:frameHeaderSize]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("%w: truncated header: %w", ErrProtocol, err)
		}
		return nil, err
	}
	typ, stream := hdr[0], Stream(hdr[1])
	seq := binary.BigEndian.Uint64(hdr[2:10])
	n := binary.BigEndian.Uint32(hdr[10:14])
	if n > MaxFramePayload {
		return nil, fmt.Errorf("%w: %d-byte payload", ErrProtocol, n)
	}
	if budget != nil {
		if err := budget.Take(int(n)); err != nil {
			return nil, err
		}
	}
	f, err := readPayload(r, typ, stream, seq, n)
	if err != nil && budget != nil {
		budget.Release(int(n))
	}
	return f, err
}

func readPayload(r io.Reader, typ byte, stream Stream, seq uint64, n uint32) (Frame, error) {
	payload := make([]byte, n)
	if _, err := io.ReadFull(r, payload); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF // the header came, the payload did not: not the end between frames
		}
		return nil, fmt.Errorf("%w: truncated payload: %w", ErrProtocol, err)
	}
	switch typ {
	case frameOutput:
		if stream != Stdout && stream != Stderr {
			return nil, fmt.Errorf("%w: output frame on %s", ErrProtocol, stream)
		}
		return &Chunk{Seq: seq, Stream: stream, Data: payload}, nil
	case frameHeartbeat:
		return &Heartbeat{Seq: seq}, nil
	case frameExit:
		var e execspec.Exit
		if err := json.Unmarshal(payload, &e); err != nil {
			return nil, fmt.Errorf("%w: exit frame: %w", ErrProtocol, err)
		}
		return &e, nil
	default:
		return nil, fmt.Errorf("%w: type %q", ErrProtocol, typ)
	}
}
