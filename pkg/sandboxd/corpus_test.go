package sandboxd_test

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kubeclip/kubeclip/pkg/sandboxd"
)

// The corpus of hostile archives both extractors are tested with: testdata/archives at the
// repository's root, one outcome per archive in manifest.json. This file generates it
// (`go test -run TestArchiveCorpus ./pkg/sandboxd/ -update`) and runs sandboxd's Untar on it;
// plugins/paperclip/src/corpus.test.ts runs the plugin's Extractor on the same files.

var update = flag.Bool("update", false, "write testdata/archives (the archives and manifest.json) from corpusCases")

const corpusDir = "../../testdata/archives"

// corpusManifest is testdata/archives/manifest.json.
type corpusManifest struct {
	About string `json:"about"`
	// Setup is what the test makes before each extraction: the root and files beside it that
	// a link escaping the root would reach.
	Setup struct {
		Root    string   `json:"root"`
		Outside []string `json:"outside"`
	} `json:"setup"`
	MaxBytes   int64        `json:"maxBytes"`
	MaxEntries int          `json:"maxEntries"`
	Reasons    []string     `json:"reasons"`
	Cases      []corpusCase `json:"cases"`
}

type corpusCase struct {
	Name    string `json:"name"`
	Archive string `json:"archive"`
	About   string `json:"about"`
	// Want is "ok" (Files is then everything under the root after it) or "refused" (Reason
	// says why, one of the manifest's reasons).
	Want   string       `json:"want"`
	Reason string       `json:"reason,omitempty"`
	Files  []corpusFile `json:"files,omitempty"`

	build func() []byte // nil: a fixture not generated here (its About says where it is from)
}

type corpusFile struct {
	Path    string `json:"path"`
	Type    string `json:"type"` // "file", "dir", "symlink"
	Content string `json:"content,omitempty"`
	Target  string `json:"target,omitempty"`
}

// corpusReasons are the refusal classes, each with the pattern sandboxd's refusal matches
// (corpus.test.ts has the plugin's).
var corpusReasons = map[string]*regexp.Regexp{
	"name":      regexp.MustCompile(`absolute name|'\.\.' component|name longer than|contains NUL`),
	"link":      regexp.MustCompile(`symlink .*(leads out|loops)|symlink to an absolute path`),
	"parent":    regexp.MustCompile(`written through the symlink|is not a directory|exists under this name|symlink over an existing entry`),
	"hardlink":  regexp.MustCompile(`hardlinks are refused`),
	"sparse":    regexp.MustCompile(`sparse file`),
	"device":    regexp.MustCompile(`device node`),
	"fifo":      regexp.MustCompile(`fifo`),
	"type":      regexp.MustCompile(`unsupported entry type`),
	"data":      regexp.MustCompile(`carries \d+ bytes of data`),
	"headers":   regexp.MustCompile(`headers before one entry pass|more than \d+ records|with no entry after it`),
	"malformed": regexp.MustCompile(`invalid tar header|archive/tar`),
	"truncated": regexp.MustCompile(`ended inside the file|unexpected EOF`),
	"bytes":     regexp.MustCompile(`--max-bytes`),
	"entries":   regexp.MustCompile(`--max-files`),
}

const (
	corpusMaxBytes   = 1 << 20
	corpusMaxEntries = 16
)

// ---- raw tar: every header written by hand, so a case holds exactly the bytes it names ----

func tarBlock(name string, typ byte, size int64, link string) []byte {
	b := make([]byte, 512)
	copy(b[0:100], name)
	copy(b[100:], fmt.Sprintf("%07o\x00", 0o644))
	copy(b[108:], "0000000\x00")
	copy(b[116:], "0000000\x00")
	copy(b[124:], fmt.Sprintf("%011o\x00", size))
	copy(b[136:], "00000000000\x00")
	b[156] = typ
	copy(b[157:257], link)
	copy(b[257:], "ustar\x0000")
	for i := 148; i < 156; i++ {
		b[i] = ' '
	}
	sum := 0
	for _, c := range b {
		sum += int(c)
	}
	copy(b[148:], fmt.Sprintf("%06o\x00 ", sum))
	return b
}

