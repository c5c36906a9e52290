package sandboxd_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kubeclip/kubeclip/pkg/sandboxd"
)

// TestStdinOffsets: stdin is accepted only at the current offset; a mismatch answers 409 with
// the offset to resend from, and a retried final write is answered like the first.
func TestStdinOffsets(t *testing.T) {
	h := startServer(t, nil)
	ctx := t.Context()
	id := newID()
	if _, err := h.tls.Start(ctx, sandboxd.Spec{ID: id, Command: "cat", Stdin: true}); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name       string
		offset     int64
		data       string
		eof        bool
		wantOffset int64
		wantErr    error
	}{
		{"first", 0, "hello ", false, 6, nil},
		{"resent (the answer was lost)", 0, "hello ", false, 6, sandboxd.ErrOffsetMismatch},
		{"ahead", 9, "x", false, 6, sandboxd.ErrOffsetMismatch},
		{"empty write", 6, "", false, 6, nil},
		{"last", 6, "world", true, 11, nil},
		{"last resent", 11, "", true, 11, nil},
		{"after eof", 11, "more", false, 11, sandboxd.ErrStdinClosed},
	}
	for _, st := range steps {
		off, err := h.tls.WriteStdin(ctx, id, st.offset, []byte(st.data), st.eof)
		if !errors.Is(err, st.wantErr) || off != st.wantOffset {
			t.Errorf("%s: offset %d, err %v; want %d, %v", st.name, off, err, st.wantOffset, st.wantErr)
		}
		var ae *sandboxd.APIError
		if st.wantErr != nil && (!errors.As(err, &ae) || ae.Status != http.StatusConflict || ae.Offset != st.wantOffset) {
			t.Errorf("%s: %#v, want a 409 carrying offset %d", st.name, ae, st.wantOffset)
		}
	}
	chunks, exit, err := output(ctx, h.tls, id, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got := summarize(t, chunks, exit).Stdout; got != "hello world" {
		t.Errorf("stdout %q, want %q", got, "hello world")
	}
}

