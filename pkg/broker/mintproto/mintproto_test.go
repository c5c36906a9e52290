package mintproto_test

import (
	"encoding/base64"
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
	sealed := `"ephemeralKey":"` + b64(32) + `","nonce":"` + b64(12) + `","ciphertext":"` + b64(40) + `"`
	for _, tc := range []struct {
		name, doc, wantField, wantMessage string
	}{
		{"not JSON", `{"ciphertext":"` + secret, "", "not a valid JSON object"},
		{"not an object", `["` + secret + `"]`, "", "not a JSON object"},
		{"two values", `{"leaseId":"l","key":"K",` + sealed + `} {}`, "", "not a valid JSON object"},
		{"key twice", `{"leaseId":"l","key":"K",` + sealed + `,"ciphertext":"` + secret + `"}`, "ciphertext", ""},
		{"another case", `{"leaseId":"l","Key":"K",` + sealed + `}`, "Key", ""},
		{"unknown field", `{"leaseId":"l","key":"K",` + sealed + `,"extra":"` + secret + `"}`, "extra", "not a field"},
		{"the value in clear", `{"leaseId":"l","key":"K","value":"` + secret + `"}`, "value", "never sent in clear"},
		{"wrong type", `{"leaseId":"l","key":"K","ciphertext":["` + secret + `"]}`, "ciphertext", "must be a string"},
		{"too large", `{"ciphertext":"` + strings.Repeat("v", mintproto.MaxRequestBytes) + `"}`, "", "limit"},
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
	r, err := mintproto.Decode([]byte(`{"leaseId":"lease-1","key":"ANTHROPIC_API_KEY",` + sealed + `,"peerIp":"::ffff:10.0.0.1"}`))
	if err != nil || r.Validate() != nil || r.Peer().String() != "10.0.0.1" {
		t.Fatalf("a good request: %+v, %v", r, err)
	}
	if strings.Contains(r.String(), r.Ciphertext) {
		t.Errorf("a request prints its sealed value: %s", r)
	}
	good := mintproto.MintRequest{LeaseID: "l", Key: "K", EphemeralKey: b64(32), Nonce: b64(12), Ciphertext: b64(40)}
	with := func(f func(*mintproto.MintRequest)) mintproto.MintRequest { r := good; f(&r); return r }
	for field, bad := range map[string]mintproto.MintRequest{
		"leaseId":      with(func(r *mintproto.MintRequest) { r.LeaseID = "a*b" }),
		"key":          with(func(r *mintproto.MintRequest) { r.Key = "" }),
		"ephemeralKey": with(func(r *mintproto.MintRequest) { r.EphemeralKey = b64(31) }),
		"nonce":        with(func(r *mintproto.MintRequest) { r.Nonce = "not base64!" }),
		"ciphertext":   with(func(r *mintproto.MintRequest) { r.Ciphertext = b64(16) }), // a tag and no value
		"peerIp":       with(func(r *mintproto.MintRequest) { r.PeerIP = "pod-7" }),
	} {
		var e *mintproto.Error
		if err := bad.Validate(); !errors.As(err, &e) || e.Field != field {
			t.Errorf("Validate: %v, want an error naming %s", err, field)
		}
	}
}

// b64 is the base64 of n bytes.
func b64(n int) string { return base64.StdEncoding.EncodeToString(make([]byte, n)) }
