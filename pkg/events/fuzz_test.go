package events_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// The fuzz targets below feed the decoders what tenants send (lease and dispatch requests),
// what kubeclip reads back (run events, KV keys, CloudEvents headers) and what pods write (log
// text). Their seed corpora under testdata/fuzz run with every `go test`; `make fuzz` explores.

func FuzzDecodeLeaseRequest(f *testing.F) {
	f.Add("paperclip.lease.c1.acquire", []byte(`{"runId":"r1","companyId":"c1","environmentId":"e","agentId":"a","config":{}}`))
	f.Add("paperclip.lease.c1.destroy", []byte(`{"runId":"r1","companyId":"c1"}`))
	f.Fuzz(func(t *testing.T, subject string, data []byte) {
		var s events.Subjects
		company, kind, subjErr := s.ParseLeaseSubject(subject)
		ref, request := events.FailureRef(received{subject: subject, data: data})
		// A failure is reported to the company of the subject, never to one the payload names.
		if subjErr == nil && (ref.CompanyID != company || request != kind) {
			t.Fatalf("FailureRef = %+v, %q; the subject names %q, %q", ref, request, company, kind)
		}

		acquire, err := s.DecodeAcquire(subject, data)
		checkRefusal(t, err)
		if err == nil {
			if kind != events.LeaseAcquire || acquire.CompanyID != company || acquire.Validate() != nil {
				t.Fatalf("accepted %+v on %q", acquire, subject)
			}
			if ref != events.Ref(acquire.CompanyID, acquire.RunID) {
				t.Fatalf("FailureRef = %+v, but the acquire is run %q of %q", ref, acquire.RunID, acquire.CompanyID)
			}
			again, err := s.DecodeAcquire(subject, encodeJSON(t, acquire))
			if err != nil {
				t.Fatalf("decoding the re-encoded acquire: %v", err)
			}
			if diff := cmp.Diff(acquire, again, compactJSON); diff != "" {
				t.Fatalf("re-encoded acquire (-first +again):\n%s", diff)
			}
		}

		release, err := s.DecodeRelease(subject, data)
		checkRefusal(t, err)
		if err == nil {
			if release.Kind() != kind || release.CompanyID != company || release.Validate() != nil {
				t.Fatalf("accepted %+v on %q", release, subject)
			}
			if ref != events.Ref(release.CompanyID, release.RunID) {
				t.Fatalf("FailureRef = %+v, but the request is run %q of %q", ref, release.RunID, release.CompanyID)
			}
			again, err := s.DecodeRelease(subject, encodeJSON(t, release))
			if err != nil {
				t.Fatalf("decoding the re-encoded request: %v", err)
			}
			if diff := cmp.Diff(release, again); diff != "" {
				t.Fatalf("re-encoded request (-first +again):\n%s", diff)
			}
		}
	})
}

func FuzzDecodeDispatch(f *testing.F) {
	f.Add("kubeclip.dispatch.c1.r1", []byte(`{"runId":"r1","companyId":"c1","environmentId":"e","agentId":"a","config":{},"namespace":"paperclip-c1"}`))
	f.Fuzz(func(t *testing.T, subject string, data []byte) {
		req, err := events.DecodeDispatch(subject, data)
		checkRefusal(t, err)
		if err != nil {
			return
		}
		company, run, err := events.ParseDispatchSubject(subject)
		if err != nil || req.CompanyID != company || req.RunID != run || req.Validate() != nil {
			t.Fatalf("accepted %+v on %q (%v)", req, subject, err)
		}
		if ref, request := events.FailureRef(received{subject: subject, data: data}); ref != events.Ref(company, run) || request != events.LeaseAcquire {
			t.Fatalf("FailureRef = %+v, %q; want the subject's run and acquire", ref, request)
		}
		again, err := events.DecodeDispatch(subject, encodeJSON(t, req))
		if err != nil {
			t.Fatalf("decoding the re-encoded dispatch: %v", err)
		}
		if diff := cmp.Diff(req, again, compactJSON); diff != "" {
			t.Fatalf("re-encoded dispatch (-first +again):\n%s", diff)
		}
	})
}

