package streamjson

import (
	"strings"
	"testing"
)

// markerPhrases are each marker's alternatives as the CLIs print them, and lines that hold a
// word but match nothing.
var markerPhrases = []string{
	"Not logged in · Please run /login", "please log in", "Please run `claude login`", "login required",
	"requires login", "401 Unauthorized", "Authentication required", "Invalid authentication credentials",
	"Failed to authenticate", "OAuth session expired",
	"model not_found", "model does not exist", "Model-unknown", "model invalid", "unknown_model",
	"You've hit your session limit", "You’ve hit your session limit", "session limit exceeded",
	"out of extra usage", "extra usage", "Claude usage limit reached", "5-hour limit reached",
	"weekly limit reached", "usage limit reached", "usage cap reached", "ServiceQuotaExceededException",
	"rate-limited", "rate_limit_error", "Too many requests", "HTTP 429", "overloaded_error",
	"server overloaded", "Service Unavailable", "503", "error 529", "high demand", "try again later",
	"temporarily unavailable", "throttled", "ThrottlingException",
	"the login page", "modelling", "a rate of 3", "limitless", "5290 bytes",
}

// markerLines are markerPhrases as raw lines may hold them: alone, inside other text, and with
// the runes a case-insensitive regexp takes for an ASCII letter (ſ for s, the Kelvin sign for k).
func markerLines() []string {
	var lines []string
	for _, p := range markerPhrases {
		lines = append(lines, p, strings.ToUpper(p), "stderr: "+p+" (retrying)",
			strings.ReplaceAll(p, "s", "ſ"), strings.ReplaceAll(p, "S", "ſ"), strings.ReplaceAll(strings.ToUpper(p), "K", "\u212a"))
	}
	return append(lines, "", "ordinary output", strings.Repeat("y\n", 2000), "ıogin required", "İ")
}

// scanAll is what markers.scan decided before the words: every regexp on every line.
func scanAll(line string) markers {
	return markers{
		login:         authRequiredRE.MatchString(line),
		modelNotFound: modelNotFoundRE.MatchString(line),
		quota:         providerQuotaRE.MatchString(line),
		transient:     transientUpstreamRE.MatchString(line),
	}
}

// TestMarkerWordsMissNoMatch: a marker's words let through every line its regexp matches, so
// scanning with them finds what the regexps alone find, and they do skip lines.
func TestMarkerWordsMissNoMatch(t *testing.T) {
	matched, skipped := 0, 0
	for _, line := range markerLines() {
		var got markers
		got.scan(line, nil)
		want := scanAll(line)
		if got != want {
			t.Errorf("line %q: scan found %+v, the regexps %+v", line, got, want)
		}
		if want != (markers{}) {
			matched++
		}
		folded := foldCase(line)
		for _, m := range []marker{authRequired, modelNotFound, providerQuota, transientUpstream} {
			if !m.mayMatch(folded) {
				skipped++
			}
		}
	}
	if matched < len(markerPhrases) || skipped == 0 {
		t.Fatalf("the corpus matched %d lines and let the words skip %d regexp runs; want every phrase matched and some skipped", matched, skipped)
	}
}

// FuzzMarkerWords: on any line, scanning with the words finds what the regexps alone find.
func FuzzMarkerWords(f *testing.F) {
	for _, line := range markerLines() {
		f.Add(line)
	}
	f.Fuzz(func(t *testing.T, line string) {
		var got markers
		got.scan(line, nil)
		if want := scanAll(line); got != want {
			t.Fatalf("line %q: scan found %+v, the regexps %+v", line, got, want)
		}
	})
}

// BenchmarkScanRaw is a raw output line of ordinary text: with the words, and every regexp.
func BenchmarkScanRaw(b *testing.B) {
	line := strings.Repeat("compiling module 42 of the build, step ok; ", 20)
	b.Run("words", func(b *testing.B) {
		b.SetBytes(int64(len(line)))
		for b.Loop() {
			var m markers
			m.scan(line, nil)
		}
	})
	b.Run("regexps", func(b *testing.B) {
		b.SetBytes(int64(len(line)))
		for b.Loop() {
			scanAll(line)
		}
	})
}

// TestMarkerRegexpsBounded: raw lines made of the markers' words run through the regexps for
// maxMarkerMatched bytes of a transcript, then no more; a marker printed before that is found.
func TestMarkerRegexpsBounded(t *testing.T) {
	words := strings.Repeat("the logbook of a ratepayer in germany, limitless usages, quotable; ", 60) // words of every marker but the model one, no match
	var p Parser
	p.Feed([]byte("please log in"))
	for p.rawMatched < maxMarkerMatched {
		p.Feed([]byte(words))
	}
	before := p.rawMatched
	p.Feed([]byte(words))
	p.Feed([]byte("429 Too Many Requests"))
	if p.rawMatched != before {
		t.Errorf("the regexps ran on %d more bytes past the bound %d", p.rawMatched-before, maxMarkerMatched)
	}
	if !p.raw.login || p.raw.transient {
		t.Errorf("markers %+v: want the login seen before the bound, the 429 after it not", p.raw)
	}
}
