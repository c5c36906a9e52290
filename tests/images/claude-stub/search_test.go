package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/google/go-cmp/cmp"
)

// testValue is a credential the tests search for; the needle is all the stub gets of it.
const testValue = "sk-ant-api03-0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-_0123456789abcdefAA"

func testNeedle(t *testing.T) needle {
	t.Helper()
	sum := sha256.Sum256([]byte(testValue))
	nd, err := parseNeedle(fmt.Sprintf("%s:%d:sk-ant-api03-", hex.EncodeToString(sum[:]), len(testValue)))
	if err != nil {
		t.Fatal(err)
	}
	return nd
}

func TestParseNeedleRefuses(t *testing.T) {
	sum := sha256.Sum256([]byte(testValue))
	h := hex.EncodeToString(sum[:])
	for _, v := range []string{"", h, h + ":10", "zz:10:sk-ant-", h + ":x:sk-ant-", h + ":3:sk-ant-", h + ":99999:sk-ant-", h + ":10:sk"} {
		if _, err := parseNeedle(v); err == nil || !isUsage(err) {
			t.Errorf("parseNeedle(%q) = %v, want a usage error", v, err)
		}
	}
}

// TestCountReaderAcrossChunks: a value or a placeholder that spans two reads is found once, and
// a prefix followed by other bytes (a decoy) is no match.
func TestCountReaderAcrossChunks(t *testing.T) {
	nd := testNeedle(t)
	decoy := "sk-ant-api03-" + strings.Repeat("x", len(testValue)-len("sk-ant-api03-"))
	for _, at := range []int{0, 1, searchChunk - 50, searchChunk - 2, searchChunk, 2*searchChunk - 3} {
		t.Run(fmt.Sprint(at), func(t *testing.T) {
			data := bytes.Repeat([]byte{'.'}, 3*searchChunk)
			copy(data[at:], testValue)
			copy(data[at+len(testValue)+7:], "kcph_abc")
			copy(data[searchChunk/2:], decoy)
			copy(data[len(data)-len(testValue):], testValue)
			copy(data[len(data)-len(testValue)-5:], "kcph_")
			got, n, err := nd.countReader(iotest.HalfReader(bytes.NewReader(data)), 1<<40)
			if err != nil || n != int64(len(data)) {
				t.Fatalf("countReader: %d bytes, %v", n, err)
			}
			if diff := cmp.Diff(tally{Matches: 2, Placeholders: 2}, got); diff != "" {
				t.Errorf("tally (-want +got):\n%s", diff)
			}
			if whole := nd.count(data); whole != got {
				t.Errorf("count of the whole = %+v, of the chunks %+v", whole, got)
			}
		})
	}
}

// TestSearchPod: the search finds the value in the environment, in files at any depth, in a
// process's environ and cmdline, counts placeholders, leaves /proc, /sys and /dev of the root
// to the /proc pass, and names the files by path.
func TestSearchPod(t *testing.T) {
	nd := testNeedle(t)
	root, proc := t.TempDir(), t.TempDir()
	write := func(path, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(root, "workspace", "deep", "notes.txt"), "key="+testValue+"\n")
	write(filepath.Join(root, "home", "cfg.json"), `{"k":"kcph_xyz"}`)
	write(filepath.Join(root, "etc", "plain"), "nothing here sk-ant-api03-short")
	write(filepath.Join(root, "proc", "1", "environ"), testValue)
	write(filepath.Join(root, "sys", "x"), testValue)
	write(filepath.Join(root, "dev", "x"), testValue)
	if err := os.Symlink(filepath.Join(root, "workspace"), filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	write(filepath.Join(proc, "7", "environ"), "A=1\x00ANTHROPIC_API_KEY=kcph_p\x00")
	write(filepath.Join(proc, "7", "cmdline"), "curl\x00-H\x00x-api-key: "+testValue+"\x00")
	write(filepath.Join(proc, "9", "environ"), "K="+testValue+"\x00")
	write(filepath.Join(proc, "self", "environ"), testValue) // not a pid: not read

	ev := searchPod(nd, []string{"ANTHROPIC_API_KEY=kcph_q", "B=" + testValue}, root, proc)
	got := map[string]any{
		"envVars": ev.EnvVars, "env": ev.Env, "files": ev.Files, "fileTally": ev.FileTally,
		"matchPaths": ev.MatchPaths, "placeholderPaths": ev.PlaceholderPaths,
		"processes": ev.Processes, "environ": ev.Environ, "cmdline": ev.Cmdline,
	}
	want := map[string]any{
		"envVars": 2, "env": tally{Matches: 1, Placeholders: 1}, "files": 3, "fileTally": tally{Matches: 1, Placeholders: 1},
		"matchPaths":       []string{filepath.Join(root, "workspace", "deep", "notes.txt")},
		"placeholderPaths": []string{filepath.Join(root, "home", "cfg.json")},
		"processes":        2, "environ": tally{Matches: 1, Placeholders: 1}, "cmdline": tally{Matches: 1},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("search (-want +got):\n%s", diff)
	}
	// The report never holds the value, only counts and paths.
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(b, []byte(testValue)) {
		t.Errorf("the report holds the value: %s", b)
	}
}
