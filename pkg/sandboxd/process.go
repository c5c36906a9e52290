package sandboxd

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/kubeclip/kubeclip/pkg/execspec"
)

// defaultPath is the search path when neither the request nor sandboxd's environment has PATH,
// as a shell would use.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Exit codes of commands that could not be started, as a POSIX shell reports them.
const (
	exitCannotRun = 126 // found but not executable, or the cwd is missing
	exitNotFound  = 127
)

// process is a started command: its pid (also its process group id) and sandboxd's ends of its
// pipes.
type process struct {
	pid    int
	stdin  *os.File // write end; nil when the command's stdin is /dev/null
	stdout *os.File // read ends; a terminal's master (tty set)
	stderr *os.File // nil with a terminal: its output is one stream
	tty    *os.File // the terminal's master, for resizes; nil without one
	status <-chan syscall.WaitStatus
}

// startError is a command that could not be started. It is not a request error: the exec ends
// with code, and err's text goes to its stderr and to the exit frame.
type startError struct {
	code int
	err  error
}

func (e *startError) Error() string { return e.err.Error() }
func (e *startError) Unwrap() error { return e.err }

// spawn starts spec's command in a new process group with pipes for stdout and stderr, and for
// stdin when asked (devNull otherwise), registered with r so that its exit status comes back on
// process.status.
func spawn(r *Reaper, spec Spec, baseEnv []string, devNull *os.File) (*process, error) {
	env := mergeEnv(baseEnv, spec.Env)
	if spec.Cwd != "" {
		fi, err := os.Stat(spec.Cwd)
		if err != nil {
			return nil, &startError{exitCannotRun, fmt.Errorf("cwd %s: %w", spec.Cwd, unwrapPath(err))}
		}
		if !fi.IsDir() {
			return nil, &startError{exitCannotRun, fmt.Errorf("cwd %s: not a directory", spec.Cwd)}
		}
	}
	path, err := lookPath(spec.Command, lookupEnv(env, "PATH"), spec.Cwd)
	if err != nil {
		return nil, err
	}

	if spec.TTY != nil {
		return spawnTTY(r, spec, path, env)
	}

	var child, parent []*os.File // closed once the child has its copies, and on failure
	p := &process{}
	stdinR := devNull
	if spec.Stdin {
		if stdinR, p.stdin, err = os.Pipe(); err != nil {
			return nil, fmt.Errorf("creating the stdin pipe: %w", err)
		}
		child, parent = append(child, stdinR), append(parent, p.stdin)
	}
	var stdoutW, stderrW *os.File
	if p.stdout, stdoutW, err = os.Pipe(); err == nil {
		child, parent = append(child, stdoutW), append(parent, p.stdout)
		if p.stderr, stderrW, err = os.Pipe(); err == nil {
			child, parent = append(child, stderrW), append(parent, p.stderr)
		}
	}
	if err != nil {
		closeAll(child)
		closeAll(parent)
		return nil, fmt.Errorf("creating the output pipes: %w", err)
	}

	attr := &syscall.ProcAttr{
		Dir: spec.Cwd,
		Env: env,
		// Fd puts these ends in blocking mode, which is what the child wants; sandboxd's ends
		// stay non-blocking, so Close interrupts a pending Read or Write.
		Files: []uintptr{stdinR.Fd(), stdoutW.Fd(), stderrW.Fd()},
		// A process group of its own: signals and the timeout reach the command's children,
		// and never sandboxd.
		Sys: &syscall.SysProcAttr{Setpgid: true},
	}
	if err := p.fork(r, spec, path, attr); err != nil {
		closeAll(child)
		closeAll(parent)
		return nil, err
	}
	closeAll(child)
	return p, nil
}

