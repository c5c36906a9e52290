package execsvc_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kubeclip/kubeclip/pkg/execclient"
	"github.com/kubeclip/kubeclip/pkg/sandboxd"
)

// Native sync through the exec path: the client, exec-worker replicas over NATS, and a real
// sandboxd process running `sandboxd untar` and `sandboxd tar` (docs/exec.md, "Native sync").

// syncTree writes a workspace and a home with a large random file under dir and describes it.
func syncTree(t *testing.T, dir string, big int) map[string]string {
	t.Helper()
	blob := make([]byte, big)
	_, _ = rand.Read(blob)
	files := map[string][]byte{
		"workspace/README.md": []byte("# ws\n"), "workspace/src/main.go": []byte("package main\n"),
		"workspace/blob.bin": blob, "home/.claude/sessions/s1.json": []byte(`{"id":"s1"}`),
	}
	for name, b := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(dir, "home/.claude/sessions/s1.json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../workspace/README.md", filepath.Join(dir, "home/readme")); err != nil {
		t.Fatal(err)
	}
	return describe(t, dir)
}

// describe maps each name under dir to its mode and a digest of its content or link target.
func describe(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		var content []byte
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			content = []byte(target)
		case fi.Mode().IsRegular():
			content, _ = os.ReadFile(p)
		}
		out[rel] = fi.Mode().String() + " " + fmt.Sprintf("%x", sha256.Sum256(content))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func localTar(t *testing.T, dir string) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	if _, err := sandboxd.Tar(&buf, sandboxd.TarOptions{Root: dir, Names: []string{"."}}); err != nil {
		t.Fatal(err)
	}
	return &buf
}

func syncCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestSyncRoundTrip syncs a tree into a lease and back out: the same names, modes, symlinks and
// bytes, with a file far over the exec protocol's 8 MiB window and stdin chunks.
func TestSyncRoundTrip(t *testing.T) {
	e := newEnv(t, 2)
	l := e.newLease(newID("co"))
	src := t.TempDir()
	want := syncTree(t, src, 24<<20)
	opts := execclient.SyncOptions{Sandboxd: sandboxdBin}
	target := filepath.Join(l.daemon.dir, "lease")

	st, err := e.client.SyncIn(syncCtx(t), l.Lease, target, localTar(t, src), opts)
	if err != nil {
		t.Fatal(err)
	}
	if st.Files != 5 || st.Bytes < 24<<20 {
		t.Errorf("sync in extracted %+v, want 5 files and the blob's bytes", st)
	}
	if diff := cmp.Diff(want, describe(t, target)); diff != "" {
		t.Errorf("the lease's tree after sync in (-want +got):\n%s", diff)
	}

	var archive bytes.Buffer
	n, err := e.client.SyncOut(syncCtx(t), l.Lease, target, []string{"workspace", "home"}, &archive, opts)
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(archive.Len()) {
		t.Errorf("SyncOut says %d bytes, wrote %d", n, archive.Len())
	}
	back := t.TempDir()
	if _, err := sandboxd.Untar(&archive, sandboxd.UntarOptions{Root: back}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, describe(t, back)); diff != "" {
		t.Errorf("the tree after sync out (-want +got):\n%s", diff)
	}
}