func FuzzDecodeRunEvent(f *testing.F) {
	f.Add("paperclip.run.c1.r1.status", []byte(`{"runId":"r1","companyId":"c1","at":"2026-08-24T10:30:00Z","phase":"Running"}`))
	// An exec lease's end: Releasing, then a released result with the agent exec's account.
	f.Add("paperclip.run.c1.r1.status", []byte(`{"runId":"r1","companyId":"c1","at":"2026-08-24T10:30:00Z","phase":"Running","reason":"Releasing"}`))
	f.Add("paperclip.run.c1.r1.result", []byte(`{"runId":"r1","companyId":"c1","at":"2026-08-24T10:30:00Z","outcome":"released","exitCode":0,"reason":"Released","agent":{"sessionId":"s","model":"m","usage":{"inputTokens":1,"outputTokens":2,"cachedInputTokens":0},"costUsd":0.01,"summary":"done","isError":false}}`))
	f.Fuzz(func(t *testing.T, subject string, data []byte) {
		var s events.Subjects
		ev, err := s.DecodeRunEvent(subject, data)
		checkRefusal(t, err)
		if err != nil {
			return
		}
		company, run, kind, err := s.ParseRunSubject(subject)
		if c, r := ev.IDs(); err != nil || c != company || r != run {
			t.Fatalf("decoded run %q of %q on %q (%v)", r, c, subject, err)
		}
		if want := "io.paperclip.run." + string(kind) + ".v1"; ev.Type() != want {
			t.Fatalf("a %s subject decoded to a %s", kind, ev.Type())
		}
		again, err := s.DecodeRunEvent(subject, encodeJSON(t, ev))
		if err != nil {
			t.Fatalf("decoding the re-encoded event: %v", err)
		}
		if diff := cmp.Diff(ev, again, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("re-encoded event (-first +again):\n%s", diff)
		}
	})
}

func FuzzParseSubject(f *testing.F) {
	for _, s := range []string{"paperclip.lease.c1.acquire", "paperclip.run.c1.r1.log", "kubeclip.dispatch.c1.r1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, subject string) {
		var s events.Subjects
		// Whatever parses rebuilds to the same subject, and the ids logged for it are the parsed ones.
		if company, kind, err := s.ParseLeaseSubject(subject); err == nil {
			rebuilt, err := s.Lease(company, kind)
			if err != nil || rebuilt != subject {
				t.Fatalf("lease subject %q rebuilds to %q (%v)", subject, rebuilt, err)
			}
			if c, r := events.MsgIDs(subject); c != company || r != "" {
				t.Fatalf("MsgIDs(%q) = %q, %q", subject, c, r)
			}
		} else {
			checkSubjectError(t, err)
		}
		if company, run, kind, err := s.ParseRunSubject(subject); err == nil {
			rebuilt, err := s.Run(company, run, kind)
			if err != nil || rebuilt != subject {
				t.Fatalf("run subject %q rebuilds to %q (%v)", subject, rebuilt, err)
			}
			if c, r := events.MsgIDs(subject); c != company || r != run {
				t.Fatalf("MsgIDs(%q) = %q, %q", subject, c, r)
			}
		} else {
			checkSubjectError(t, err)
		}
		if company, run, err := events.ParseDispatchSubject(subject); err == nil {
			rebuilt, err := events.DispatchSubject(company, run)
			if err != nil || rebuilt != subject {
				t.Fatalf("dispatch subject %q rebuilds to %q (%v)", subject, rebuilt, err)
			}
			if c, r := events.MsgIDs(subject); c != company || r != run {
				t.Fatalf("MsgIDs(%q) = %q, %q", subject, c, r)
			}
		} else {
			checkSubjectError(t, err)
		}
	})
}

// kvKey is what a NATS KV key may be.
var kvKey = regexp.MustCompile(`^[-/_=.a-zA-Z0-9]+$`)

func FuzzRunKey(f *testing.F) {
	f.Add("7d2f1c9e-3b4a-4e8d-a6f1-0c5b9e2d7a13", "0e8b6f4a-5a7c-4c1e-9f0b-2a9d7c3e1b44")
	f.Fuzz(func(t *testing.T, companyID, runID string) {
		ref := events.Ref(companyID, runID)
		key := ref.Key()
		if !kvKey.MatchString(key) || strings.HasSuffix(key, ".") || strings.Count(key, ".") != 1 {
			t.Fatalf("Key of %+v = %q: not a KV key of two tokens", ref, key)
		}
		if companyID != "" && runID != "" {
			if got, ok := events.ParseRunKey(key); !ok || got != ref {
				t.Fatalf("ParseRunKey(%q) = %+v, %v; want %+v", key, got, ok, ref)
			}
		}
		// Any key that parses names a run whose own key parses back to it.
		if got, ok := events.ParseRunKey(companyID); ok {
			if got.CompanyID == "" || got.RunID == "" {
				t.Fatalf("ParseRunKey(%q) = %+v: an empty id", companyID, got)
			}
			if again, ok := events.ParseRunKey(got.Key()); !ok || again != got {
				t.Fatalf("ParseRunKey(%q) = %+v, but its key %q parses to %+v, %v", companyID, got, got.Key(), again, ok)
			}
		}
	})
}