// spawnTTY starts spec's command on a new pseudo-terminal: its stdin, stdout and stderr, and
// its controlling terminal, in a session of its own (so also a process group: signals and the
// timeout reach its children as without a terminal).
func spawnTTY(r *Reaper, spec Spec, path string, env []string) (*process, error) {
	master, slave, err := openPTY(*spec.TTY)
	if err != nil {
		return nil, err
	}
	in, err := writeEnd(master)
	if err != nil {
		closeAll([]*os.File{master, slave})
		return nil, err
	}
	p := &process{stdin: in, stdout: master, tty: master}
	fd := slave.Fd()
	attr := &syscall.ProcAttr{
		Dir: spec.Cwd, Env: env, Files: []uintptr{fd, fd, fd},
		// Setsid makes the command a session and process group leader (Setpgid would fail
		// after it); Setctty makes the terminal (its fd 0) the session's.
		Sys: &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0},
	}
	err = p.fork(r, spec, path, attr)
	_ = slave.Close()
	if err != nil {
		closeAll([]*os.File{in, master})
		return nil, err
	}
	return p, nil
}

// fork starts the command with attr, registered with r; an error is a *startError.
func (p *process) fork(r *Reaper, spec Spec, path string, attr *syscall.ProcAttr) error {
	argv := append([]string{spec.Command}, spec.Args...)
	var err error
	p.pid, p.status, err = r.start(func() (int, error) { return syscall.ForkExec(path, argv, attr) })
	if err != nil {
		code := exitCannotRun
		if errors.Is(err, syscall.ENOENT) { // e.g. a script whose interpreter is missing
			code = exitNotFound
		}
		return &startError{code, fmt.Errorf("%s: %w", spec.Command, err)}
	}
	return nil
}

// closeAll closes each file that is not nil.
func closeAll(fs []*os.File) {
	for _, f := range fs {
		if f != nil {
			_ = f.Close()
		}
	}
}

// mergeEnv lays over on base, dropping execspec.SeedEnv from base. Variables keep base's order; new ones
// follow, sorted.
func mergeEnv(base []string, over map[string]string) []string {
	out := make([]string, 0, len(base)+len(over))
	seen := make(map[string]bool, len(base)+len(over))
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if k == execspec.SeedEnv || seen[k] {
			continue
		}
		seen[k] = true
		if v, ok := over[k]; ok {
			kv = k + "=" + v
		}
		out = append(out, kv)
	}
	for _, k := range slices.Sorted(maps.Keys(over)) {
		if !seen[k] {
			out = append(out, k+"="+over[k])
		}
	}
	return out
}

func lookupEnv(env []string, key string) string {
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return ""
}

// lookPath finds command the way a shell does: a name with a slash is used as is (relative to
// cwd, which the child enters before exec); a bare name is searched in pathList, whose relative
// entries are relative to cwd too.
func lookPath(command, pathList, cwd string) (string, error) {
	resolve := func(p string) string {
		if filepath.IsAbs(p) || cwd == "" {
			return p
		}
		return filepath.Join(cwd, p)
	}
	if strings.Contains(command, "/") {
		if err := executable(resolve(command)); err != nil {
			return "", startErrorFor(command, err)
		}
		return command, nil
	}
	if pathList == "" {
		pathList = defaultPath
	}
	var denied error
	for _, dir := range filepath.SplitList(pathList) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, command)
		if !filepath.IsAbs(p) {
			p = "./" + p // execve does not search PATH, but be explicit
		}
		err := executable(resolve(p))
		if err == nil {
			return p, nil
		}
		if errors.Is(err, fs.ErrPermission) && denied == nil {
			denied = err
		}
	}
	if denied != nil {
		return "", startErrorFor(command, denied)
	}
	return "", &startError{exitNotFound, fmt.Errorf("%s: command not found", command)}
}

func startErrorFor(command string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return &startError{exitNotFound, fmt.Errorf("%s: %w", command, err)}
	}
	return &startError{exitCannotRun, fmt.Errorf("%s: %w", command, err)}
}

// executable reports whether p is a regular file with an execute bit. Whether this user may
// execute it is left to execve, which reports EACCES.
func executable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return unwrapPath(err)
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return fs.ErrPermission
	}
	return nil
}

// unwrapPath drops the *PathError around err; the callers name the path themselves.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
