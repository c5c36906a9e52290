package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/kubeclip/kubeclip/internal/cli"
	"github.com/kubeclip/kubeclip/internal/config"
	"github.com/kubeclip/kubeclip/pkg/execspec"
	"github.com/kubeclip/kubeclip/pkg/sandboxd"
)

// install copies this executable to the first argument and, given a second, writes the lease
// seed (execspec.SeedEnv, the init container's environment only) to it, as the init container
// of an exec-capable pod does: `sandboxd install /kubeclip/bin/sandboxd /kubeclip/seed/seed`.
// `sandboxd serve --seed-file` reads the seed and removes the file.
func install(args []string, lookupEnv config.LookupEnv, stdout io.Writer) error {
	if len(args) < 1 || len(args) > 2 || slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "-") }) {
		return &cli.UsageError{Err: errors.New("usage: sandboxd install <dst> [<seed-file>]")}
	}
	if len(args) == 2 {
		v, _ := lookupEnv(execspec.SeedEnv)
		if _, err := execspec.ParseSeed(v); err != nil {
			return fmt.Errorf("%s: %w", execspec.SeedEnv, err)
		}
		if err := writeSeedFile(args[1], v); err != nil {
			return err
		}
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

// writeSeedFile writes hex(seed) to path, mode 0400, failing if the file exists.
func writeSeedFile(path, seedHex string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o400)
	if err != nil {
		return fmt.Errorf("writing the seed file: %w", err)
	}
	_, werr := f.WriteString(seedHex)
	if err := errors.Join(werr, f.Close()); err != nil {
		return fmt.Errorf("writing the seed file %s: %w", path, err)
	}
	return nil
}

// readSeedFile reads the seed writeSeedFile wrote and removes the file, so that no process
// started after sandboxd finds it.
func readSeedFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the seed file: %w", err)
	}
	if err := os.Remove(path); err != nil {
		return nil, fmt.Errorf("removing the seed file: %w", err)
	}
	seed, err := execspec.ParseSeed(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("the seed file %s: %w", path, err)
	}
	return seed, nil
}
