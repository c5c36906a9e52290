package mintproto_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/kubeclip/kubeclip/pkg/broker/mintproto"
	"github.com/kubeclip/kubeclip/pkg/events"
)

func TestSubjects(t *testing.T) {
	s := mintproto.NewSubjects(events.Subjects{})
	if got := s.MintFilter(); got != "paperclip.broker.*.*.mint" {
		t.Errorf("MintFilter = %q", got)
	}
	subj, err := s.Mint("company-a", "run-1")
	if err != nil || subj != "paperclip.broker.company-a.run-1.mint" {
		t.Fatalf("Mint = %q, %v", subj, err)
	}
	if c, r, err := s.ParseMint(subj); err != nil || c != "company-a" || r != "run-1" {
		t.Errorf("ParseMint(%q) = %q, %q, %v", subj, c, r, err)
	}
	for _, bad := range []string{"paperclip.broker.a.b.release", "paperclip.exec.a.b.mint", "other.broker.a.b.mint", "paperclip.broker.a.mint", "paperclip.broker.a.b.c.mint"} {
		if _, _, err := s.ParseMint(bad); !errors.Is(err, events.ErrUnknownSubject) {
			t.Errorf("ParseMint(%q): %v, want ErrUnknownSubject", bad, err)
		}
	}
	if _, err := s.Mint("a.b", "r"); err == nil {
		t.Error("Mint accepted a company id with a dot")
	}
}

// TestDecode: every refusal is an *Error naming the field, and none quotes the document.
func TestDecode(t *testing.T) {
	const secret = "sk-SECRET-VALUE"
	for _, tc := range []struct {
		name, doc, wantField, wantMessage string
	}{
		{"not JSON", `{"value":"` + secret, "", "not a valid JSON object"},
		{"not an object", `["` + secret + `"]`, "", "not a JSON object"},
		{"two values", `{"leaseId":"l","key":"K","value":"` + secret + `"} {}`, "", "not a valid JSON object"},
		{"key twice", `{"leaseId":"l","key":"K","value":"a","value":"` + secret + `"}`, "value", ""},
		{"another case", `{"leaseId":"l","Key":"K","value":"` + secret + `"}`, "Key", ""},
		{"unknown field", `{"leaseId":"l","key":"K","value":"` + secret + `","extra":true}`, "extra", "not a field"},
		{"wrong type", `{"leaseId":"l","key":"K","value":["` + secret + `"]}`, "value", "must be a string"},
		{"too large", `{"value":"` + strings.Repeat("v", mintproto.MaxRequestBytes) + `"}`, "", "limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := mintproto.Decode([]byte(tc.doc))
			var e *mintproto.Error
			if !errors.As(err, &e) || e.Code != mintproto.CodeInvalidRequest || e.Field != tc.wantField || !strings.Contains(e.Message, tc.wantMessage) {
				t.Fatalf("Decode: %v, want an invalid_request naming %q and saying %q", err, tc.wantField, tc.wantMessage)
			}
			if strings.Contains(err.Error(), secret) {
				t.Errorf("the error quotes the value: %v", err)
			}
		})
	}
	r, err := mintproto.Decode([]byte(`{"leaseId":"lease-1","key":"ANTHROPIC_API_KEY","value":"` + secret + `","peerIp":"::ffff:10.0.0.1"}`))
	if err != nil || r.Validate() != nil || r.Peer().String() != "10.0.0.1" {
		t.Fatalf("a good request: %+v, %v", r, err)
	}
	if strings.Contains(r.String(), secret) || strings.Contains((&r).String(), secret) {
		t.Errorf("a request prints its value: %s", r)
	}
	for field, bad := range map[string]mintproto.MintRequest{
		"leaseId": {LeaseID: "a*b", Key: "K", Value: "v"},
		"key":     {LeaseID: "l", Value: "v"},
		"value":   {LeaseID: "l", Key: "K"},
		"peerIp":  {LeaseID: "l", Key: "K", Value: "v", PeerIP: "pod-7"},
	} {
		var e *mintproto.Error
		if err := bad.Validate(); !errors.As(err, &e) || e.Field != field {
			t.Errorf("Validate: %v, want an error naming %s", err, field)
		}
	}
}
