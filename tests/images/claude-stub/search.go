package main

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// The secret search (KUBECLIP_STUB_SECRET_SEARCH): an agent that hunts for a credential
// wherever a process in its pod can look, as a prompt-injected agent would, and reports how many
// times it found it. It must not know the value it looks for (a test that handed the pod the
// value would have put it there itself), so it is given a needle that gives nothing away:
//
//	KUBECLIP_STUB_SECRET_SEARCH=<sha256 hex of the value>:<its length>:<its known prefix>
//
// A candidate is every run of <length> bytes that starts with the prefix (a public prefix such
// as "sk-ant-api03-"); it matches when its SHA-256 is the needle's. The search covers the
// stub's own environment, every regular file it can read (the whole filesystem but /proc, /sys
// and /dev, without following links, within searchBudget bytes), and the environ and cmdline
// of every process it can read under /proc. It also counts the credential broker's
// placeholders (kcph_…) it sees in the same places: the positive control that proves the
// search looked where the credential would have been.

const (
	// secretSearchVar holds the needle; empty: no search.
	secretSearchVar = "KUBECLIP_STUB_SECRET_SEARCH"
	// placeholderPrefix starts every broker placeholder (pkg/broker/placeholder.go).
	placeholderPrefix = "kcph_"
	// searchBudget bounds the bytes of files read: the sandbox image is ~150 MB, a run's
	// working directory and home a few MB more.
	searchBudget = 1 << 30
	// searchChunk is how much of a file is read at once.
	searchChunk = 1 << 20
	// maxReportedPaths bounds the file paths a report names (paths, never contents).
	maxReportedPaths = 20
	// maxNeedleLen bounds the needle's length: API keys are ~100 bytes.
	maxNeedleLen = 4 << 10
)

// needle is what the search looks for, without the value.
type needle struct {
	sum    [sha256.Size]byte
	n      int
	prefix []byte
}

// parseNeedle reads <sha256 hex>:<length>:<prefix>.
func parseNeedle(s string) (needle, error) {
	parts := strings.SplitN(s, ":", 3)
	if len(parts) != 3 {
		return needle{}, &usageError{secretSearchVar + ": want <sha256 hex>:<length>:<prefix>"}
	}
	var nd needle
	sum, err := hex.DecodeString(parts[0])
	if err != nil || len(sum) != sha256.Size {
		return needle{}, &usageError{secretSearchVar + ": the first field must be a SHA-256 in hex"}
	}
	copy(nd.sum[:], sum)
	nd.n, err = strconv.Atoi(parts[1])
	nd.prefix = []byte(parts[2])
	if err != nil || nd.n < len(nd.prefix) || nd.n > maxNeedleLen {
		return needle{}, &usageError{fmt.Sprintf("%s: the length must be a number from the prefix's length to %d", secretSearchVar, maxNeedleLen)}
	}
	if len(nd.prefix) < 4 {
		return needle{}, &usageError{secretSearchVar + ": the prefix must have at least 4 bytes (a shorter one makes every file a heap of candidates)"}
	}
	return nd, nil
}

// tally is what one place held: matches of the needle and placeholders.
type tally struct {
	Matches      int `json:"matches"`
	Placeholders int `json:"placeholders"`
}

func (t *tally) add(o tally) { t.Matches += o.Matches; t.Placeholders += o.Placeholders }

// count tallies data, all of it.
func (nd needle) count(data []byte) tally {
	return tally{Matches: nd.matchesIn(data, len(data)), Placeholders: bytes.Count(data, []byte(placeholderPrefix))}
}

// matchesIn counts the matches that start before end (each needs nd.n bytes from its start).
func (nd needle) matchesIn(data []byte, end int) int {
	found := 0
	for i := 0; i < end; {
		j := bytes.Index(data[i:], nd.prefix)
		if j < 0 {
			break
		}
		at := i + j
		if at >= end {
			break
		}
		if at+nd.n <= len(data) {
			sum := sha256.Sum256(data[at : at+nd.n])
			if subtle.ConstantTimeCompare(sum[:], nd.sum[:]) == 1 {
				found++
			}
		}
		i = at + 1
	}
	return found
}

