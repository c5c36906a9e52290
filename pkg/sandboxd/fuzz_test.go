package sandboxd

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kubeclip/kubeclip/pkg/execspec"
)

// The targets below feed sandboxd's decoders: the frame stream a client reads from a pod the
// tenant runs code in, the exec spec a request carries, and the seed in the pod's environment.
// Their seed corpora under testdata/fuzz run with every `go test`; `make fuzz` explores.

func FuzzReadFrame(f *testing.F) {
	code := 3
	f.Add(exitFrame(&execspec.Exit{ExitCode: &code, StderrBytes: 5, LastSeq: 7}))
	f.Fuzz(func(t *testing.T, wire []byte) {
		r := &watchedReader{r: bytes.NewReader(wire)}
		hdr := make([]byte, frameHeaderSize)
		for {
			start := r.read
			fr, err := readFrame(r, hdr)
			n := r.read - start
			// The payload buffer is allocated for the declared length and handed to the reader
			// whole, so the largest read is the largest allocation: never above the limit.
			if r.largest > MaxFramePayload {
				t.Fatalf("read into a %d-byte buffer", r.largest)
			}
			if errors.Is(err, io.EOF) {
				if n != 0 {
					t.Fatalf("io.EOF after %d bytes of a frame", n)
				}
				return
			}
			if err != nil {
				if !errors.Is(err, ErrProtocol) {
					t.Fatalf("error %v is not ErrProtocol", err)
				}
				if n > frameHeaderSize && binary.BigEndian.Uint32(wire[start+10:]) > MaxFramePayload {
					t.Fatalf("read %d bytes of a frame declaring an oversized payload", n)
				}
				return
			}
			// A frame is its header and its declared payload, nothing more: the next starts
			// right after it.
			frame := wire[start : start+n]
			if want := frameHeaderSize + int(binary.BigEndian.Uint32(frame[10:])); n != want {
				t.Fatalf("frame of %d bytes consumed %d", want, n)
			}
			switch fr := fr.(type) {
			case *Chunk:
				again := make([]byte, frameHeaderSize+len(fr.Data))
				putHeader(again, frameOutput, fr.Stream, fr.Seq, copy(again[frameHeaderSize:], fr.Data))
				if !bytes.Equal(again, frame) {
					t.Fatalf("chunk %+v encodes to %q, was %q", fr, again, frame)
				}
			case *execspec.Exit:
				again, err := readFrame(bytes.NewReader(exitFrame(fr)), hdr)
				if err != nil {
					t.Fatalf("reading back exit frame %+v: %v", fr, err)
				}
				if diff := cmp.Diff(fr, again); diff != "" {
					t.Fatalf("exit frame round trip (-first +again):\n%s", diff)
				}
			case *Heartbeat:
				if fr.Seq != binary.BigEndian.Uint64(frame[2:10]) {
					t.Fatalf("heartbeat seq %d, header says %d", fr.Seq, binary.BigEndian.Uint64(frame[2:10]))
				}
			default:
				t.Fatalf("frame of type %T", fr)
			}
		}
	})
}

// watchedReader counts the bytes read and remembers the largest buffer it was handed.
type watchedReader struct {
	r       io.Reader
	read    int
	largest int
}

func (w *watchedReader) Read(p []byte) (int, error) {
	w.largest = max(w.largest, len(p))
	n, err := w.r.Read(p)
	w.read += n
	return n, err
}

func FuzzDecodeSpec(f *testing.F) {
	f.Add([]byte(`{"id":"01J9ZK7Q3X","command":"sh","args":["-c","echo hi"],"cwd":"/workspace","env":{"PATH":"/usr/bin"},"timeoutMs":60000}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		var spec Spec
		err := decodeStrict(bytes.NewReader(body), maxSpecBytes, &spec)
		// The limit is exact: one byte less and the body is too large.
		if len(body) > 0 {
			var short Spec
			if err := decodeStrict(bytes.NewReader(body), int64(len(body)-1), &short); err == nil {
				t.Fatalf("accepted %d bytes with a limit of %d", len(body), len(body)-1)
			}
		}
		if err != nil {
			return
		}
		// A spec decodes the same from its own encoding: a repeated start with it is the same exec.
		data, err := json.Marshal(spec)
		if err != nil {
			t.Fatal(err)
		}
		var again Spec
		if err := decodeStrict(bytes.NewReader(data), maxSpecBytes, &again); err != nil || !spec.equal(again) {
			t.Fatalf("spec %+v re-decodes to %+v (%v)", spec, again, err)
		}

		verr := spec.Validate()
		if verr != nil {
			// Every problem names its field.
			var joined interface{ Unwrap() []error }
			if !errors.As(verr, &joined) {
				t.Fatalf("Validate = %v (%T), want joined field errors", verr, verr)
			}
			for _, err := range joined.Unwrap() {
				var fe *fieldError
				if !errors.As(err, &fe) || fe.Field == "" || fe.Msg == "" {
					t.Fatalf("Validate error %v (%T) names no field", err, err)
				}
			}
			return
		}
		// A valid spec is one execve takes: no NUL anywhere, env names without '='.
		strs := append([]string{spec.ID, spec.Command, spec.Cwd}, spec.Args...)
		strs = append(strs, slices.Collect(maps.Values(spec.Env))...)
		for _, s := range strs {
			if strings.ContainsRune(s, 0) {
				t.Fatalf("valid spec %+v holds a NUL", spec)
			}
		}
		for k := range spec.Env {
			if k == "" || strings.ContainsAny(k, "=\x00") {
				t.Fatalf("valid spec has the variable name %q", k)
			}
		}
		if !execspec.ValidID(spec.ID) || spec.Command == "" || (spec.Cwd != "" && !strings.HasPrefix(spec.Cwd, "/")) || spec.TimeoutMs < 0 || spec.MaxOutputBytes < 0 {
			t.Fatalf("valid spec %+v", spec)
		}
	})
}

func FuzzParseSeed(f *testing.F) {
	f.Add("4d3e4f03f6d58fba21b6d8ce3d677089f159d9adb8e2af341188c4ee319bdf52")
	f.Fuzz(func(t *testing.T, s string) {
		seed, err := execspec.ParseSeed(s)
		if err != nil {
			// An error never quotes the value: it is a secret.
			if len(err.Error()) > 100 {
				t.Fatalf("error of %d bytes: %v", len(err.Error()), err)
			}
			return
		}
		if len(seed) != execspec.SeedSize || hex.EncodeToString(seed) != strings.ToLower(s) {
			t.Fatalf("execspec.ParseSeed(%q) = %x", s, seed)
		}
	})
}
