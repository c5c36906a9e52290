package sandboxd_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kubeclip/kubeclip/pkg/execspec"
	"github.com/kubeclip/kubeclip/pkg/sandboxd"
)

// TestTimeoutKillsTree: at timeoutMs the whole tree dies, including a grandchild that left the
// process group with setsid, and the exit says so.
func TestTimeoutKillsTree(t *testing.T) {
	h := startServer(t, nil)
	ctx := t.Context()
	id := newID()
	// The grandchild prints its pid once it is in a session of its own; its parent stays
	// alive (exec sleep), so the ppid links lead to it.
	spec := sandboxd.Spec{ID: id, Command: "sh", Args: sh(`setsid sh -c 'echo $$; exec sleep 300' & exec sleep 300`), TimeoutMs: 2000}
	res, err := h.tls.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	s, err := h.tls.Output(ctx, id, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var chunks []*sandboxd.Chunk
	var exit *execspec.Exit
	grandchild := 0
	for exit == nil {
		f, err := s.Next()
		if err != nil {
			t.Fatal(err)
		}
		switch f := f.(type) {
		case *sandboxd.Chunk:
			chunks = append(chunks, f)
			if grandchild == 0 {
				if grandchild, err = strconv.Atoi(strings.TrimSpace(string(f.Data))); err != nil {
					t.Fatalf("first chunk %q is not the grandchild's pid", f.Data)
				}
				// Before the timeout: the grandchild is alive and out of the exec's group and
				// session, so only the /proc walk can find it.
				if sid, pgid, ok := sessionOf(grandchild); !ok || sid == res.PID || pgid == res.PID {
					t.Fatalf("grandchild %d: session %d, group %d, alive %v; want alive outside the exec's %d", grandchild, sid, pgid, ok, res.PID)
				}
			}
		case *execspec.Exit:
			exit = f
		}
	}
	got := summarize(t, chunks, exit)
	got.Stdout = ""
	if diff := cmp.Diff(result{Signal: strp("SIGKILL"), TimedOut: true}, got); diff != "" {
		t.Errorf("result (-want +got):\n%s", diff)
	}
	eventually(t, "the setsid'd grandchild is killed and reaped", func() bool { return processGone(grandchild) })
}

// sessionOf reads a process's session and process group from /proc; ok is false once it is gone.
func sessionOf(pid int) (sid, pgid int, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:]) // state ppid pgrp session …
	pgid, err1 := strconv.Atoi(f[2])
	sid, err2 := strconv.Atoi(f[3])
	return sid, pgid, err1 == nil && err2 == nil
}

// TestBackgroundProcesses: a background process does not hold its exec. One that redirected
// its output (a server started with nohup … &) leaves the exec at once and keeps running; one
// that kept the output pipe ends the exec after the grace. Either can be stopped afterwards by
// signalling the exec's process group.
func TestBackgroundProcesses(t *testing.T) {
	h := startServer(t, nil)
	for _, tc := range []struct{ name, script string }{
		{"output redirected", "sleep 30 >/dev/null 2>&1 & echo $!"},
		{"output pipe inherited", "sleep 30 & echo $!"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Far below the background sleep's 30 s: an exec held by it fails here.
			ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
			defer cancel()
			id := newID()
			if _, err := h.tls.Start(ctx, sandboxd.Spec{ID: id, Command: "sh", Args: sh(tc.script)}); err != nil {
				t.Fatal(err)
			}
			chunks, exit, err := output(ctx, h.tls, id, 1)
			if err != nil {
				t.Fatal(err)
			}
			got := summarize(t, chunks, exit)
			bg, err := strconv.Atoi(strings.TrimSpace(got.Stdout))
			if err != nil || got.ExitCode == nil || *got.ExitCode != 0 {
				t.Fatalf("result %+v", got)
			}
			if processGone(bg) {
				t.Fatalf("the background process %d is gone already", bg)
			}
			if err := h.tls.Signal(ctx, id, "SIGKILL"); err != nil {
				t.Fatalf("stopping the exec's background process: %v", err)
			}
			eventually(t, "the background process is killed and reaped", func() bool { return processGone(bg) })
			if err := h.tls.Signal(ctx, id, "SIGKILL"); !errors.Is(err, sandboxd.ErrExited) {
				t.Errorf("signal to an empty process group: %v, want ErrExited", err)
			}
		})
	}
}