// FuzzSource: a ce-source names its company and run unambiguously (kubeclip never parses one
// back, consumers may: the path-escaped ids come back out), and every header value is printable.
func FuzzSource(f *testing.F) {
	f.Add("7d2f1c9e-3b4a-4e8d-a6f1-0c5b9e2d7a13", "0e8b6f4a-5a7c-4c1e-9f0b-2a9d7c3e1b44")
	f.Fuzz(func(t *testing.T, companyID, runID string) {
		source := events.Source(companyID, runID)
		if companyID != "" && runID != "" {
			if c, r, ok := parseSource(source); !ok || c != companyID || r != runID {
				t.Fatalf("Source(%q, %q) = %q, which splits into %q, %q, %v", companyID, runID, source, c, r, ok)
			}
		}
		// A header value is printable ASCII without spaces or quotes, and decodes to what was encoded.
		for _, v := range []string{source, companyID} {
			header := events.EncodeHeaderValue(v)
			for i := 0; i < len(header); i++ {
				if c := header[i]; c <= ' ' || c >= 0x7f || c == '"' {
					t.Fatalf("EncodeHeaderValue(%q) = %q: byte %#x", v, header, c)
				}
			}
			if got, err := url.PathUnescape(header); err != nil || got != v {
				t.Fatalf("EncodeHeaderValue(%q) = %q, which unescapes to %q, %v", v, header, got, err)
			}
		}
		// Any source that parses is the source of the run it names.
		if c, r, ok := parseSource(companyID); ok {
			if c == "" || r == "" {
				t.Fatalf("parseSource(%q) = %q, %q: an empty id", companyID, c, r)
			}
			if c2, r2, ok := parseSource(events.Source(c, r)); !ok || c2 != c || r2 != r {
				t.Fatalf("parseSource(%q) = %q, %q, but Source of those parses to %q, %q, %v", companyID, c, r, c2, r2, ok)
			}
		}
	})
}

// checkRefusal checks a decoder's error: a TerminalError with code invalid_request, whose
// failed event can be published.
func checkRefusal(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		return
	}
	te, ok := events.AsTerminal(err)
	if !ok || te.Code != events.CodeInvalidRequest {
		t.Fatalf("error %v: want an invalid_request TerminalError", err)
	}
	if !utf8.ValidString(te.Field) {
		t.Fatalf("field %q is not UTF-8", te.Field)
	}
	long := strings.Repeat("x", events.MaxTokenLen)
	if _, err := newPublisher(t, noPublish{}).Msg(events.NewRunFailed(events.Ref(long, long), events.LeaseAcquire, err)); err != nil {
		t.Fatalf("building the failed event of %v: %v", te, err)
	}
}

func checkSubjectError(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, events.ErrUnknownSubject) && !errors.Is(err, events.ErrInvalidToken) {
		t.Fatalf("subject error %v wraps neither ErrUnknownSubject nor ErrInvalidToken", err)
	}
}

// encodeJSON encodes v as kubeclip publishes it: without HTML escaping.
func encodeJSON(t *testing.T, v any) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		t.Fatalf("encoding %T: %v", v, err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

// compactJSON compares raw JSON fields without their insignificant whitespace, which encoding
// drops.
var compactJSON = cmp.Transformer("compact", func(raw json.RawMessage) string {
	var buf bytes.Buffer
	if json.Compact(&buf, raw) != nil {
		return string(raw)
	}
	return buf.String()
})

// received is a consumed message as FailureRef reads it: a subject and data.
type received struct {
	jetstream.Msg
	subject string
	data    []byte
}

func (m received) Subject() string { return m.subject }
func (m received) Data() []byte    { return m.data }

// parseSource splits a ce-source as a consumer would.
func parseSource(source string) (companyID, runID string, ok bool) {
	rest, found := strings.CutPrefix(source, "/companies/")
	if !found {
		return "", "", false
	}
	c, r, found := strings.Cut(rest, "/runs/")
	if !found || strings.Contains(r, "/") {
		return "", "", false
	}
	c, err1 := url.PathUnescape(c)
	r, err2 := url.PathUnescape(r)
	if err1 != nil || err2 != nil || c == "" || r == "" {
		return "", "", false
	}
	return c, r, true
}
