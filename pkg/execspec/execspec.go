// Package execspec is what every kubeclip part that runs commands in a lease's pod agrees on:
// what an exec id is, how an exec ended (Exit), and the lease seed that the dispatcher puts in
// the pod and the exec-worker derives to reach it. sandboxd, the exec protocol, the recorded
// exec events and the dispatcher import it; it imports nothing of kubeclip's.
package execspec

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
)

// MaxIDLen is the longest exec id.
const MaxIDLen = 64

// IDRule says what ValidID accepts, for error messages.
const IDRule = "1-64 of [A-Za-z0-9_-]"

// ValidID reports whether id is an exec id: 1-64 of [A-Za-z0-9_-], safe as a file name, a URL
// segment, a subject token and a message-id token.
func ValidID(id string) bool {
	if id == "" || len(id) > MaxIDLen {
		return false
	}
	for _, c := range []byte(id) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// Exit is how an exec ended: sandboxd's final frame, the protocol's `exit` message.
type Exit struct {
	ExitCode *int    `json:"exitCode"` // nil when the command was killed by a signal or never ran
	Signal   *string `json:"signal"`   // "SIGKILL", …; nil unless killed by a signal
	TimedOut bool    `json:"timedOut"`
	// StdoutBytes and StderrBytes count the journaled output: what a client reading from seq 1
	// receives. With Truncated, the command wrote more than that.
	StdoutBytes int64  `json:"stdoutBytes"`
	StderrBytes int64  `json:"stderrBytes"`
	Truncated   bool   `json:"truncated"`
	LastSeq     uint64 `json:"lastSeq"`
	// Error says why the command did not run (missing command or cwd) or what went wrong with
	// its journal; empty otherwise.
	Error string `json:"error,omitempty"`
}

// SeedEnv names hex(seed) in the run Secret and in the environment of the pod's init container
// (never the agent container's), whose `sandboxd install` writes it to the file `sandboxd serve
// --seed-file` reads and removes. Run outside a pod, sandboxd serve reads it from its own
// environment and removes it from there and from every command's.
const SeedEnv = "KUBECLIP_SANDBOXD_SEED"

// SeedSize is the length of a lease seed in bytes (an HMAC-SHA256).
const SeedSize = sha256.Size

// seedContext separates this derivation from any other use of the master key; the version lets
// a future scheme coexist with leases created under this one.
const seedContext = "kubeclip-sandboxd-v1"

// bindSeedContext separates a warm pod's bind seed from every lease seed: a pod and a workload
// may share a name, and the two keys must never be equal.
const bindSeedContext = "kubeclip-sandboxd-bind-v1"

// DeriveSeed returns a lease's seed: HMAC-SHA256(masterKey, "kubeclip-sandboxd-v1" 0x00
// namespace 0x00 workload). The NUL separators keep ("a", "bc") and ("ab", "c") apart; Kubernetes
// names cannot contain NUL.
func DeriveSeed(masterKey []byte, namespace, workload string) []byte {
	return deriveNamed(masterKey, seedContext, namespace, workload)
}

// DeriveBindSeed returns a warm pod's bind seed: HMAC-SHA256(masterKey,
// "kubeclip-sandboxd-bind-v1" 0x00 namespace 0x00 pod). A warm pod's sandboxd starts unbound
// with it (`sandboxd serve --unbound`) and accepts one call keyed by it, the bind, which installs
// the lease's seed (DeriveSeed) and makes this one useless. Only a holder of the master key can
// derive it, so only kubeclip can bind a warm pod; the namespace in it keeps a pod of one
// company from being bound with a key meant for another's.
func DeriveBindSeed(masterKey []byte, namespace, pod string) []byte {
	return deriveNamed(masterKey, bindSeedContext, namespace, pod)
}

func deriveNamed(masterKey []byte, label, namespace, name string) []byte {
	m := hmac.New(sha256.New, masterKey)
	m.Write([]byte(label))
	m.Write([]byte{0})
	m.Write([]byte(namespace))
	m.Write([]byte{0})
	m.Write([]byte(name))
	return m.Sum(nil)
}

// ParseSeed decodes hex(seed) as found in SeedEnv.
func ParseSeed(s string) ([]byte, error) {
	seed, err := hex.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("decoding the sandboxd seed: not hex: %w", err)
	}
	if len(seed) != SeedSize {
		return nil, fmt.Errorf("decoding the sandboxd seed: %d bytes, want %d", len(seed), SeedSize)
	}
	return seed, nil
}

// MinMasterKeySize is the least key material a master key must hold.
const MinMasterKeySize = 32

// ReadMasterKey reads the installation's master key from path (an operator secret: the
// dispatcher and the exec-worker derive every lease's seed from it): the file's content with
// surrounding whitespace trimmed, hex-decoded when it is hex (as `openssl rand -hex 32` writes
// it), else taken as raw bytes. Either way it must hold at least MinMasterKeySize bytes. Errors
// name the file, never its content.
func ReadMasterKey(path string) ([]byte, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the sandbox master key: %w", err)
	}
	key := bytes.TrimSpace(raw)
	if decoded, err := hex.DecodeString(string(key)); err == nil {
		key = decoded
	}
	if len(key) < MinMasterKeySize {
		return nil, fmt.Errorf("the sandbox master key in %s holds %d bytes; at least %d are needed (openssl rand -hex 32)", path, len(key), MinMasterKeySize)
	}
	return key, nil
}

// MaxTTYDim bounds a terminal's rows and columns: larger than any screen, small enough that no
// program sizing a buffer from it is surprised.
const MaxTTYDim = 1000

// TTY is a terminal's size: an exec started with one runs on a pseudo-terminal of that size,
// and a resize changes it.
type TTY struct {
	Rows int `json:"rows"`
	Cols int `json:"cols"`
}

// Validate checks the size; the error names the bad field ("rows", "cols").
func (t TTY) Validate() error {
	for _, d := range []struct {
		field string
		n     int
	}{{"rows", t.Rows}, {"cols", t.Cols}} {
		if d.n < 1 || d.n > MaxTTYDim {
			return fmt.Errorf("%s: must be 1-%d, got %d", d.field, MaxTTYDim, d.n)
		}
	}
	return nil
}