// TestOrphansReaped: a process orphaned by its exec's exit is reaped, not left a zombie.
func TestOrphansReaped(t *testing.T) {
	h := startServer(t, nil)
	got := run(t, h.tls, sandboxd.Spec{Command: "sh", Args: sh("sleep 0.2 >/dev/null 2>&1 & echo $!")}, nil)
	orphan, err := strconv.Atoi(strings.TrimSpace(got.Stdout))
	if err != nil {
		t.Fatalf("stdout %q is not a pid", got.Stdout)
	}
	eventually(t, "the orphan exits and is reaped (no zombie left in /proc)", func() bool { return processGone(orphan) })
}

// TestDrain: once the server's context ends it refuses new execs, serves the running one to its
// end, and only then returns.
func TestDrain(t *testing.T) {
	h := startServer(t, nil)
	ctx := t.Context()
	id := newID()
	if _, err := h.tls.Start(ctx, sandboxd.Spec{ID: id, Command: "cat", Stdin: true}); err != nil {
		t.Fatal(err)
	}
	h.stop() // what SIGTERM does in cmd/sandboxd
	eventually(t, "the server drains", func() bool {
		info, err := h.tls.Info(ctx)
		return err == nil && info.Draining && !info.Ready
	})
	if _, err := h.tls.Start(ctx, sandboxd.Spec{ID: newID(), Command: "true"}); !errors.Is(err, sandboxd.ErrDraining) {
		t.Fatalf("start while draining: %v, want ErrDraining", err)
	}
	// A repeated start of the running exec is an attach, answered even now.
	if res, err := h.unix.Start(ctx, sandboxd.Spec{ID: id, Command: "cat", Stdin: true}); err != nil || res.Created {
		t.Fatalf("repeated start while draining: %+v, %v", res, err)
	}
	select {
	case err := <-h.done:
		t.Fatalf("Run returned (%v) while a command was running", err)
	default:
	}
	if _, err := h.tls.WriteStdin(ctx, id, 0, []byte("bye"), true); err != nil {
		t.Fatal(err)
	}
	chunks, exit, err := output(ctx, h.tls, id, 1)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(result{Stdout: "bye", ExitCode: intp(0)}, summarize(t, chunks, exit)); diff != "" {
		t.Errorf("result (-want +got):\n%s", diff)
	}
	select {
	case err := <-h.done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
		h.done <- err
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return after the last command exited")
	}
}

// TestJournalLifetime: a journal goes on DELETE (not while running) or after the TTL, its file
// (output over 64 KiB moves to disk) with it.
func TestJournalLifetime(t *testing.T) {
	h := startServer(t, func(o *sandboxd.Options) { o.JournalTTL = 300 * time.Millisecond })
	ctx := t.Context()
	files := func() int {
		entries, err := os.ReadDir(h.journal)
		if err != nil {
			t.Fatal(err)
		}
		return len(entries)
	}

	deleted := newID()
	if _, err := h.tls.Start(ctx, sandboxd.Spec{ID: deleted, Command: "sh", Args: sh("head -c 200000 /dev/zero; cat"), Stdin: true}); err != nil {
		t.Fatal(err)
	}
	if err := h.tls.Delete(ctx, deleted); !errors.Is(err, sandboxd.ErrRunning) {
		t.Errorf("delete while running: %v, want ErrRunning", err)
	}
	if _, err := h.tls.WriteStdin(ctx, deleted, 0, nil, true); err != nil {
		t.Fatal(err)
	}
	if _, _, err := output(ctx, h.tls, deleted, 1); err != nil {
		t.Fatal(err)
	}
	if n := files(); n != 1 {
		t.Fatalf("%d journal files for 200 kB of output, want 1", n)
	}
	if err := h.tls.Delete(ctx, deleted); err != nil {
		t.Fatal(err)
	}
	if _, err := h.tls.Output(ctx, deleted, 1); !errors.Is(err, sandboxd.ErrNotFound) {
		t.Errorf("output after delete: %v, want ErrNotFound", err)
	}
	if n := files(); n != 0 {
		t.Errorf("%d journal files after delete, want 0", n)
	}

	expiring := run(t, h.tls, sandboxd.Spec{ID: "expiring", Command: "head", Args: []string{"-c", "200000", "/dev/zero"}}, nil)
	if expiring.ExitCode == nil || len(expiring.Stdout) != 200000 {
		t.Fatalf("result: exit %v, %d bytes", expiring.ExitCode, len(expiring.Stdout))
	}
	eventually(t, "the journal expires", func() bool {
		_, err := h.tls.Output(ctx, "expiring", 1)
		return errors.Is(err, sandboxd.ErrNotFound)
	})
	if n := files(); n != 0 {
		t.Errorf("%d journal files after the TTL, want 0", n)
	}
	if info, err := h.tls.Info(ctx); err != nil || info.Execs != 0 {
		t.Errorf("info %+v, %v: want no execs left", info, err)
	}
}
