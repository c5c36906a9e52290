package sandboxd

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/kubeclip/kubeclip/pkg/execspec"
)

// ForgetSeedEnv removes execspec.SeedEnv from the process's environment, which commands start from, and
// makes the process non-dumpable. Unsetenv cannot clear the environment block the kernel shows at
// /proc/<pid>/environ, and commands run as sandboxd's user, who could read the seed there; a
// non-dumpable process's /proc entries belong to root and need CAP_SYS_PTRACE (not in a pod's
// default capabilities) to read. execve makes the commands themselves dumpable again.
func ForgetSeedEnv() error {
	if err := os.Unsetenv(execspec.SeedEnv); err != nil {
		return fmt.Errorf("removing %s from the environment: %w", execspec.SeedEnv, err)
	}
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("making sandboxd non-dumpable: %w", err)
	}
	return nil
}
