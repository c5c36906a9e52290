package meter_test

import (
	"bytes"
	encjson "encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/kubeclip/kubeclip/pkg/broker/meter"
)

func TestIncludeUsage(t *testing.T) {
	tests := []struct {
		name        string
		body        string
		want        string // "" = the body itself, unchanged
		wantChanged bool
		wantErr     bool // a *RequestError on wantField
		wantField   string
	}{
		{name: "not streaming", body: `{"model":"gpt-4o","messages":[]}`},
		{name: "stream false", body: `{"model":"gpt-4o","stream":false}`},
		{name: "stream null", body: `{"model":"gpt-4o","stream":null}`},
		{name: "already included", body: `{"stream":true,"stream_options":{"include_usage":true}}`},
		{name: "already included, spaced", body: `{"stream" : true , "stream_options" : { "include_usage" : true } }`},
		{
			name:        "added after the last member, every other byte kept",
			body:        "{\n  \"model\": \"gpt-4o\",\n  \"messages\": [{\"role\": \"user\", \"content\": \"hi \\u00e9\"}],\n  \"stream\": true,\n  \"temperature\": 1.0e0\n}\n",
			want:        "{\n  \"model\": \"gpt-4o\",\n  \"messages\": [{\"role\": \"user\", \"content\": \"hi \\u00e9\"}],\n  \"stream\": true,\n  \"temperature\": 1.0e0,\"stream_options\":{\"include_usage\":true}\n}\n",
			wantChanged: true,
		},
		{
			name:        "stream_options null",
			body:        `{"stream":true,"stream_options":null,"n":1}`,
			want:        `{"stream":true,"stream_options":{"include_usage":true},"n":1}`,
			wantChanged: true,
		},
		{
			name:        "stream_options empty",
			body:        `{"stream":true,"stream_options":{ }}`,
			want:        `{"stream":true,"stream_options":{"include_usage":true }}`,
			wantChanged: true,
		},
		{
			name:        "stream_options with another option",
			body:        `{"stream_options":{"include_obfuscation":false},"stream":true}`,
			want:        `{"stream_options":{"include_obfuscation":false,"include_usage":true},"stream":true}`,
			wantChanged: true,
		},
		{
			name:        "include_usage false",
			body:        `{"stream":true,"stream_options":{"include_usage":false,"x":1}}`,
			want:        `{"stream":true,"stream_options":{"include_usage":true,"x":1}}`,
			wantChanged: true,
		},
		{
			name:        "include_usage a string",
			body:        `{"stream":true,"stream_options":{"include_usage":"yes"}}`,
			want:        `{"stream":true,"stream_options":{"include_usage":true}}`,
			wantChanged: true,
		},
		{
			name:        "escaped keys are the keys they spell",
			body:        `{"str\u0065am":true,"stream_\u006fptions":{"include_usag\u0065":null}}`,
			want:        `{"str\u0065am":true,"stream_\u006fptions":{"include_usag\u0065":true}}`,
			wantChanged: true,
		},
		{name: "stream twice", body: `{"stream":false,"stream":true}`, wantErr: true, wantField: "stream"},
		{name: "stream_options twice", body: `{"stream":true,"stream_options":{},"stream_options":{}}`, wantErr: true, wantField: "stream_options"},
		{name: "include_usage twice", body: `{"stream":true,"stream_options":{"include_usage":true,"include_usage":false}}`, wantErr: true, wantField: "stream_options.include_usage"},
		{name: "stream a string", body: `{"stream":"true"}`, wantErr: true, wantField: "stream"},
		{name: "stream a number", body: `{"stream":1}`, wantErr: true, wantField: "stream"},
		{name: "stream_options an array", body: `{"stream":true,"stream_options":[]}`, wantErr: true, wantField: "stream_options"},
		{name: "an array body", body: `[{"stream":true}]`, wantErr: true, wantField: ""},
		{name: "invalid JSON", body: `{"stream":true,}`, wantErr: true, wantField: ""},
		{name: "two objects", body: `{"stream":true}{"stream":false}`, wantErr: true, wantField: ""},
		{name: "empty", body: ``, wantErr: true, wantField: ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			body := []byte(tc.body)
			got, changed, err := meter.IncludeUsage(body)
			if tc.wantErr {
				var re *meter.RequestError
				if !errors.As(err, &re) || re.Field != tc.wantField {
					t.Fatalf("IncludeUsage = %v, want a *RequestError on %q", err, tc.wantField)
				}
				if strings.Contains(re.Error(), "true") {
					t.Errorf("the error %q quotes the body", re.Error())
				}
				return
			}
			if err != nil {
				t.Fatalf("IncludeUsage: %v", err)
			}
			if changed != tc.wantChanged {
				t.Errorf("changed = %v, want %v", changed, tc.wantChanged)
			}
			want := tc.want
			if want == "" {
				want = tc.body
			}
			if string(got) != want {
				t.Errorf("body =\n%s\nwant\n%s", got, want)
			}
			if string(body) != tc.body {
				t.Errorf("IncludeUsage modified its argument")
			}
			if changed {
				checkIncludesUsage(t, body, got)
			}
		})
	}
	t.Run("too large", func(t *testing.T) {
		big := append([]byte(`{"stream":true,"x":"`), bytes.Repeat([]byte("a"), meter.MaxRequestBytes)...)
		big = append(big, `"}`...)
		if _, _, err := meter.IncludeUsage(big); !errors.Is(err, meter.ErrRequestTooLarge) {
			t.Errorf("IncludeUsage = %v, want ErrRequestTooLarge", err)
		}
	})
}

// checkIncludesUsage asserts that out is in with stream_options.include_usage true: every
// other top-level member and option is byte-for-byte the same value, and rewriting out again
// changes nothing.
func checkIncludesUsage(t testing.TB, in, out []byte) {
	t.Helper()
	var a, b map[string]encjson.RawMessage
	if err := encjson.Unmarshal(in, &a); err != nil {
		t.Fatalf("input: %v", err)
	}
	if err := encjson.Unmarshal(out, &b); err != nil {
		t.Fatalf("the rewritten body is not JSON: %v", err)
	}
	var oa, ob map[string]encjson.RawMessage
	_ = encjson.Unmarshal(a["stream_options"], &oa)
	if err := encjson.Unmarshal(b["stream_options"], &ob); err != nil {
		t.Fatalf("stream_options: %v", err)
	}
	if string(ob["include_usage"]) != "true" {
		t.Fatalf("include_usage = %s", ob["include_usage"])
	}
	delete(a, "stream_options")
	delete(b, "stream_options")
	delete(oa, "include_usage")
	delete(ob, "include_usage")
	for _, pair := range [][2]map[string]encjson.RawMessage{{a, b}, {oa, ob}} {
		if len(pair[0]) != len(pair[1]) {
			t.Fatalf("members %d, want %d", len(pair[1]), len(pair[0]))
		}
		for k, v := range pair[0] {
			if !bytes.Equal(v, pair[1][k]) {
				t.Fatalf("member %q changed", k)
			}
		}
	}
	again, changed, err := meter.IncludeUsage(out)
	if err != nil || changed || !bytes.Equal(again, out) {
		t.Fatalf("rewriting the rewritten body: changed=%v err=%v", changed, err)
	}
}
