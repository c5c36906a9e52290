package main

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kubeclip/kubeclip/pkg/execclient"
	"github.com/kubeclip/kubeclip/pkg/execsvc"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// (m): native sync against the route Paperclip's host takes without it, on the same bytes
// through the same exec service (daemon route, one exec-worker), into and out of one pod lease:
//
//   - native: `sandboxd untar` fed the archive on stdin (execclient.SyncIn) and `sandboxd tar`
//     read from stdout (execclient.SyncOut);
//   - base64: the host's command-managed runtime (adapter-utils command-managed-runtime.js,
//     supportsSingleStreamStdinProgress false for plugin environments): the archive uploaded as
//     4 MiB base64 chunks, one `base64 -d >> tmp` exec each, then `tar -xf`; out, `tar -cf`,
//     `wc -c`, then one `dd … | base64` exec per 3 MiB, decoded here;
//   - raw: the archive's bytes through one exec, `cat > file` in and `cat file` out.
//
// The archive is a tar of one file of random bytes (nothing on the way may compress it).
const (
	phaseSync = "(m) native sync"
	// syncTimeout bounds one transfer: 500 MiB by base64 at 2 MB/s would still pass.
	syncTimeout = 5 * time.Minute
	// base64Chunk is the host's REMOTE_WRITE_FALLBACK_DECODED_CHUNK_SIZE (and its read
	// chunk): 3 MiB decoded, 4 MiB of base64.
	base64Chunk = 3 << 20
	// syncDir is where the phase writes in the pod: the workspace emptyDir (8 GiB).
	syncDir = "/workspace/kcbench-sync"
)

// syncSizes are the archive sizes measured and the transfers of each.
var syncSizes = []struct{ bytes, rounds int }{{1 << 20, 5}, {50 << 20, 3}, {500 << 20, 1}}

// syncRoutes are the three ways one transfer is made, in and out.
type syncRoutes struct {
	in, out [3]samples // native, base64, raw
}

const (
	routeNative = iota
	routeBase64
	routeRaw
)

func (b *bench) syncPhase(ctx context.Context, rep *report, key []byte) (err error) {
	leases, err := b.acquirePodLeases(ctx, 1)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, b.releasePodLeases(ctx, leases)) }()
	stop, err := b.startExecWorkers(ctx, execsvc.RouteDaemon, key, 1)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, stop()) }()
	c, err := b.execClient(ctx)
	if err != nil {
		return err
	}
	s := &syncBench{c: c, l: leases[0].Lease}
	if _, err := b.execTrue(ctx, c, s.l); err != nil {
		return fmt.Errorf("warming exec up: %w", err)
	}
	how, err := s.findSandboxd(ctx)
	if err != nil {
		return err
	}
	for _, size := range syncSizes {
		archive, err := randomArchive(size.bytes)
		if err != nil {
			return err
		}
		var r syncRoutes
		for range size.rounds {
			s.round(ctx, archive, &r)
		}
		for i, ss := range append(r.in[:], r.out[:]...) {
			if ss.firstErr != nil {
				b.logf("(m) %d MiB: a transfer failed (route %d): %v", size.bytes>>20, i, ss.firstErr)
			}
		}
		mib := size.bytes >> 20
		rows := []row{
			throughputRow(fmt.Sprintf("(m) sync in, %d MiB tar, sandboxd untar vs base64", mib), len(archive), r.in[routeNative], r.in[routeBase64],
				"Paperclip host's route: 4 MiB base64 chunks, one `base64 -d >> tmp` exec each, then `tar -xf`"),
			throughputRow(fmt.Sprintf("(m) sync in, %d MiB tar, sandboxd untar vs cat", mib), len(archive), r.in[routeNative], r.in[routeRaw],
				"the same bytes into `cat > file` through one exec"),
			throughputRow(fmt.Sprintf("(m) sync out, %d MiB tar, sandboxd tar vs base64", mib), len(archive), r.out[routeNative], r.out[routeBase64],
				"Paperclip host's route: `tar -cf`, `wc -c`, one `dd … | base64` exec per 3 MiB"),
			throughputRow(fmt.Sprintf("(m) sync out, %d MiB tar, sandboxd tar vs cat", mib), len(archive), r.out[routeNative], r.out[routeRaw],
				"the same bytes out of `cat file` through one exec"),
		}
		if mib == 50 {
			for _, i := range []int{0, 2} {
				rows[i].Target = "≥ 10× the base64 route"
				met := rows[i].Ratio != nil && *rows[i].Ratio >= 10
				rows[i].Met = &met
			}
		}
		rep.add(rows...)
	}
	rep.note("(m) MB/s is 10^6 bytes of the tar per second, request to exit (base64: every exec of the route), the median of %v transfers per size; daemon route, one exec-worker; sandboxd %s", []int{syncSizes[0].rounds, syncSizes[1].rounds, syncSizes[2].rounds}, how)
	return nil
}

