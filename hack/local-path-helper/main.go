// Command local-path-helper is the helper pod's command of the local cluster's storage
// provisioner (rancher's local-path-provisioner, installed by hack/cluster/cluster.sh): it makes
// a volume's directory on the node, and removes it with everything in it when the volume is
// deleted. Upstream runs `sh` scripts in a busybox image, which cannot be pulled here; the
// provisioner's setupCommand and teardownCommand run this one static binary instead, with the
// arguments the provisioner passes to either:
//
//	local-path-helper -p DIR -s SIZE_BYTES -m Filesystem|Block -a create|delete
//
// create makes DIR with mode 0777, as upstream's setup script does (hostPath volumes ignore a
// pod's fsGroup, so the directory must be writable by whatever user the consuming pod runs as);
// delete removes DIR and its contents without following symbolic links a pod left inside.
// The provisioner mounts DIR's parent at the same path in the helper pod, so DIR must be an
// absolute, clean path below a directory other than "/".
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

func main() {
	if err := run(os.Args[1:], os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "local-path-helper:", err)
		os.Exit(2)
	}
}

// volumeMode is the mode of a directory the helper creates: everyone may write, as upstream's
// `mkdir -m 0777`.
const volumeMode = 0o777

func run(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("local-path-helper", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("p", "", "the volume's directory on the node (required)")
	// -s is the claim's requested size: a directory cannot hold a size, so it is read and left.
	fs.Int64("s", 0, "the claim's requested size in bytes (not enforced: a directory has no size)")
	mode := fs.String("m", "Filesystem", "the volume mode: Filesystem (Block is refused)")
	action := fs.String("a", "", "create or delete (required)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if err := checkDir(*dir); err != nil {
		return err
	}
	switch *action {
	case "create":
		if *mode != "Filesystem" {
			return fmt.Errorf("-m %q: only Filesystem volumes are supported", *mode)
		}
		return create(*dir)
	case "delete":
		return remove(*dir)
	default:
		return fmt.Errorf("-a %q: want create or delete", *action)
	}
}

// checkDir refuses a path the provisioner would never pass: relative, unclean, the root or a
// directory directly below it (DIR's parent is the provisioner's data directory, never "/").
func checkDir(dir string) error {
	switch {
	case dir == "":
		return errors.New("-p is required")
	case !filepath.IsAbs(dir) || filepath.Clean(dir) != dir:
		return fmt.Errorf("-p %q must be an absolute, clean path", dir)
	case filepath.Dir(dir) == "/":
		return fmt.Errorf("-p %q must be below the provisioner's data directory, not the root", dir)
	}
	return nil
}

func create(dir string) error {
	if err := os.MkdirAll(dir, volumeMode); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	// MkdirAll's mode passes through the umask; the volume's must not.
	if err := os.Chmod(dir, volumeMode); err != nil {
		return fmt.Errorf("setting the mode of %s: %w", dir, err)
	}
	return nil
}

// remove deletes dir and everything in it. os.RemoveAll removes a symbolic link itself, never
// what it points to, so a link a pod left in its volume cannot reach outside it.
func remove(dir string) error {
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("removing %s: %w", dir, err)
	}
	return nil
}
