package sandboxd

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/kubeclip/kubeclip/pkg/execspec"
)

// openPTY opens a new pseudo-terminal of size sz: the master, non-blocking so that Close
// interrupts a pending Read (Go's poller serves it), and the slave the command gets as its
// stdin, stdout and stderr.
func openPTY(sz execspec.TTY) (master, slave *os.File, err error) {
	master, err = os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("opening /dev/ptmx: %w", err)
	}
	var n int
	err = control(master, func(fd int) error {
		if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil { // unlockpt
			return fmt.Errorf("unlocking the pty: %w", err)
		}
		var err error
		if n, err = unix.IoctlGetInt(fd, unix.TIOCGPTN); err != nil { // ptsname
			return fmt.Errorf("asking the pty's number: %w", err)
		}
		return nil
	})
	if err == nil {
		err = resizePTY(master, sz)
	}
	if err != nil {
		_ = master.Close()
		return nil, nil, err
	}
	name := "/dev/pts/" + strconv.Itoa(n)
	slave, err = os.OpenFile(name, os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		_ = master.Close()
		return nil, nil, fmt.Errorf("opening %s: %w", name, err)
	}
	return master, slave, nil
}

// writeEnd is a second file of master's open file description, for the command's input: the
// stdin route closes it at eof while the master is still read.
func writeEnd(master *os.File) (*os.File, error) {
	var dup int
	err := control(master, func(fd int) error {
		var err error
		dup, err = unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("duplicating the pty: %w", err)
	}
	// The description is non-blocking, so NewFile registers the copy with the poller too.
	return os.NewFile(uintptr(dup), "ptmx"), nil
}

// errPTYClosed is a resize of a terminal whose command has exited (sandboxd closed it).
var errPTYClosed = errors.New("the terminal is closed")

// resizePTY sets the terminal's size; the kernel sends SIGWINCH to its foreground process
// group.
func resizePTY(master *os.File, sz execspec.TTY) error {
	ws := &unix.Winsize{Row: uint16(sz.Rows), Col: uint16(sz.Cols)}
	err := control(master, func(fd int) error { return unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, ws) })
	if errors.Is(err, os.ErrClosed) {
		return errPTYClosed
	}
	if err != nil {
		return fmt.Errorf("setting the terminal's size: %w", err)
	}
	return nil
}

// control runs f with f's descriptor without putting it in blocking mode (as Fd would).
func control(f *os.File, fn func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}