// syncBench runs the transfers of (m) on one lease.
type syncBench struct {
	c        *execclient.Client
	l        execclient.Lease
	sandboxd string
}

// findSandboxd is the pod's own sandboxd when it has the sync subcommands; on a cluster whose
// sandboxd image predates them, a static build of this checkout's, copied into the pod.
func (s *syncBench) findSandboxd(ctx context.Context) (string, error) {
	s.sandboxd = policy.SandboxdBinary
	if _, err := s.c.SyncIn(ctx, s.l, syncDir+"/probe", bytes.NewReader(nil), execclient.SyncOptions{Timeout: time.Minute}); err == nil {
		return "of the pod (" + policy.SandboxdBinary + ")", nil
	}
	dir, err := os.MkdirTemp("", "kcbench-sandboxd-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", filepath.Join(dir, "sandboxd"), "./cmd/sandboxd")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building sandboxd: %w\n%s", err, out)
	}
	bin, err := os.ReadFile(filepath.Join(dir, "sandboxd"))
	if err != nil {
		return "", err
	}
	s.sandboxd = syncDir + "/sandboxd"
	if err := s.sh(ctx, "mkdir -p "+syncDir+" && cat > "+s.sandboxd+" && chmod 755 "+s.sandboxd, bin, nil, 0); err != nil {
		return "", fmt.Errorf("copying sandboxd into the pod: %w", err)
	}
	return "built from this checkout and copied into the pod (the cluster's sandboxd image predates native sync)", nil
}

// round makes one transfer each way on each route, cleaning the pod between them.
func (s *syncBench) round(ctx context.Context, archive []byte, r *syncRoutes) {
	opts := execclient.SyncOptions{Sandboxd: s.sandboxd, Timeout: syncTimeout}
	in, out := syncDir+"/in", syncDir+"/out.tar"
	timed := func(ss *samples, f func(context.Context) error) {
		tctx, cancel := context.WithTimeout(ctx, syncTimeout+time.Minute)
		defer cancel()
		start := time.Now()
		err := f(tctx)
		ss.add(time.Since(start), err)
	}
	clean := func() { _ = s.sh(ctx, "rm -rf "+in+" "+out+" "+syncDir+"/cat "+syncDir+"/*.b64tmp", nil, nil, 0) }
	want := int64(len(archive))

	clean()
	timed(&r.in[routeNative], func(ctx context.Context) error {
		st, err := s.c.SyncIn(ctx, s.l, in, bytes.NewReader(archive), opts)
		if err == nil && st.Files != 1 {
			err = fmt.Errorf("sandboxd untar extracted %+v, want 1 file", st)
		}
		return err
	})
	timed(&r.out[routeNative], func(ctx context.Context) error {
		var n byteCounter
		_, err := s.c.SyncOut(ctx, s.l, in, []string{"blob"}, &n, opts)
		if err == nil && int64(n) != want {
			err = fmt.Errorf("sandboxd tar wrote %d bytes, want %d", n, want)
		}
		return err
	})

	clean()
	timed(&r.in[routeBase64], func(ctx context.Context) error { return s.base64In(ctx, archive, in) })
	timed(&r.out[routeBase64], func(ctx context.Context) error {
		// GNU tar pads its archive to 10 KiB records: a few KiB more than the same tree's.
		n, err := s.base64Out(ctx, in, out)
		if err == nil && (n < want || n > want+10<<10) {
			err = fmt.Errorf("the base64 route read %d bytes, want about %d", n, want)
		}
		return err
	})

	clean()
	cat := syncDir + "/cat"
	timed(&r.in[routeRaw], func(ctx context.Context) error {
		return s.sh(ctx, "mkdir -p "+syncDir+" && cat > "+cat, archive, nil, 0)
	})
	timed(&r.out[routeRaw], func(ctx context.Context) error {
		var n byteCounter
		err := s.sh(ctx, "cat "+cat, nil, &n, want+(64<<20))
		if err == nil && int64(n) != want {
			err = fmt.Errorf("cat wrote %d bytes, want %d", n, want)
		}
		return err
	})
	clean()
}