func padded(data []byte) []byte {
	return append(slices.Clone(data), make([]byte, (512-len(data)%512)%512)...)
}

func tFile(name, body string) []byte {
	return append(tarBlock(name, '0', int64(len(body)), ""), padded([]byte(body))...)
}
func tDir(name string) []byte          { return tarBlock(name, '5', 0, "") }
func tSymlink(name, to string) []byte  { return tarBlock(name, '2', 0, to) }
func tHardlink(name, to string) []byte { return tarBlock(name, '1', 0, to) }
func tType(name string, typ byte) []byte {
	return tarBlock(name, typ, 0, "")
}

// gnuMagic rewrites a header as GNU tar's (its magic "ustar  ", what an old GNU sparse header
// needs), its checksum again.
func gnuMagic(b []byte) []byte {
	copy(b[257:265], "ustar  \x00")
	for i := 148; i < 156; i++ {
		b[i] = ' '
	}
	sum := 0
	for _, c := range b[:512] {
		sum += int(c)
	}
	copy(b[148:], fmt.Sprintf("%06o\x00 ", sum))
	return b
}

// tPax is a PAX header (typ 'x' local, 'g' global) of the records, in the order given.
func tPax(typ byte, records ...[2]string) []byte {
	var data []byte
	for _, r := range records {
		body := " " + r[0] + "=" + r[1] + "\n"
		n := len(body) + len(strconv.Itoa(len(body)))
		if len(strconv.Itoa(n)) != len(strconv.Itoa(len(body))) {
			n = len(body) + len(strconv.Itoa(n))
		}
		data = append(data, strconv.Itoa(n)+body...)
	}
	return append(tarBlock("PaxHeader", typ, int64(len(data)), ""), padded(data)...)
}

// tLong is a GNU long name ('L') or link ('K') header.
func tLong(typ byte, name string) []byte {
	data := append([]byte(name), 0)
	return append(tarBlock("././@LongLink", typ, int64(len(data)), ""), padded(data)...)
}

func tarOf(parts ...[]byte) []byte {
	return append(bytes.Join(parts, nil), make([]byte, 1024)...)
}

// manyRecords is n records key<prefix><i>=<value>.
func manyRecords(prefix string, n int, value string) [][2]string {
	out := make([][2]string, n)
	for i := range out {
		out[i] = [2]string{fmt.Sprintf("%s%04d", prefix, i), value}
	}
	return out
}

// flood is n PAX headers of typ, each of distinct keys and valueBytes of values, then an entry.
func flood(typ byte, n, valueBytes int) []byte {
	var parts [][]byte
	for i := range n {
		parts = append(parts, tPax(typ, manyRecords(fmt.Sprintf("flood%04d.", i), 4, strings.Repeat("v", valueBytes/4))...))
	}
	parts = append(parts, tFile("f", "after the flood"))
	return tarOf(parts...)
}

func file(p, content string) corpusFile { return corpusFile{Path: p, Type: "file", Content: content} }
func dir(p string) corpusFile           { return corpusFile{Path: p, Type: "dir"} }
func link(p, to string) corpusFile      { return corpusFile{Path: p, Type: "symlink", Target: to} }

func refused(name, reason, about string, build func() []byte) corpusCase {
	return corpusCase{Name: name, About: about, Want: "refused", Reason: reason, build: build}
}

func accepted(name, about string, files []corpusFile, build func() []byte) corpusCase {
	return corpusCase{Name: name, About: about, Want: "ok", Files: files, build: build}
}