// TestErrorCodes produces every error code of the API through the client and checks its status
// and sentinel: each code has a producer, and each answer means one thing.
func TestErrorCodes(t *testing.T) {
	h := startServer(t, nil)
	d := startServer(t, nil) // to be drained
	warm := startUnbound(t, nil)
	ctx := t.Context()
	exited := newID()
	run(t, h.tls, sandboxd.Spec{ID: exited, Command: "true"}, nil)
	sleeping := newID()
	if _, err := h.tls.Start(ctx, sandboxd.Spec{ID: sleeping, Command: "sleep", Args: []string{"30"}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.tls.Signal(context.Background(), sleeping, "SIGKILL") })

	producers := map[string]func(t *testing.T) error{
		sandboxd.CodeInvalidRequest: func(*testing.T) error {
			_, err := h.tls.Start(ctx, sandboxd.Spec{ID: "no/slash", Command: "true"})
			return err
		},
		sandboxd.CodeUnauthorized: func(t *testing.T) error {
			c := newClient(t, sandboxd.ClientOptions{Dial: sandboxd.DialTCP(h.addr), TLS: sandboxd.ClientTLSConfig(testSeed), Token: "wrong"})
			_, err := c.Info(ctx)
			return err
		},
		sandboxd.CodeNotFound: func(*testing.T) error { return h.tls.Delete(ctx, "never-started") },
		sandboxd.CodeSpecMismatch: func(*testing.T) error {
			_, err := h.tls.Start(ctx, sandboxd.Spec{ID: exited, Command: "false"})
			return err
		},
		sandboxd.CodeOffsetMismatch: func(*testing.T) error {
			_, err := h.tls.WriteStdin(ctx, exited, 5, nil, false)
			return err
		},
		sandboxd.CodeStdinClosed: func(*testing.T) error {
			_, err := h.tls.WriteStdin(ctx, sleeping, 0, []byte("x"), false) // started without stdin
			return err
		},
		sandboxd.CodeRunning: func(*testing.T) error { return h.tls.Delete(ctx, sleeping) },
		sandboxd.CodeExited:  func(*testing.T) error { return h.tls.Signal(ctx, exited, "SIGTERM") },
		sandboxd.CodeNotBound: func(*testing.T) error {
			_, err := warm.unix.Info(ctx)
			return err
		},
		sandboxd.CodeAlreadyBound: func(*testing.T) error {
			// Keyed by h's lease seed, the bind reaches h's bind route, where a bound daemon
			// refuses it; the probe with another seed then fails its handshake.
			return sandboxd.Bind(ctx, sandboxd.DialTCP(h.addr), testSeed, otherLease, nil)
		},
		sandboxd.CodeTooLarge: func(*testing.T) error {
			_, err := h.tls.Start(ctx, sandboxd.Spec{ID: newID(), Command: "echo", Args: []string{strings.Repeat("x", 5<<20)}})
			return err
		},
		sandboxd.CodeDraining: func(t *testing.T) error {
			holding := newID() // keeps the server draining instead of stopped
			if _, err := d.unix.Start(ctx, sandboxd.Spec{ID: holding, Command: "cat", Stdin: true}); err != nil {
				t.Fatal(err)
			}
			defer func() { _, _ = d.unix.WriteStdin(ctx, holding, 0, nil, true) }()
			d.stop()
			eventually(t, "the second server drains", func() bool {
				info, err := d.unix.Info(ctx)
				return err == nil && info.Draining
			})
			_, err := d.unix.Start(ctx, sandboxd.Spec{ID: newID(), Command: "true"})
			return err
		},
	}
	sentinels := map[string]error{
		sandboxd.CodeInvalidRequest: sandboxd.ErrInvalidRequest, sandboxd.CodeUnauthorized: sandboxd.ErrUnauthorized,
		sandboxd.CodeNotFound: sandboxd.ErrNotFound, sandboxd.CodeSpecMismatch: sandboxd.ErrSpecMismatch,
		sandboxd.CodeOffsetMismatch: sandboxd.ErrOffsetMismatch, sandboxd.CodeStdinClosed: sandboxd.ErrStdinClosed,
		sandboxd.CodeRunning: sandboxd.ErrRunning, sandboxd.CodeExited: sandboxd.ErrExited,
		sandboxd.CodeTooLarge: sandboxd.ErrTooLarge, sandboxd.CodeDraining: sandboxd.ErrDraining,
		sandboxd.CodeInternal: sandboxd.ErrInternal, sandboxd.CodeNotBound: sandboxd.ErrNotBound,
		sandboxd.CodeAlreadyBound: sandboxd.ErrAlreadyBound,
	}
	// Codes no request can produce on a healthy node.
	unproducible := map[string]string{
		sandboxd.CodeInternal: "kill(2) failing with anything but ESRCH (EPERM: never for root, the test's user)",
	}
	codes := sandboxd.KnownCodes()
	var known, produced []string
	for code := range codes {
		known = append(known, code)
	}
	for code := range producers {
		produced = append(produced, code)
	}
	for code := range unproducible {
		produced = append(produced, code)
	}
	if diff := cmp.Diff(known, produced, sortStrings); diff != "" {
		t.Fatalf("codes without a producer here (-known +produced):\n%s", diff)
	}
	for code, produce := range producers {
		t.Run(code, func(t *testing.T) {
			err := produce(t)
			var ae *sandboxd.APIError
			if !errors.As(err, &ae) {
				t.Fatalf("error %v is not an *APIError", err)
			}
			if ae.Code != code || ae.Status != codes[code] {
				t.Errorf("answer %d %s, want %d %s", ae.Status, ae.Code, codes[code], code)
			}
			for other, sentinel := range sentinels {
				if errors.Is(err, sentinel) != (other == code) {
					t.Errorf("errors.Is(err, %v) = %v", sentinel, other != code)
				}
			}
		})
	}
}
