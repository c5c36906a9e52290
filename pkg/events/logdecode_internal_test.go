package events

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

// logEventCases are log events as the run-watcher publishes them, with the text agents write:
// JSON lines, escapes, colours, non-ASCII, line separators, an invalid byte.
func logEventCases() []RunLogEvent {
	at := time.Date(2026, 11, 26, 10, 0, 0, 123456789, time.UTC)
	ev := func(lines ...LogLine) RunLogEvent {
		return RunLogEvent{RunID: "r1", CompanyID: "c1", At: at, Seq: 7, Pod: "pc-r1", Container: "agent", Lines: append([]LogLine{}, lines...)} // never null: the publisher stamps []
	}
	ts := "2026-11-26T10:00:00.000000001Z"
	return []RunLogEvent{
		ev(LogLine{TS: ts, Text: `{"type":"assistant","message":{"content":[{"type":"text","text":"stub line 1"}]}}`}),
		ev(LogLine{TS: ts, Text: "tab\there, newline\nthere, back\\slash, \"quoted\", slash /, <html> & more"}),
		ev(LogLine{TS: ts, Text: "\x1b[31mred\x1b[0m, bell \a, nul \x00, del \x7f"}),
		ev(LogLine{TS: ts, Text: "héllo wörld, 日本語, emoji 😀, line\u2028separator\u2029"}),
		ev(LogLine{TS: ts, Text: "invalid \xff byte", Partial: true}, LogLine{TS: ts, Text: ""}),
		ev(),
		{RunID: "r1", CompanyID: "c1", At: at, Seq: 18446744073709551615, Pod: "p", Container: "agent", Lines: []LogLine{}, LogStopped: BudgetCompany},
		{RunID: "r1", CompanyID: "c1", At: at.In(time.FixedZone("", 2*3600)), Seq: 1, Lines: []LogLine{}},
	}
}

// decodeBoth decodes data with the fast path and with decode, and fails t where they disagree:
// the fast path may decline, but what it takes decode takes and reads the same.
func decodeBoth(t *testing.T, data []byte) (RunLogEvent, bool) {
	t.Helper()
	fast, ok := decodeLogEvent(data)
	if !ok {
		return fast, false
	}
	var slow RunLogEvent
	if err := decode(data, &slow); err != nil {
		t.Fatalf("the fast path took %q, which decode refuses: %v", data, err)
	}
	if !reflect.DeepEqual(fast, slow) {
		t.Fatalf("the fast path read %q as\n%#v\ndecode as\n%#v", data, fast, slow)
	}
	return fast, true
}

func TestDecodeLogEventTakesWhatThePublisherWrites(t *testing.T) {
	for i, want := range logEventCases() {
		data, err := marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := decodeBoth(t, data)
		if !ok {
			t.Fatalf("case %d: the fast path declined what the publisher wrote: %s", i, data)
		}
		if got.Seq != want.Seq || len(got.Lines) != len(want.Lines) || got.LogStopped != want.LogStopped {
			t.Fatalf("case %d: got %+v, want %+v", i, got, want)
		}
		// The same with whitespace everywhere JSON allows it.
		spaced := strings.NewReplacer(`{"`, "{ \n\"", `":`, "\" :\t", `,"`, " ,\r\n \"", "[", "[ ", "]", " ] ", "}", " }").Replace(string(data))
		if _, ok := decodeBoth(t, []byte(" "+spaced+"\n")); !ok && !strings.Contains(string(data), `\"`) {
			t.Fatalf("case %d: the fast path declined the spaced %s", i, spaced)
		}
	}
}

func TestDecodeLogEventLeavesTheRestToDecode(t *testing.T) {
	big := `{"runId":"r1","lines":[{"text":"` + strings.Repeat("x", DefaultMaxMsgSize) + `"}]}`
	for _, data := range []string{
		``, `null`, `[]`, `{`, `{"runId":"r1"`, `{"runId":"r1"}x`, `{"runId":"r1",}`, `{,"runId":"r1"}`,
		`{"runId":"r1","other":1}`,         // unknown key: decode tolerates it
		`{"RunId":"r1"}`, `{"runid":"r1"}`, // another case: strictjson refuses it
		`{"runId":"r1","runId":"r2"}`,      // twice
		`{"lines":[{"ts":"a","ts":"b"}]}`,  // twice in a line
		`{"lines":[{"Text":"a"}]}`,         // another case in a line
		`{"runId":null}`, `{"lines":null}`, // null
		`{"runId":1}`, `{"seq":"1"}`, `{"seq":1.0}`, `{"seq":1e3}`, `{"seq":-1}`, `{"seq":01}`,
		`{"seq":18446744073709551616}`, // past uint64
		`{"lines":[{"partial":1}]}`, `{"lines":[{"partial":tru}]}`, `{"lines":{}}`, `{"lines":[1]}`,
		`{"at":"yesterday"}`, `{"at":"2026-11-26T10:00:00\u005a"}`, `{"at":1}`,
		"{\"runId\":\"a\x01b\"}",                         // a control byte
		"{\"runId\":\"a\xffb\"}",                         // invalid UTF-8: decode replaces it
		`{"runId":"\ud83d\ude00"}`, `{"runId":"\ud83d"}`, // surrogates: decode pairs or replaces them
		`{"runId":"\x41"}`, `{"runId":"\u12"}`, `{"runId":"a\"}`,
		`{"r\u0075nId":"r1"}`, // an escaped key
		big,
	} {
		if ev, ok := decodeBoth(t, []byte(data)); ok {
			t.Errorf("the fast path took %.80q as %+v; it should leave it to decode", data, ev)
		}
	}
}

func FuzzDecodeLogEventAgreesWithDecode(f *testing.F) {
	for _, ev := range logEventCases() {
		data, err := marshal(ev)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(`{"runId":"r1","runId":"r1"}`))
	f.Add([]byte(`{"seq":01,"lines":[{"partial":false}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		decodeBoth(t, data)
	})
}