func corpusCases() []corpusCase {
	long := strings.Repeat("n", 200) + "/" + strings.Repeat("m", 150)
	return []corpusCase{
		accepted("ok-basic", "a directory, a file, a link inside, a non-ASCII name in a PAX path",
			[]corpusFile{dir("d"), file("d/f", "hello"), file("d/é", "accent"), link("l", "d/f")},
			func() []byte {
				return tarOf(tDir("d/"), tFile("d/f", "hello"), tPax('x', [2]string{"path", "d/é"}), tFile("d/e", "accent"), tSymlink("l", "d/f"))
			}),
		accepted("ok-global-pax", "a global PAX header (git archive writes one) before the entries",
			[]corpusFile{file("f", "x")},
			func() []byte { return tarOf(tPax('g', [2]string{"comment", "0123abc"}), tFile("f", "x")) }),
		accepted("ok-gnu-longname", "a GNU long name",
			[]corpusFile{dir(strings.Repeat("n", 200)), file(long, "long")},
			func() []byte { return tarOf(tLong('L', long), tFile("short", "long")) }),
		accepted("ok-longname-over-pax", "a GNU long name and a PAX path for one entry: the long name wins (archive/tar's reading)",
			[]corpusFile{file("fromlong", "x")},
			func() []byte {
				return tarOf(tPax('x', [2]string{"path", "frompax"}), tLong('L', "fromlong"), tFile("header", "x"))
			}),
		accepted("ok-pax-reset", "a PAX path applies to its entry only; a second PAX header replaces the first",
			[]corpusFile{file("p", "1"), file("q", "3"), file("second", "2")},
			func() []byte {
				return tarOf(tPax('x', [2]string{"path", "p"}), tFile("first", "1"), tFile("second", "2"),
					tPax('x', [2]string{"path", "dropped"}), tPax('x', [2]string{"path", "q"}), tFile("third", "3"))
			}),
		accepted("ok-global-drops-pending", "a global header drops a PAX header waiting for its entry (archive/tar's reading)",
			[]corpusFile{file("own", "x")},
			func() []byte {
				return tarOf(tPax('x', [2]string{"path", "renamed"}), tPax('g', [2]string{"comment", "c"}), tFile("own", "x"))
			}),
		accepted("ok-pax-one-big-header", "one PAX header of 900 KiB (under 1 MiB and 256 records) is fine",
			[]corpusFile{file("f", "x")},
			func() []byte {
				return tarOf(tPax('x', manyRecords("big.", 200, strings.Repeat("b", 900<<10/200))...), tFile("f", "x"))
			}),
		accepted("ok-contiguous", "a contiguous file ('7'), read as a regular file",
			[]corpusFile{file("c", "x")},
			func() []byte { return tarOf(append(tarBlock("c", '7', 1, ""), padded([]byte("x"))...)) }),
		accepted("ok-link-dangling-inside", "a dangling link whose every step stays inside",
			[]corpusFile{link("l", "missing/x")},
			func() []byte { return tarOf(tSymlink("l", "missing/x")) }),
		accepted("ok-link-chain-inside", "a chain of links that stays inside",
			[]corpusFile{link("a", "d"), link("b", "a/f"), dir("d"), file("d/f", "x")},
			func() []byte { return tarOf(tDir("d/"), tFile("d/f", "x"), tSymlink("a", "d"), tSymlink("b", "a/f")) }),
		accepted("ok-link-dotdot-inside", "a link down and back up, inside",
			[]corpusFile{dir("d"), dir("d/e"), link("d/e/l", "../../f"), file("f", "x")},
			func() []byte { return tarOf(tDir("d/"), tDir("d/e/"), tFile("f", "x"), tSymlink("d/e/l", "../../f")) }),

		refused("pax-many-records", "headers", "one PAX header of 300 distinct keys",
			func() []byte { return tarOf(tPax('x', manyRecords("k", 300, "v")...), tFile("f", "x")) }),
		refused("pax-flood", "headers", "200 PAX headers of distinct keys, 16 KiB each, before one entry (issue 26 item 3)",
			func() []byte { return flood('x', 200, 16<<10) }),
		refused("pax-flood-small", "headers", "5,000 PAX headers of one small record each before one entry",
			func() []byte { return flood('x', 5000, 4) }),
		refused("pax-global-flood", "headers", "200 global PAX headers of 16 KiB each before one entry",
			func() []byte { return flood('g', 200, 16<<10) }),
		refused("pax-global-many-records", "headers", "a global PAX header of 300 keys",
			func() []byte { return tarOf(tPax('g', manyRecords("g", 300, "v")...), tFile("f", "x")) }),
		refused("pax-no-entry", "headers", "a PAX header and then the end of the archive",
			func() []byte { return tarOf(tFile("f", "x"), tPax('x', [2]string{"path", "p"})) }),
		refused("longname-no-entry", "headers", "a GNU long name and then the end of the archive",
			func() []byte { return tarOf(tFile("f", "x"), tLong('L', "p")) }),
		refused("pax-malformed", "malformed", "a PAX record whose length is wrong",
			func() []byte {
				data := []byte("99 path=x\n")
				return tarOf(append(tarBlock("PaxHeader", 'x', int64(len(data)), ""), padded(data)...), tFile("f", "x"))
			}),
		refused("pax-negative-size", "malformed", "a PAX size of -1",
			func() []byte { return tarOf(tPax('x', [2]string{"size", "-1"}), tFile("f", "")) }),
		refused("bad-checksum", "malformed", "a header whose checksum is wrong",
			func() []byte {
				b := tFile("f", "x")
				b[0] = 'g'
				return tarOf(b)
			}),

		refused("name-absolute", "name", "an absolute name",
			func() []byte { return tarOf(tFile("/tmp/kubeclip-corpus-abs", "x")) }),
		refused("name-dotdot", "name", "a name with '..'",
			func() []byte { return tarOf(tFile("a/../../escaped", "x")) }),
		refused("name-pax-dotdot", "name", "a PAX path with '..'",
			func() []byte { return tarOf(tPax('x', [2]string{"path", "../escaped"}), tFile("f", "x")) }),
		refused("name-too-long", "name", "a GNU long name of 5,000 bytes",
			func() []byte { return tarOf(tLong('L', strings.Repeat("n/", 2500)), tFile("f", "x")) }),

		refused("link-absolute", "link", "a symlink to an absolute path",
			func() []byte { return tarOf(tSymlink("l", "/etc/passwd")) }),
		refused("link-dotdot", "link", "a symlink up out of the root",
			func() []byte { return tarOf(tSymlink("l", "../secret.txt")) }),
		refused("link-dotdot-deep", "link", "a symlink in a directory, up past the root",
			func() []byte { return tarOf(tDir("d/"), tSymlink("d/l", "../../secret.txt")) }),
		refused("link-dangling-out", "link", "issue 26 item 6: a/b -> .., steal -> a/b/../other/notes.txt (dangling, out through a link)",
			func() []byte {
				return tarOf(tDir("a/"), tSymlink("a/b", ".."), tSymlink("steal", "a/b/../other/notes.txt"))
			}),
		refused("link-chain-out", "link", "issue 26 item 10: a -> ., up -> a/.., steal -> up/secret.txt (secret.txt exists outside)",
			func() []byte {
				return tarOf(tSymlink("a", "."), tSymlink("up", "a/.."), tSymlink("steal", "up/secret.txt"))
			}),
		refused("link-chain-out-reversed", "link", "item 10's chain, its links in the opposite order",
			func() []byte {
				return tarOf(tSymlink("steal", "up/secret.txt"), tSymlink("up", "a/.."), tSymlink("a", "."))
			}),
		refused("link-chain-out-then-device", "device", "item 10's chain and then a device node: refused at the device, no link out left behind",
			func() []byte {
				return tarOf(tSymlink("a", "."), tSymlink("up", "a/.."), tSymlink("steal", "up/secret.txt"), tType("null", '3'))
			}),
		refused("link-loop", "link", "two links pointing at each other",
			func() []byte { return tarOf(tSymlink("a", "b"), tSymlink("b", "a")) }),
		refused("link-then-write-through", "parent", "a symlink and then a file under it",
			func() []byte { return tarOf(tSymlink("l", "d"), tDir("d/"), tFile("l/f", "x")) }),

		refused("link-then-file-same-name", "parent", "a symlink and then a file of the same name",
			func() []byte { return tarOf(tSymlink("l", "f"), tFile("l", "x")) }),
		refused("file-then-link-same-name", "parent", "a file and then a symlink of the same name",
			func() []byte { return tarOf(tFile("l", "x"), tSymlink("l", "f")) }),
		accepted("ok-file-twice", "a file and then a file of the same name: the later one wins, as with tar",
			[]corpusFile{file("f", "second")},
			func() []byte { return tarOf(tFile("f", "first"), tFile("f", "second")) }),
		refused("hardlink-in", "hardlink", "a hardlink to a file of the archive",
			func() []byte { return tarOf(tFile("f", "x"), tHardlink("h", "f")) }),
		refused("hardlink-out", "hardlink", "a hardlink out of the root",
			func() []byte { return tarOf(tHardlink("h", "../secret.txt")) }),
		refused("sparse-gnu-header", "sparse", "an old GNU sparse header ('S')",
			func() []byte { return tarOf(gnuMagic(tType("s", 'S'))) }),
		refused("sparse-pax", "sparse", "a PAX 1.0 sparse file (GNU.sparse.* records)",
			func() []byte {
				return tarOf(tPax('x', [2]string{"GNU.sparse.major", "1"}, [2]string{"GNU.sparse.minor", "0"}, [2]string{"GNU.sparse.name", "s"}, [2]string{"GNU.sparse.realsize", "0"}),
					tFile("GNUSparseFile.0/s", "0\n"+strings.Repeat("\x00", 510)))
			}),
		refused("device-char", "device", "a character device", func() []byte { return tarOf(tType("null", '3')) }),
		refused("device-block", "device", "a block device", func() []byte { return tarOf(tType("sda", '4')) }),
		refused("fifo", "fifo", "a fifo", func() []byte { return tarOf(tType("p", '6')) }),
		refused("type-unknown", "type", "an entry type no tar defines", func() []byte { return tarOf(tType("z", 'Z')) }),
		refused("dir-with-data", "data", "a directory that declares 512 bytes of data (a parser differential: a reader that skips it and one that does not disagree on the next header)",
			func() []byte {
				return tarOf(tarBlock("d/", '5', 512, ""), tFile("hidden", strings.Repeat("h", 100)))
			}),
		refused("symlink-with-data", "data", "a symlink that declares data",
			func() []byte { return tarOf(tarBlock("l", '2', 512, "f"), make([]byte, 512)) }),

		refused("oversize-pax", "bytes", "a file of 1 TiB by its PAX size, with no data",
			func() []byte {
				return tarOf(tPax('x', [2]string{"size", strconv.Itoa(1 << 40)}), tarBlock("bomb", '0', 0, ""))
			}),
		refused("oversize-sum", "bytes", "two files of 600 KiB: over the corpus's 1 MiB",
			func() []byte {
				return tarOf(tFile("a", strings.Repeat("a", 600<<10)), tFile("b", strings.Repeat("b", 600<<10)))
			}),
		refused("too-many-entries", "entries", "17 entries: over the corpus's 16",
			func() []byte {
				var parts [][]byte
				for i := range 17 {
					parts = append(parts, tFile(fmt.Sprintf("f%02d", i), ""))
				}
				return tarOf(parts...)
			}),
		refused("truncated", "truncated", "a file that declares 1,000 bytes and the archive ends after 100",
			func() []byte { return append(tarBlock("f", '0', 1000, ""), bytes.Repeat([]byte("t"), 100)...) }),

		{Name: "gnutar-sparse-gnu", Archive: "gnutar/gnu-small.tar.gz", Want: "refused", Reason: "sparse",
			About: "GNU tar 1.34 --sparse --format=gnu of a 1 MiB file holding \"end\" at its end"},
		{Name: "gnutar-sparse-pax", Archive: "gnutar/pax-small.tar.gz", Want: "refused", Reason: "sparse",
			About: "GNU tar 1.34 --sparse --format=pax of the same file"},
		{Name: "gnutar-sparse-bomb-gnu", Archive: "gnutar/gnu-bomb.tar.gz", Want: "refused", Reason: "sparse",
			About: "GNU tar 1.34 --sparse --format=gnu of a 4 GiB file (a few KiB archived)"},
		{Name: "gnutar-sparse-bomb-pax", Archive: "gnutar/pax-bomb.tar.gz", Want: "refused", Reason: "sparse",
			About: "GNU tar 1.34 --sparse --format=pax of the 4 GiB file"},
	}
}

