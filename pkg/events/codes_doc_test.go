package events_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// TestDocumentedCodesHaveProducers holds docs/contract.md's failure-code table to the code: it
// lists exactly events.Codes(), and each row names a package whose non-test source produces the
// code and a test whose body triggers it. A code documented without a producer, or a producer
// without a test, fails here.
func TestDocumentedCodesHaveProducers(t *testing.T) {
	doc, err := os.ReadFile("../../docs/contract.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := codeRows(t, string(doc))
	var documented []events.Code
	for _, r := range rows {
		documented = append(documented, r.code)
	}
	if diff := cmp.Diff(events.Codes(), documented); diff != "" {
		t.Errorf("docs/contract.md's codes differ from events.Codes() (-code +doc):\n%s", diff)
	}
	for _, r := range rows {
		constant := "Code" + camel(string(r.code))
		if len(r.producers) == 0 || len(r.tests) == 0 {
			t.Errorf("%s: the row names no producer package or no test", r.code)
		}
		for _, dir := range r.producers {
			if !sourceMentions(t, dir, constant) {
				t.Errorf("%s: no non-test file in %s uses events.%s", r.code, dir, constant)
			}
		}
		for _, ref := range r.tests {
			dir, name, _ := strings.Cut(ref, ".")
			body, ok := testBody(t, dir, name)
			switch {
			case !ok:
				t.Errorf("%s: %s has no func %s", r.code, dir, name)
			case !strings.Contains(body, constant):
				t.Errorf("%s: %s does not check for %s", r.code, ref, constant)
			}
		}
	}
}

type codeRow struct {
	code      events.Code
	producers []string // package directories, from the repository's root
	tests     []string // dir.TestName
}

var (
	codeRowRE = regexp.MustCompile("^\\| `([a-z_]+)` \\|(.*)\\|(.*)\\|(.*)\\|(.*)\\|$")
	packageRE = regexp.MustCompile("`((?:pkg|internal|cmd|tests)/[a-z0-9/]+)`")
	testRE    = regexp.MustCompile("`((?:pkg|internal|cmd|tests)/[a-z0-9/]+\\.Test[A-Za-z0-9_]+)`")
)

// codeRows reads the rows of the table under "### failed".
func codeRows(t *testing.T, doc string) []codeRow {
	t.Helper()
	_, section, ok := strings.Cut(doc, "\n### failed\n")
	if !ok {
		t.Fatal(`docs/contract.md has no "### failed" section`)
	}
	section, _, _ = strings.Cut(section, "\n#")
	var rows []codeRow
	for line := range strings.SplitSeq(section, "\n") {
		m := codeRowRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		r := codeRow{code: events.Code(m[1])}
		for _, p := range packageRE.FindAllStringSubmatch(m[4], -1) {
			r.producers = append(r.producers, p[1])
		}
		for _, p := range testRE.FindAllStringSubmatch(m[5], -1) {
			r.tests = append(r.tests, p[1])
		}
		rows = append(rows, r)
	}
	if len(rows) == 0 {
		t.Fatal("docs/contract.md: no rows in the failure-code table")
	}
	return rows
}

// camel turns a code into its constant's suffix: quota_exceeded → QuotaExceeded.
func camel(code string) string {
	var b strings.Builder
	for part := range strings.SplitSeq(code, "_") {
		b.WriteString(strings.ToUpper(part[:1]) + part[1:])
	}
	return b.String()
}

// sourceMentions reports whether a non-test Go file of dir (relative to the repository's root)
// contains s.
func sourceMentions(t *testing.T, dir, s string) bool {
	t.Helper()
	for _, f := range goFiles(t, dir) {
		if !strings.HasSuffix(f.name, "_test.go") && strings.Contains(f.text, s) {
			return true
		}
	}
	return false
}

// testBody is the source of func name in dir's test files, up to the next top-level func.
func testBody(t *testing.T, dir, name string) (string, bool) {
	t.Helper()
	for _, f := range goFiles(t, dir) {
		if !strings.HasSuffix(f.name, "_test.go") {
			continue
		}
		_, body, ok := strings.Cut(f.text, "\nfunc "+name+"(")
		if ok {
			body, _, _ = strings.Cut(body, "\nfunc ")
			return body, true
		}
	}
	return "", false
}

type goFile struct{ name, text string }

func goFiles(t *testing.T, dir string) []goFile {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join("../..", dir, "*.go"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no Go files in %s (%v)", dir, err)
	}
	var out []goFile
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, goFile{filepath.Base(p), string(b)})
	}
	return out
}
