package sandboxd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// Reaper collects the exit status of every child of the process: the commands sandboxd started,
// whose statuses it hands to their supervisors, and the orphans the kernel reparents to it (it
// is PID 1 of the pod, and a child subreaper elsewhere), whose statuses it discards so that no
// zombie is left behind.
//
// There must be one Reaper per process and nothing else may wait for children: wait4(-1) takes
// any child's status, so os/exec's Cmd.Wait in the same process would race with it.
type Reaper struct {
	log zerolog.Logger

	mu      sync.Mutex
	waiters map[int]chan<- syscall.WaitStatus
}

// NewReaper makes the process a child subreaper (PR_SET_CHILD_SUBREAPER; a no-op for PID 1), so
// that orphans of its commands are reparented to it instead of to an init that may not exist.
// Call Run before starting commands.
func NewReaper(log zerolog.Logger) (*Reaper, error) {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return nil, fmt.Errorf("becoming a child subreaper: %w", err)
	}
	return &Reaper{log: log, waiters: make(map[int]chan<- syscall.WaitStatus)}, nil
}

// Run reaps children on every SIGCHLD until ctx is done.
func (r *Reaper) Run(ctx context.Context) error {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGCHLD)
	defer signal.Stop(sigs)
	for {
		// Signals coalesce: one SIGCHLD may stand for many exits, so reap until none is left.
		// The first pass also collects children that exited before Run started.
		r.reap()
		select {
		case <-ctx.Done():
			return nil
		case <-sigs:
		}
	}
}

func (r *Reaper) reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil || pid <= 0 { // ECHILD: no children; 0: none has exited
			return
		}
		// start holds mu from fork to registration, so a command that exits at once is found.
		r.mu.Lock()
		ch, ok := r.waiters[pid]
		delete(r.waiters, pid)
		r.mu.Unlock()
		if ok {
			ch <- ws // buffered, read once by the supervisor
			continue
		}
		r.log.Debug().Int(LogKeyPID, pid).Msg("reaped an orphan")
	}
}

// start runs fork (which must start exactly one child and return its pid) and registers the
// child before any exit status can be dispatched. The returned channel receives the child's
// status once.
func (r *Reaper) start(fork func() (int, error)) (int, <-chan syscall.WaitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := fork()
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan syscall.WaitStatus, 1)
	r.waiters[pid] = ch
	return pid, ch, nil
}