// countReader tallies r in chunks, reading at most limit bytes, and returns the tally and the
// bytes read. A chunk's last nd.n-1 bytes are kept for the next, so a match or placeholder
// that spans two chunks is counted once.
func (nd needle) countReader(r io.Reader, limit int64) (tally, int64, error) {
	var t tally
	keep := max(nd.n, len(placeholderPrefix)) - 1
	buf := make([]byte, 0, searchChunk+keep)
	var read int64
	for read < limit {
		n, err := io.ReadFull(r, buf[len(buf):len(buf)+int(min(searchChunk, limit-read))])
		buf = buf[:len(buf)+n]
		read += int64(n)
		last := err != nil || read >= limit
		// Everything that starts before end is decided in this window; the rest waits for
		// the bytes that follow it, unless there are none.
		end := len(buf) - keep
		if last {
			end = len(buf)
		}
		if end > 0 {
			t.Matches += nd.matchesIn(buf, end)
			t.Placeholders += countStartingBefore(buf, []byte(placeholderPrefix), end)
			buf = append(buf[:0], buf[end:]...)
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return t, read, nil
		}
		if err != nil {
			return t, read, err
		}
	}
	return t, read, nil
}

// countStartingBefore counts the occurrences of sub in data that start before end.
func countStartingBefore(data, sub []byte, end int) int {
	n := 0
	for i := 0; i < end; {
		j := bytes.Index(data[i:], sub)
		if j < 0 || i+j >= end {
			break
		}
		n++
		i += j + len(sub)
	}
	return n
}

// searchEvent is the search's report: a stream-json system line Paperclip's parser ignores. Its
// field names avoid the words Paperclip's log redaction blanks values of (key, secret, token).
type searchEvent struct {
	stamped
	Type    string `json:"type"`
	Subtype string `json:"subtype"`
	// EnvVars is how many variables the stub's own environment has.
	EnvVars int   `json:"envVars"`
	Env     tally `json:"env"`
	// Files is how many regular files were read (in full, or to the budget), FileBytes their
	// bytes, Unreadable how many could not be opened or read (another user's, a socket...).
	Files      int   `json:"files"`
	FileBytes  int64 `json:"fileBytes"`
	Unreadable int   `json:"unreadable"`
	// OverBudget: the files' bytes reached searchBudget and the walk stopped there.
	OverBudget bool  `json:"overBudget"`
	FileTally  tally `json:"fileTally"`
	// MatchPaths and PlaceholderPaths name the first files holding either (paths, no content).
	MatchPaths       []string `json:"matchPaths"`
	PlaceholderPaths []string `json:"placeholderPaths"`
	// Processes is how many /proc/<pid> whose environ could be read; Environ and Cmdline are
	// the tallies of those files.
	Processes        int   `json:"processes"`
	ProcsUnreadable  int   `json:"procsUnreadable"`
	Environ          tally `json:"environ"`
	Cmdline          tally `json:"cmdline"`
	SearchDurationMS int64 `json:"searchDurationMs"`
}

// skipDirs are the trees the file walk leaves out: /proc is searched process by process (its
// files elsewhere are kernel state, and some block), /sys and /dev are not files.
var skipDirs = []string{"/proc", "/sys", "/dev"}

// searchPod runs the search from root ("/" in the pod; tests give a directory) over environ and
// procDir (/proc).
func searchPod(nd needle, environ []string, root, procDir string) *searchEvent {
	ev := &searchEvent{Type: "system", Subtype: "kubeclip_secret_search", EnvVars: len(environ), MatchPaths: []string{}, PlaceholderPaths: []string{}}
	for _, kv := range environ {
		ev.Env.add(nd.count([]byte(kv)))
	}
	skip := make([]string, 0, len(skipDirs))
	for _, d := range skipDirs {
		skip = append(skip, filepath.Join(root, strings.TrimPrefix(d, "/")))
	}
	_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			ev.Unreadable++
			if d != nil && d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			if slices.Contains(skip, path) {
				return fs.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		if ev.FileBytes >= searchBudget {
			ev.OverBudget = true
			return fs.SkipAll
		}
		f, err := os.Open(path)
		if err != nil {
			ev.Unreadable++
			return nil
		}
		t, n, err := nd.countReader(f, searchBudget-ev.FileBytes)
		f.Close()
		ev.FileBytes += n
		if err != nil {
			ev.Unreadable++
		} else {
			ev.Files++
		}
		ev.FileTally.add(t)
		if t.Matches > 0 && len(ev.MatchPaths) < maxReportedPaths {
			ev.MatchPaths = append(ev.MatchPaths, path)
		}
		if t.Placeholders > 0 && len(ev.PlaceholderPaths) < maxReportedPaths {
			ev.PlaceholderPaths = append(ev.PlaceholderPaths, path)
		}
		return nil
	})
	pids, _ := filepath.Glob(filepath.Join(procDir, "[0-9]*"))
	for _, p := range pids {
		environ, err := os.ReadFile(filepath.Join(p, "environ"))
		if err != nil {
			ev.ProcsUnreadable++
			continue
		}
		ev.Processes++
		ev.Environ.add(nd.count(environ))
		if cmdline, err := os.ReadFile(filepath.Join(p, "cmdline")); err == nil {
			ev.Cmdline.add(nd.count(cmdline))
		}
	}
	return ev
}
