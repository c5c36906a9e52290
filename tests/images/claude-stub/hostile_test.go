package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kubeclip/kubeclip/pkg/sandboxd"
)

// fakeSandboxdVar makes the test binary `sandboxd tar --root DIR .` (TestMain): pkg/sandboxd's
// Tar through a buffer of cmd/sandboxd's size, as the real subcommand writes its archive.
const fakeSandboxdVar = "KUBECLIP_STUB_TEST_SANDBOXD"

func fakeSandboxdTar(args []string) int {
	if len(args) != 4 || args[0] != "tar" || args[1] != "--root" {
		fmt.Fprintln(os.Stderr, "fake sandboxd: want tar --root DIR NAME")
		return 2
	}
	w := bufio.NewWriterSize(os.Stdout, floodAlign) // cmd/sandboxd syncBuffer
	if _, err := sandboxd.Tar(w, sandboxd.TarOptions{Root: args[2], Names: args[3:]}); err != nil {
		fmt.Fprintln(os.Stderr, "fake sandboxd:", err)
		return 1
	}
	if err := w.Flush(); err != nil {
		fmt.Fprintln(os.Stderr, "fake sandboxd:", err)
		return 1
	}
	return 0
}

// startTar starts the fake `sandboxd tar --root dir .` and returns its archive, read to the end
// as sandboxd reads it (as fast as it comes).
func startTar(t *testing.T, dir string) func() []byte {
	t.Helper()
	cmd := exec.Command(os.Args[0], "tar", "--root", dir, ".")
	cmd.Args[0] = "/kubeclip/bin/sandboxd"
	cmd.Env = append(os.Environ(), fakeSandboxdVar+"=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return func() []byte {
		t.Helper()
		archive, err := io.ReadAll(out)
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("fake sandboxd tar: %v\n%s", err, stderr.String())
		}
		return archive
	}
}

// entries reads archive with archive/tar (the Go extractor's reader) and returns its entries'
// names and, for the one the flood's headers were merged into, their count.
func entries(t *testing.T, archive []byte) (names []string, floodedEntry string, floodRecords int) {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(archive))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return names, floodedEntry, floodRecords
		}
		if err != nil {
			t.Fatalf("reading the archive after %d entries: %v", len(names), err)
		}
		names = append(names, h.Name)
		n := 0
		for k := range h.PAXRecords {
			if strings.HasPrefix(k, "kubeclip.flood.") {
				n++
			}
		}
		if n > 0 {
			if floodedEntry != "" {
				t.Fatalf("flood records on %s and %s", floodedEntry, h.Name)
			}
			floodedEntry, floodRecords = h.Name, n
		}
	}
}

// A flood header is a well-formed local PAX header of floodHeader bytes of records with keys of
// their own: archive/tar reads three of them and then an entry, which carries the last one's
// floodRecords records.
func TestPaxFloodHeadersAreWellFormed(t *testing.T) {
	var archive bytes.Buffer
	for i := range 3 {
		h := paxFloodHeader(i)
		if len(h) != 512+floodHeader || len(h)%512 != 0 {
			t.Fatalf("header %d is %d bytes, want 512 + %d", i, len(h), floodHeader)
		}
		archive.Write(h)
	}
	tw := tar.NewWriter(&archive)
	if err := tw.WriteHeader(&tar.Header{Name: "after", Mode: 0o644, Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(&archive)
	h, err := tr.Next()
	if err != nil {
		t.Fatal(err)
	}
	if h.Name != "after" || len(h.PAXRecords) != floodRecords || h.PAXRecords["kubeclip.flood.2.0"] == "" {
		t.Errorf("entry %q with %d PAX records (kubeclip.flood.2.0 %v), want after with the last header's %d", h.Name, len(h.PAXRecords), h.PAXRecords["kubeclip.flood.2.0"] != "", floodRecords)
	}
}

// The stub with KUBECLIP_STUB_LINKS leaves links out of its working directory.
func TestLinksLeadOut(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	if _, stderr, err := stubRun(t, paperclipArgs, map[string]string{linksVar: "1"}, prompt); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	for name, want := range map[string]string{"etc": "/etc", "up": "../../.."} {
		if got, err := os.Readlink(filepath.Join(dir, name)); err != nil || got != want {
			t.Errorf("%s -> %q (%v), want -> %s", name, got, err, want)
		}
	}
}

// The stub with KUBECLIP_STUB_PAX_FLOOD leaves a process that finds the next `sandboxd tar` of its
// working directory, stops it at an entry boundary, writes its headers into the archive and
// lets it go on: the archive reads whole, with the flood's records on one of the aligned entries
// and every entry of the workspace in it.
func TestPaxFloodLandsBetweenEntries(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("the agent's own work\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	const flood = 3 * floodHeader
	if _, stderr, err := stubRun(t, paperclipArgs, map[string]string{paxFloodVar: strconv.Itoa(flood)}, prompt); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	flooder := waitForFlooder(t, dir)
	start := time.Now()
	archive := startTar(t, dir)()
	names, flooded, records := entries(t, archive)
	t.Logf("archive of %d bytes (%d entries) in %s; the flood's records on %s", len(archive), len(names), time.Since(start).Round(time.Millisecond), flooded)
	if len(names) != floodFiles+2 || names[len(names)-1] != "notes.txt" {
		t.Errorf("the archive holds %d entries (last %q), want the %d aligned files, their directory and notes.txt", len(names), names[len(names)-1], floodFiles)
	}
	if !strings.HasPrefix(flooded, floodDir+"/") || records != floodRecords {
		t.Errorf("the flood's %d records are on %q, want %d on one of the aligned entries", records, flooded, floodRecords)
	}
	// Each header of the flood went into the archive, between two entries.
	if extra := len(archive) - archiveSize(t, dir); extra != 3*(512+floodHeader) {
		t.Errorf("the archive is %d bytes longer than sandboxd's own, want the flood's %d", extra, 3*(512+floodHeader))
	}
	if code := flooder(); code != 0 {
		t.Errorf("the flooder exited %d, want 0", code)
	}
}

// archiveSize is the size of sandboxd's own archive of dir.
func archiveSize(t *testing.T, dir string) int {
	t.Helper()
	var b bytes.Buffer
	if _, err := sandboxd.Tar(&b, sandboxd.TarOptions{Root: dir, Names: []string{"."}}); err != nil {
		t.Fatal(err)
	}
	return b.Len()
}

// waitForFlooder finds the flooder the stub left for dir (a process of its own session, not the
// test's child) and returns a function that waits for its exit code. It is killed when the test
// ends, whatever happened.
func waitForFlooder(t *testing.T, dir string) func() int {
	t.Helper()
	var pid int
	for deadline := time.Now().Add(10 * time.Second); pid == 0; time.Sleep(10 * time.Millisecond) {
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			b, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			if argv := strings.Split(string(b), "\x00"); len(argv) >= 4 && argv[1] == floodCommand && argv[3] == dir {
				pid, _ = strconv.Atoi(e.Name())
			}
		}
		if pid == 0 && time.Now().After(deadline) {
			t.Fatal("no flooder process")
		}
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	return func() int {
		// Not our child (the stub is this process: the flooder is its child, so waitable).
		var ws syscall.WaitStatus
		if _, err := syscall.Wait4(pid, &ws, 0, nil); err != nil {
			t.Fatalf("waiting for the flooder: %v", err)
		}
		return ws.ExitStatus()
	}
}