// gz compresses deterministically (no name, no time in the gzip header).
func gz(t *testing.T, data []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := zw.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func gunzip(t *testing.T, file string) []byte {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func corpusManifestOf() corpusManifest {
	var m corpusManifest
	m.About = "Hostile archives both extractors must treat alike: sandboxd's Untar (pkg/sandboxd/corpus_test.go, which writes this directory with -update) and the plugin's Extractor (plugins/paperclip/src/corpus.test.ts). Each archive is extracted under setup.root with setup.outside beside it, with the bounds maxBytes and maxEntries; want is ok (files: everything under the root after) or refused (reason: one of reasons)."
	m.Setup.Root = "target"
	m.Setup.Outside = []string{"secret.txt"}
	m.MaxBytes = corpusMaxBytes
	m.MaxEntries = corpusMaxEntries
	for r := range corpusReasons {
		m.Reasons = append(m.Reasons, r)
	}
	slices.Sort(m.Reasons)
	for _, c := range corpusCases() {
		if c.Archive == "" {
			c.Archive = c.Name + ".tar.gz"
		}
		m.Cases = append(m.Cases, c)
	}
	return m
}

// TestArchiveCorpus extracts every archive of testdata/archives with Untar and checks the
// outcome its manifest gives; the generated archives must be what corpusCases builds.
func TestArchiveCorpus(t *testing.T) {
	m := corpusManifestOf()
	if *update {
		for _, c := range m.Cases {
			if c.build != nil {
				if err := os.WriteFile(filepath.Join(corpusDir, c.Archive), gz(t, c.build()), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}
		b, err := json.MarshalIndent(m, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(corpusDir, "manifest.json"), append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var onDisk corpusManifest
	b, err := os.ReadFile(filepath.Join(corpusDir, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &onDisk); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(m, onDisk, cmp.AllowUnexported(corpusCase{}), cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".build" }, cmp.Ignore())); diff != "" {
		t.Fatalf("testdata/archives/manifest.json is not what corpusCases gives (go test -run TestArchiveCorpus ./pkg/sandboxd/ -update) (-want +got):\n%s", diff)
	}
	for _, c := range m.Cases {
		t.Run(c.Name, func(t *testing.T) {
			data := gunzip(t, filepath.Join(corpusDir, c.Archive))
			if c.build != nil && !bytes.Equal(data, c.build()) {
				t.Fatalf("%s is not what corpusCases builds (go test -run TestArchiveCorpus ./pkg/sandboxd/ -update)", c.Archive)
			}
			base := t.TempDir()
			for _, o := range m.Setup.Outside {
				if err := os.WriteFile(filepath.Join(base, o), []byte("outside"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			root := filepath.Join(base, m.Setup.Root)
			_, err := sandboxd.Untar(bytes.NewReader(data), sandboxd.UntarOptions{Root: root, MaxBytes: m.MaxBytes, MaxFiles: m.MaxEntries})
			switch c.Want {
			case "ok":
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if diff := cmp.Diff(c.Files, treeOf(t, root)); diff != "" {
					t.Errorf("the root after (-want +got):\n%s", diff)
				}
			case "refused":
				var se *sandboxd.SyncError
				if !errors.As(err, &se) || !se.Refused {
					t.Fatalf("got %v, want it refused (%s)", err, c.Reason)
				}
				if re := corpusReasons[c.Reason]; !re.MatchString(se.Error()) {
					t.Errorf("refused as %q, want a refusal of class %s (%s)", se.Error(), c.Reason, re)
				}
			}
			noLinkOut(t, root)
		})
	}
}

// treeOf lists everything under root, sorted by path.
func treeOf(t *testing.T, root string) []corpusFile {
	t.Helper()
	var out []corpusFile
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			to, err := os.Readlink(p)
			out = append(out, link(rel, to))
			return err
		case d.IsDir():
			out = append(out, dir(rel))
		default:
			b, err := os.ReadFile(p)
			out = append(out, file(rel, string(b)))
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// noLinkOut fails if a link left under root (refused or not) resolves outside it.
func noLinkOut(t *testing.T, root string) {
	t.Helper()
	realRoot, err := filepath.EvalSymlinks(filepath.Dir(root))
	if err != nil {
		t.Fatal(err)
	}
	realRoot = filepath.Join(realRoot, filepath.Base(root))
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.Type()&fs.ModeSymlink == 0 {
			return nil
		}
		if real, err := filepath.EvalSymlinks(p); err == nil && real != realRoot && !strings.HasPrefix(real, realRoot+"/") {
			t.Errorf("%s is left, a link to %s outside the root", p, real)
		}
		return nil
	})
}