// base64In uploads the archive as the host's writeFile does without single-stream stdin, then
// extracts it as its sync-in fallback does.
func (s *syncBench) base64In(ctx context.Context, archive []byte, dir string) error {
	tmp := syncDir + "/upload.b64tmp"
	if err := s.sh(ctx, "mkdir -p "+syncDir+" && rm -f "+tmp+" && : > "+tmp, nil, nil, 0); err != nil {
		return err
	}
	for off := 0; off < len(archive); off += base64Chunk {
		chunk := base64.StdEncoding.EncodeToString(archive[off:min(len(archive), off+base64Chunk)])
		if err := s.sh(ctx, "base64 -d >> "+tmp, []byte(chunk), nil, 0); err != nil {
			return err
		}
	}
	return s.sh(ctx, "mkdir -p "+dir+" && tar -xf "+tmp+" -C "+dir+" && rm -f "+tmp, nil, nil, 0)
}

// base64Out archives dir as the host's sync-out fallback does and reads the archive as its
// readFile does, decoding every chunk; it returns the archive's size.
func (s *syncBench) base64Out(ctx context.Context, dir, archive string) (int64, error) {
	if err := s.sh(ctx, "tar -cf "+archive+" -C "+dir+" blob", nil, nil, 0); err != nil {
		return 0, err
	}
	var size bytes.Buffer
	if err := s.sh(ctx, "wc -c < "+archive, nil, &size, 0); err != nil {
		return 0, err
	}
	total, err := strconv.ParseInt(strings.TrimSpace(size.String()), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("wc -c printed %q", size.String())
	}
	var got int64
	for i := 0; got < total; i++ {
		var out bytes.Buffer
		cmd := fmt.Sprintf("dd if=%s bs=%d skip=%d count=1 2>/dev/null | base64", archive, base64Chunk, i)
		if err := s.sh(ctx, cmd, nil, &out, 0); err != nil {
			return got, err
		}
		chunk, err := base64.StdEncoding.DecodeString(strings.Join(strings.Fields(out.String()), ""))
		if err != nil {
			return got, fmt.Errorf("chunk %d does not decode: %w", i, err)
		}
		if len(chunk) == 0 {
			return got, fmt.Errorf("chunk %d is empty", i)
		}
		got += int64(len(chunk))
	}
	if got != total {
		return got, fmt.Errorf("read %d bytes of the %d wc -c counted", got, total)
	}
	return got, s.sh(ctx, "rm -f "+archive, nil, nil, 0)
}

// sh runs script with sh -c in the pod, stdin (nil: none) and stdout (nil: kept by the client,
// up to its cap); maxOutput raises the exec's journal cap (0: sandboxd's).
func (s *syncBench) sh(ctx context.Context, script string, stdin []byte, stdout io.Writer, maxOutput int64) error {
	x := execclient.Exec{Lease: s.l, Command: "sh", Args: []string{"-c", script}, Timeout: syncTimeout, Stdout: stdout, MaxOutputBytes: maxOutput}
	if stdin != nil {
		x.Stdin, x.StdinBytes = bytes.NewReader(stdin), int64(len(stdin))
	}
	res, err := s.c.Run(ctx, x)
	if err == nil && res.Truncated {
		err = errors.New("output truncated")
	}
	if err = exitErr("sh -c", res, err); err != nil {
		return fmt.Errorf("%.60s: %w (stderr %.200q)", script, err, res.Stderr)
	}
	return nil
}

// randomArchive is a tar of one file "blob" of random bytes whose tar is size bytes.
func randomArchive(size int) ([]byte, error) {
	const overhead = 512 + 1024 // header, end of archive
	var buf bytes.Buffer
	buf.Grow(size)
	tw := tar.NewWriter(&buf)
	n := int64(size - overhead)
	if err := tw.WriteHeader(&tar.Header{Name: "blob", Typeflag: tar.TypeReg, Mode: 0o644, Size: n, ModTime: time.Now().Truncate(time.Second)}); err != nil {
		return nil, err
	}
	if _, err := io.CopyN(tw, rand.Reader, n); err != nil {
		return nil, fmt.Errorf("making the archive: %w", err)
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
