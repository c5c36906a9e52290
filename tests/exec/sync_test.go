package exec

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
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kubeclip/kubeclip/pkg/execclient"
	"github.com/kubeclip/kubeclip/pkg/execsvc"
	"github.com/kubeclip/kubeclip/pkg/sandboxd"
)

// TestNativeSync syncs a workspace and a home into a pod lease and back out through the exec
// service and the pod's own sandboxd (`sandboxd untar`, `sandboxd tar`): the same tree comes
// back, a mode the mapping sets holds, a hostile archive is refused naming its entry with
// nothing written outside the target, and a sync out larger than sandboxd's default journal cap
// (256 MiB) arrives whole. Both routes carry the same streams; the daemon route is the one
// measured by the bench.
func TestNativeSync(t *testing.T) {
	execWorkers(t, execsvc.RouteDaemon, 1)
	c := newClient(t)
	l := acquire(t)
	l.waitReady(t)

	src := t.TempDir()
	want := writeSyncTree(t, src, 8<<20)
	var archive bytes.Buffer
	if _, err := sandboxd.Tar(&archive, sandboxd.TarOptions{Root: src, Names: []string{"."}}); err != nil {
		t.Fatal(err)
	}
	opts := execclient.SyncOptions{Timeout: 2 * time.Minute, Modes: map[string]fs.FileMode{"home/.claude/.credentials.json": 0o600}}
	st, err := c.SyncIn(syncCtx(t), l.Lease, "/workspace/synced", &archive, opts)
	if err != nil {
		t.Fatal(err)
	}
	if st.Files != 6 || st.Bytes < 8<<20 {
		t.Errorf("sync in extracted %+v, want 6 files and the blob's bytes", st)
	}
	res := mustRun(t, c, l, execclient.Exec{Command: "stat", Args: []string{"-c", "%a %U", "/workspace/synced/home/.claude/.credentials.json"}})
	if !strings.HasPrefix(string(res.Stdout), "600 ") {
		t.Errorf("the credentials file is %q, want mode 600", res.Stdout)
	}

	var back bytes.Buffer
	if _, err := c.SyncOut(syncCtx(t), l.Lease, "/workspace/synced", []string{"workspace", "home"}, &back, execclient.SyncOptions{Excludes: []string{"node_modules"}}); err != nil {
		t.Fatal(err)
	}
	dst := t.TempDir()
	if _, err := sandboxd.Untar(&back, sandboxd.UntarOptions{Root: dst}); err != nil {
		t.Fatal(err)
	}
	delete(want, "workspace/node_modules")
	delete(want, "workspace/node_modules/dep.js")
	want["home/.claude/.credentials.json"] = strings.Replace(want["home/.claude/.credentials.json"], "-rw-r--r--", "-rw-------", 1)
	if diff := cmp.Diff(want, describeTree(t, dst)); diff != "" {
		t.Errorf("the tree synced in and out again (-want +got):\n%s", diff)
	}

	var hostile bytes.Buffer
	tw := tar.NewWriter(&hostile)
	_ = tw.WriteHeader(&tar.Header{Name: "link", Typeflag: tar.TypeSymlink, Linkname: "../../etc"})
	_ = tw.Close()
	_, err = c.SyncIn(syncCtx(t), l.Lease, "/workspace/synced", &hostile, execclient.SyncOptions{})
	var se *execclient.SyncError
	if !errors.As(err, &se) || !se.Refused() || !strings.Contains(se.Message, `untar: "link": symlink leads out of the root`) {
		t.Errorf("sync in of a symlink out: %v, want it refused naming the entry", err)
	}
	if res := mustRun(t, c, l, execclient.Exec{Command: "sh", Args: []string{"-c", "test -e /workspace/synced/link && echo present || echo absent"}}); string(res.Stdout) != "absent\n" {
		t.Errorf("the refused link is %q", res.Stdout)
	}

	// Past sandboxd's default journal cap: the sync out raises its exec's cap.
	const big = 300 << 20
	mustRun(t, c, l, execclient.Exec{Command: "sh", Args: []string{"-c", fmt.Sprintf("mkdir -p /workspace/big && head -c %d /dev/urandom > /workspace/big/blob", big)}, Timeout: 2 * time.Minute})
	sum := mustRun(t, c, l, execclient.Exec{Command: "sh", Args: []string{"-c", "sha256sum < /workspace/big/blob"}})
	h := &tarDigest{}
	n, err := c.SyncOut(syncCtx(t), l.Lease, "/workspace/big", []string{"blob"}, h, execclient.SyncOptions{Timeout: 3 * time.Minute})
	if err != nil {
		t.Fatalf("sync out of %d MiB: %v (%d bytes arrived)", big>>20, err, n)
	}
	if got := h.sum(t); !strings.HasPrefix(string(sum.Stdout), got) {
		t.Errorf("the blob synced out hashes to %s, the pod's to %q", got, sum.Stdout)
	}
}

func syncCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// writeSyncTree writes what a Paperclip sync in carries (a workspace, an agent home with a
// session and credentials, a symlink, a large random file) and describes it.
func writeSyncTree(t *testing.T, dir string, big int) map[string]string {
	t.Helper()
	blob := make([]byte, big)
	_, _ = rand.Read(blob)
	for name, b := range map[string][]byte{
		"workspace/README.md": []byte("# ws\n"), "workspace/blob.bin": blob, "workspace/node_modules/dep.js": []byte("x"),
		"home/.claude/sessions/s1.jsonl": []byte(`{"session":"s1"}`), "home/.claude/.credentials.json": []byte(`{"token":"t"}`),
	} {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("../workspace/README.md", filepath.Join(dir, "home/readme")); err != nil {
		t.Fatal(err)
	}
	return describeTree(t, dir)
}

// describeTree maps each name under dir to its mode and a digest of its content or target.
func describeTree(t *testing.T, dir string) map[string]string {
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
		out[rel] = fmt.Sprintf("%v %x", fi.Mode(), sha256.Sum256(content))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// tarDigest reads a tar stream as it arrives and hashes its one file, keeping nothing.
type tarDigest struct {
	pw  *io.PipeWriter
	res chan string
}

func (d *tarDigest) Write(p []byte) (int, error) {
	if d.pw == nil {
		pr, pw := io.Pipe()
		d.pw, d.res = pw, make(chan string, 1)
		go func() {
			h := sha256.New()
			tr := tar.NewReader(pr)
			_, err := tr.Next()
			if err == nil {
				_, err = io.Copy(h, tr)
			}
			_, _ = io.Copy(io.Discard, pr)
			if err != nil {
				d.res <- "unreadable: " + err.Error()
				return
			}
			d.res <- fmt.Sprintf("%x", h.Sum(nil))
		}()
	}
	return d.pw.Write(p)
}

func (d *tarDigest) sum(t *testing.T) string {
	t.Helper()
	if d.pw == nil {
		t.Fatal("nothing arrived")
	}
	_ = d.pw.Close()
	return <-d.res
}

// TestCLICopy copies a directory into a pod lease with `kubeclip cp` and back out.
func TestCLICopy(t *testing.T) {
	execWorkers(t, execsvc.RouteDaemon, 1)
	l := acquire(t)
	src := filepath.Join(t.TempDir(), "project")
	want := writeSyncTree(t, src, 1<<20)
	out, errOut, code := cli(t, "", "cp", l.RunID, "--company", l.CompanyID, src, ":/workspace/copied")
	if code != 0 || !strings.HasPrefix(out, "copied 6 files") {
		t.Fatalf("cp in: exit %d, %q %q", code, out, errOut)
	}
	dst := t.TempDir()
	out, errOut, code = cli(t, "", "cp", l.RunID, "--company", l.CompanyID, "--exclude", "*.bin", ":/workspace/copied/project", dst)
	if code != 0 || !strings.HasPrefix(out, "copied 5 files") {
		t.Fatalf("cp out: exit %d, %q %q", code, out, errOut)
	}
	delete(want, "workspace/blob.bin")
	if diff := cmp.Diff(want, describeTree(t, filepath.Join(dst, "project"))); diff != "" {
		t.Errorf("the tree copied in and out again (-want +got):\n%s", diff)
	}
	_, errOut, code = cli(t, "", "cp", l.RunID, "--company", l.CompanyID, ":/workspace/nope", dst)
	if code != 1 || !strings.Contains(errOut, `tar: "nope": no such file or directory`) {
		t.Errorf("cp of a missing name: exit %d, stderr %q; want 1 naming it", code, errOut)
	}
}