// TestSyncRefusals: what sandboxd refuses comes back as a *SyncError naming the entry, and
// nothing lands outside the target.
func TestSyncRefusals(t *testing.T) {
	e := newEnv(t, 1)
	l := e.newLease(newID("co"))
	target := filepath.Join(l.daemon.dir, "lease")
	opts := execclient.SyncOptions{Sandboxd: sandboxdBin}

	var hostile bytes.Buffer
	tw := tar.NewWriter(&hostile)
	_ = tw.WriteHeader(&tar.Header{Name: "ok", Typeflag: tar.TypeReg, Mode: 0o644, Size: 2})
	_, _ = tw.Write([]byte("ok"))
	_ = tw.WriteHeader(&tar.Header{Name: "../escaped", Typeflag: tar.TypeReg, Mode: 0o644, Size: 4})
	_, _ = tw.Write([]byte("evil"))
	_ = tw.Close()
	_, err := e.client.SyncIn(syncCtx(t), l.Lease, target, &hostile, opts)
	var se *execclient.SyncError
	if !errors.As(err, &se) || !se.Refused() || !strings.Contains(se.Message, `untar: "../escaped": a '..' component leads out of the root`) {
		t.Fatalf("SyncIn of ../escaped: %v, want a refusal naming the entry", err)
	}
	if _, err := os.Stat(filepath.Join(l.daemon.dir, "escaped")); err == nil {
		t.Error("../escaped was written outside the target")
	}

	_, err = e.client.SyncOut(syncCtx(t), l.Lease, target, []string{"missing"}, io.Discard, opts)
	if !errors.As(err, &se) || !se.Refused() || !strings.Contains(se.Message, `tar: "missing": no such file or directory`) {
		t.Errorf("SyncOut of a missing name: %v, want a refusal naming it", err)
	}
	_, err = e.client.SyncOut(syncCtx(t), l.Lease, target, []string{"ok"}, io.Discard, execclient.SyncOptions{Sandboxd: "/nonexistent/sandboxd"})
	if !errors.As(err, &se) || se.ExitCode == nil || *se.ExitCode != 127 {
		t.Errorf("SyncOut without sandboxd: %v, want exit 127", err)
	}
}

// TestSyncOutFailover: the replica relaying a sync out dies mid-archive; the client attaches
// through the other and the archive arrives whole, no byte lost or repeated.
func TestSyncOutFailover(t *testing.T) {
	e := newEnv(t, 2)
	l := e.newLease(newID("co"))
	src := filepath.Join(l.daemon.dir, "lease")
	want := syncTree(t, src, 48<<20)
	var archive bytes.Buffer
	w := &notifyingWriter{w: &archive}
	done := make(chan error, 1)
	go func() {
		_, err := e.client.SyncOut(syncCtx(t), l.Lease, src, []string{"."}, w, execclient.SyncOptions{Sandboxd: sandboxdBin})
		done <- err
	}()
	eventually(t, "the archive flows", func() bool { return w.n.Load() > 4<<20 })
	e.serving().crash()
	e.startReplica()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	back := t.TempDir()
	if _, err := sandboxd.Untar(&archive, sandboxd.UntarOptions{Root: back}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, describe(t, back)); diff != "" {
		t.Errorf("the tree after a sync out with a failover (-want +got):\n%s", diff)
	}
}

// notifyingWriter counts what was written, for a test waiting on progress.
type notifyingWriter struct {
	w io.Writer
	n atomic.Int64
}

func (n *notifyingWriter) Write(p []byte) (int, error) {
	k, err := n.w.Write(p)
	n.n.Add(int64(k))
	return k, err
}

// TestSyncInFailover: the replica relaying a sync in's archive dies mid-stdin; the client
// attaches through the other and sends on from sandboxd's offset: the tree lands whole.
func TestSyncInFailover(t *testing.T) {
	e := newEnv(t, 2)
	l := e.newLease(newID("co"))
	src := t.TempDir()
	want := syncTree(t, src, 48<<20)
	r := &countingReader{r: localTar(t, src)}
	target := filepath.Join(l.daemon.dir, "lease")
	done := make(chan error, 1)
	go func() {
		_, err := e.client.SyncIn(syncCtx(t), l.Lease, target, r, execclient.SyncOptions{Sandboxd: sandboxdBin})
		done <- err
	}()
	eventually(t, "the archive flows", func() bool { return r.n.Load() > 8<<20 })
	e.serving().crash()
	e.startReplica()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, describe(t, target)); diff != "" {
		t.Errorf("the tree after a sync in with a failover (-want +got):\n%s", diff)
	}
}

// countingReader counts what was read, for a test waiting on progress.
type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	k, err := c.r.Read(p)
	c.n.Add(int64(k))
	return k, err
}
