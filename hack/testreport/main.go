// Command testreport prints the events of `go test -json` as they arrive: a line for every test
// and subtest that passes (--- PASS with its time; a fuzz target's seed entries only as the
// target), the whole output of one that failed or was skipped (its --- FAIL or SKIP line
// included), and each package's ok or FAIL line. `make test` pipes through it, so its log names
// every test that ran without the volume of -v.
//
//	go test -json ./... | go run ./hack/testreport
//
// It exits 1 when a test, a package or a build failed; a line that is not a test event is
// copied through.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action     string
	Package    string
	ImportPath string // build-output and build-fail
	Test       string
	Elapsed    float64
	Output     string
}

func main() {
	failed, err := report(os.Stdin, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(2)
	}
	if failed {
		os.Exit(1)
	}
}

// report copies r's events to w as described above and tells whether anything failed.
func report(r io.Reader, w io.Writer) (failed bool, err error) {
	type key struct{ pkg, test string }
	output := map[key][]string{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20) // a test may print a long line
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			fmt.Fprintf(w, "%s\n", line)
			continue
		}
		k := key{e.Package, e.Test}
		switch e.Action {
		case "output":
			output[k] = append(output[k], e.Output)
		case "build-output":
			fmt.Fprint(w, e.Output)
		case "build-fail":
			failed = true
		case "pass", "fail", "skip":
			if e.Action == "fail" {
				failed = true
			}
			out := output[k]
			delete(output, k)
			if e.Test == "" {
				packageLine(w, e, out)
				continue
			}
			if e.Action == "pass" {
				if root, _, sub := strings.Cut(e.Test, "/"); sub && strings.HasPrefix(root, "Fuzz") {
					continue // a fuzz target's seed corpus entries: the target's own line says it
				}
				indent := strings.Repeat("    ", strings.Count(e.Test, "/"))
				fmt.Fprintf(w, "%s--- PASS: %s (%.2fs)\n", indent, e.Test, e.Elapsed)
				continue
			}
			printOutput(w, out) // its === RUN and --- FAIL or SKIP lines included
		}
	}
	return failed, sc.Err()
}

// packageLine ends a package: `ok` with its time, or its own output (a panic, TestMain's words,
// go test's FAIL lines) and FAIL.
func packageLine(w io.Writer, e event, out []string) {
	switch e.Action {
	case "pass":
		fmt.Fprintf(w, "ok  \t%s\t%.3fs\n", e.Package, e.Elapsed)
	case "skip": // no test files
		fmt.Fprintf(w, "?   \t%s\t[no test files]\n", e.Package)
	default:
		printOutput(w, out)
		for _, o := range out {
			if strings.HasPrefix(o, "FAIL\t"+e.Package) {
				return // go test said it already
			}
		}
		fmt.Fprintf(w, "FAIL\t%s\t%.3fs\n", e.Package, e.Elapsed)
	}
}

// printOutput prints a test's output, indented as go test prints it.
func printOutput(w io.Writer, out []string) {
	for _, o := range out {
		fmt.Fprint(w, o)
	}
}
