package main

import (
	"bytes"
	"os"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestReport replays `go test -json` of a module with a passing test and subtest, a failing
// subtest, a skipped test and a package that does not build (testdata/events.json) and expects
// testdata/report.txt.
func TestReport(t *testing.T) {
	in, err := os.Open("testdata/events.json")
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	want, err := os.ReadFile("testdata/report.txt")
	if err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	failed, err := report(in, &got)
	if err != nil || !failed {
		t.Errorf("report = failed %v, %v; want failed", failed, err)
	}
	if diff := cmp.Diff(string(want), got.String()); diff != "" {
		t.Errorf("report (-want +got):\n%s", diff)
	}
}

// TestReportOfAPass: a pass is one line, without its log; a fuzz target's seeds are not listed.
func TestReportOfAPass(t *testing.T) {
	in := `{"Action":"run","Package":"p","Test":"TestA"}
{"Action":"output","Package":"p","Test":"TestA","Output":"=== RUN   TestA\n"}
{"Action":"output","Package":"p","Test":"TestA","Output":"    a_test.go:3: a log line a pass does not show\n"}
{"Action":"pass","Package":"p","Test":"TestA","Elapsed":1.5}
{"Action":"run","Package":"p","Test":"FuzzB"}
{"Action":"run","Package":"p","Test":"FuzzB/seed#0"}
{"Action":"pass","Package":"p","Test":"FuzzB/seed#0","Elapsed":0}
{"Action":"pass","Package":"p","Test":"FuzzB","Elapsed":0.01}
{"Action":"output","Package":"p","Output":"ok  \tp\t1.6s\n"}
{"Action":"pass","Package":"p","Elapsed":1.6}
`
	var got bytes.Buffer
	failed, err := report(bytes.NewBufferString(in), &got)
	if err != nil || failed {
		t.Errorf("report = failed %v, %v; want a pass", failed, err)
	}
	if want := "--- PASS: TestA (1.50s)\n--- PASS: FuzzB (0.01s)\nok  \tp\t1.600s\n"; got.String() != want {
		t.Errorf("report:\n%s\nwant:\n%s", got.String(), want)
	}
}
