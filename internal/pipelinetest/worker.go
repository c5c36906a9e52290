package pipelinetest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// stopTimeout bounds a SIGTERM shutdown: the workers' own drain bound (--shutdown-timeout 20 s)
// plus start-up and NATS drain.
const stopTimeout = 40 * time.Second

// Worker is one worker process.
type Worker struct {
	// Kind is the binary: TenantWorker, Dispatcher, RunWatcher or ExecWorker.
	Kind string
	// ID names the process: its log file, and a run-watcher's --replica-id.
	ID string
	// LogPath is the file the process writes its stdout and stderr to.
	LogPath string

	cmd    *exec.Cmd
	exited chan struct{}
	err    error // the exit status, set before exited is closed
}

// workerSet is the suite's workers, live and exited.
type workerSet struct {
	mu      sync.Mutex
	all     []*Worker
	started map[string]int // per kind, for replica ids
}

func (s *workerSet) nextID(kind string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started == nil {
		s.started = map[string]int{}
	}
	s.started[kind]++
	return fmt.Sprintf("%s-%d", kind, s.started[kind])
}

func (s *workerSet) add(w *Worker) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.all = append(s.all, w)
}

func (s *workerSet) live() []*Worker {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*Worker
	for _, w := range s.all {
		if !w.Exited() {
			out = append(out, w)
		}
	}
	return out
}

// StartWorker starts another process of kind, with the suite's flags, then extra, and a fresh
// id (<kind>-<n>, counting every process of that kind the suite started).
func (e *Env) StartWorker(kind string, extra ...string) (*Worker, error) {
	id := e.workers.nextID(kind)
	args := []string{"--nats-url", e.natsURL, "--kubeconfig", e.Kubeconfig, "--log-level", "debug"}
	switch kind {
	case Dispatcher:
		// Other suites share the cluster with their own lease buckets: to this dispatcher
		// their Jobs have no lease, and it must not delete them.
		args = append(args, "--orphan-policy", "report", "--sandbox-key-file", e.SandboxKeyFile)
		if e.opts.AgentBusyTimeout > 0 {
			args = append(args, "--agent-busy-timeout", e.opts.AgentBusyTimeout.String())
		}
	case RunWatcher:
		args = append(args, "--replica-id", id)
		if e.opts.OwnershipTTL > 0 {
			args = append(args, "--ownership-ttl", e.opts.OwnershipTTL.String())
		}
	case ExecWorker:
		// A short drain: a test that stops a replica wants its streams handed over, not
		// finished. The route is the binary's default unless Args set it.
		args = append(args, "--replica-id", id, "--sandbox-key-file", e.SandboxKeyFile, "--shutdown-timeout", "2s")
	}
	args = append(args, e.opts.BrokerPods.args(kind)...)
	args = append(args, e.opts.Args[kind]...)
	args = append(args, extra...)

	logPath := filepath.Join(e.LogDir, id+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(filepath.Join(e.Bin, kind), args...)
	cmd.Env = append(os.Environ(), e.opts.Env[kind]...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting %s: %w", id, err)
	}
	w := &Worker{Kind: kind, ID: id, LogPath: logPath, cmd: cmd, exited: make(chan struct{})}
	go func() {
		w.err = cmd.Wait()
		logFile.Close()
		close(w.exited)
	}()
	e.workers.add(w)
	return w, nil
}

// Workers returns the live processes of kind (all kinds when kind is empty), oldest first.
func (e *Env) Workers(kind string) []*Worker {
	var out []*Worker
	for _, w := range e.workers.live() {
		if kind == "" || w.Kind == kind {
			out = append(out, w)
		}
	}
	return out
}

// Worker returns the live process with id, or nil.
func (e *Env) Worker(id string) *Worker {
	for _, w := range e.workers.live() {
		if w.ID == id {
			return w
		}
	}
	return nil
}

// StopAll stops every live worker with SIGTERM, all at once, and reports those that did not
// exit cleanly.
func (e *Env) StopAll() error {
	live := e.workers.live()
	errs := make([]error, len(live))
	var wg sync.WaitGroup
	for i, w := range live {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.Stop(); err != nil {
				errs[i] = fmt.Errorf("%s did not shut down cleanly: %w", w.ID, err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Exited reports whether the process has ended.
func (w *Worker) Exited() bool {
	select {
	case <-w.exited:
		return true
	default:
		return false
	}
}

// Pid is the process id.
func (w *Worker) Pid() int { return w.cmd.Process.Pid }

// Stop sends SIGTERM and expects a clean exit (status 0) within the drain bound; past it the
// process is killed.
func (w *Worker) Stop() error {
	if w.Exited() {
		return w.err
	}
	_ = w.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-w.exited:
		return w.err
	case <-time.After(stopTimeout):
		_ = w.cmd.Process.Kill()
		<-w.exited
		return fmt.Errorf("still running %s after SIGTERM", stopTimeout)
	}
}

// Kill sends SIGKILL, as a crash or an OOM kill would end it, and waits until the process is
// gone. It returns an error only when the process could not be signalled.
func (w *Worker) Kill() error {
	if w.Exited() {
		return nil
	}
	if err := w.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("killing %s: %w", w.ID, err)
	}
	<-w.exited
	return nil
}
