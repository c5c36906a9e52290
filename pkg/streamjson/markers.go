package streamjson

import (
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"
)

// A raw line is scanned for four markers, each a case-insensitive regexp of many alternatives,
// and an agent's output may be nothing but raw lines: run through all four, every byte cost the
// worker parsing it (the exec-worker's recorder, the run-watcher) about a microsecond of
// backtracking (BenchmarkScanRaw: 1 MB/s), far more than the pod spent printing it, so one
// company's loud command took the CPU every other company's execs wait for (issue 26: 58 % of
// a busy exec-worker's CPU profile beside a flood). So:
//   - each alternative of a marker holds one of its words, and a line whose case-folded text
//     holds none of them is not run through the regexp (ordinary output: 114 MB/s);
//   - a transcript's raw lines run through the regexps for at most maxMarkerMatched bytes:
//     output made of the words (hostile: the output is the agent's) costs about a second of
//     CPU, then is scanned no further. A marker is no authority anyway: the agent can print any.

// marker is a regexp with words one of which every match holds, lower case.
type marker struct {
	re    *regexp.Regexp
	words []string
}

// mayMatch reports whether the folded line holds one of m's words.
func (m marker) mayMatch(folded string) bool {
	for _, w := range m.words {
		if strings.Contains(folded, w) {
			return true
		}
	}
	return false
}

// foldCase maps every rune to the lower case of its upper case: each rune a `(?i)` regexp
// matches for an ASCII letter of a word becomes that letter (ſ to s and the Kelvin sign to k
// included), so a line that matches holds the word in its folded form. Runes may fold to a
// letter no regexp would match them with (ı to i): that costs a regexp run, never a match.
func foldCase(line string) string {
	for i := 0; i < len(line); i++ {
		if line[i] >= utf8.RuneSelf {
			return strings.Map(func(r rune) rune { return unicode.ToLower(unicode.ToUpper(r)) }, line)
		}
	}
	return strings.ToLower(line)
}
