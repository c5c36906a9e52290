package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/kubeclip/kubeclip/internal/cli"
	"github.com/kubeclip/kubeclip/pkg/sandboxd"
)

// install copies this executable to the one argument, as the init container of an exec-capable
// pod does: `sandboxd install /kubeclip/bin/sandboxd`.
func install(args []string, stdout io.Writer) error {
	if len(args) != 1 || strings.HasPrefix(args[0], "-") {
		return &cli.UsageError{Err: errors.New("usage: sandboxd install <dst>")}
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding this executable: %w", err)
	}
	if err := sandboxd.Install(self, args[0]); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "sandboxd installed at %s\n", args[0])
	return nil
}
