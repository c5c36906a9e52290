package execproto_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kubeclip/kubeclip/pkg/execproto"
	"github.com/kubeclip/kubeclip/pkg/execspec"
)

const schemaDir = "../../docs/schemas"

// schemaCase ties a schema to the Go type of its messages: a value with every field set, and
// the zero value (whose JSON keys are the required ones).
type schemaCase struct {
	full, zero any
}

func ptr[T any](v T) *T { return &v }

func schemaCases() map[string]schemaCase {
	return map[string]schemaCase{
		"exec-start": {full: execproto.StartRequest{
			ExecID: "x", ProviderLeaseID: "pc-1", Command: "sh", Args: []string{"-c"}, Cwd: "/w", Env: map[string]string{"A": "1"},
			TimeoutMs: 1, StdinBytes: 1, Record: true, MaxOutputBytes: 1, TTY: &execspec.TTY{Rows: 24, Cols: 80},
		}, zero: execproto.StartRequest{}},
		"exec-attach":       {full: execproto.AttachRequest{ExecID: "x", ProviderLeaseID: "pc-1", FromSeq: 1}, zero: execproto.AttachRequest{}},
		"exec-signal":       {full: execproto.SignalRequest{ExecID: "x", ProviderLeaseID: "pc-1", Signal: "SIGTERM"}, zero: execproto.SignalRequest{}},
		"exec-started":      {full: execproto.Started{ExecID: "x", Replica: "r", IOSubject: "s", StdinOffset: 1, StdinClosed: true}, zero: execproto.Started{}},
		"exec-exit":         {full: execspec.Exit{ExitCode: ptr(1), Signal: ptr("SIGKILL"), TimedOut: true, StdoutBytes: 1, StderrBytes: 1, Truncated: true, LastSeq: 1, Error: "e"}, zero: execspec.Exit{}},
		"exec-error":        {full: execproto.Error{Code: execproto.CodeUnavailable, Message: "m", Field: "f"}, zero: execproto.Error{}},
		"exec-signaled":     {full: execproto.Signaled{ExecID: "x", Delivered: true, Code: "exited", Message: "m"}, zero: execproto.Signaled{}},
		"exec-notice":       {full: execproto.Notice{ExecID: "x", Reason: execproto.NoticeRecordingStopped, Message: "m"}, zero: execproto.Notice{}},
		"exec-stdin-reply":  {full: execproto.StdinReply{Offset: 1, Closed: true}, zero: execproto.StdinReply{}},
		"exec-resize-reply": {full: execproto.ResizeReply{Resized: true, Code: "exited", Message: "m"}, zero: execproto.ResizeReply{}},
	}
}

func loadSchema(t *testing.T, name string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(schemaDir, name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var s map[string]any
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatalf("%s is not JSON: %v", name, err)
	}
	return s
}

func sortedKeys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func jsonKeys(t *testing.T, v any) []string {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	return sortedKeys(m)
}

func required(s map[string]any) []string {
	var out []string
	for _, r := range s["required"].([]any) {
		out = append(out, r.(string))
	}
	slices.Sort(out)
	return out
}

func TestSchemasMatchTypes(t *testing.T) {
	for name, tc := range schemaCases() {
		t.Run(name, func(t *testing.T) {
			s := loadSchema(t, name)
			if s["$schema"] != "https://json-schema.org/draft/2020-12/schema" || s["additionalProperties"] != false {
				t.Errorf("want draft 2020-12 and additionalProperties false (requests are decoded strictly)")
			}
			v := reflect.ValueOf(tc.full)
			for i := range v.NumField() {
				if v.Field(i).IsZero() {
					t.Errorf("test value leaves %s unset", v.Type().Field(i).Name)
				}
			}
			props, _ := s["properties"].(map[string]any)
			if diff := cmp.Diff(sortedKeys(props), jsonKeys(t, tc.full)); diff != "" {
				t.Errorf("schema properties vs Go fields (-schema +go):\n%s", diff)
			}
			if diff := cmp.Diff(required(s), jsonKeys(t, tc.zero)); diff != "" {
				t.Errorf("schema required vs fields always present (-schema +go):\n%s", diff)
			}
		})
	}
	files, _ := filepath.Glob(filepath.Join(schemaDir, "exec-*.json"))
	cases := schemaCases()
	for _, f := range files {
		name := filepath.Base(f)
		if _, ok := cases[name[:len(name)-len(".json")]]; !ok {
			t.Errorf("%s has no schemaCase", f)
		}
	}
}

// TestErrorCodesAreTheSchemas: the schema lists exactly the codes of the table.
func TestErrorCodesAreTheSchemas(t *testing.T) {
	s := loadSchema(t, "exec-error")
	var inSchema []string
	for _, c := range s["properties"].(map[string]any)["code"].(map[string]any)["enum"].([]any) {
		inSchema = append(inSchema, c.(string))
	}
	var inGo []string
	for _, c := range execproto.Codes() {
		inGo = append(inGo, string(c))
	}
	slices.Sort(inSchema)
	slices.Sort(inGo)
	if diff := cmp.Diff(inSchema, inGo); diff != "" {
		t.Errorf("codes (-schema +go):\n%s", diff)
	}
}

var exampleRE = regexp.MustCompile("(?s)<!-- example: ([a-z-]+) -->\n```json\n(.*?)\n```")

// TestDocExamples decodes every example of docs/exec.md into its Go type, strictly, and checks
// its fields against the schema; every schema has an example.
func TestDocExamples(t *testing.T) {
	data, err := os.ReadFile("../../docs/exec.md")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, m := range exampleRE.FindAllStringSubmatch(string(data), -1) {
		name, body := m[1], []byte(m[2])
		seen[name] = true
		t.Run(name, func(t *testing.T) {
			tc, ok := schemaCases()[name]
			if !ok {
				t.Fatalf("no schema %s", name)
			}
			s := loadSchema(t, name)
			props, _ := s["properties"].(map[string]any)
			keys := jsonKeys(t, json.RawMessage(body))
			for _, k := range keys {
				if _, ok := props[k]; !ok {
					t.Errorf("example field %q is not in the schema", k)
				}
			}
			for _, r := range required(s) {
				if !slices.Contains(keys, r) {
					t.Errorf("example lacks required field %q", r)
				}
			}
			v := reflect.New(reflect.TypeOf(tc.zero)).Interface()
			if err := execproto.Decode(body, v); err != nil {
				t.Fatalf("example does not decode strictly: %v", err)
			}
			if val, ok := v.(interface{ Validate() error }); ok {
				if err := val.Validate(); err != nil {
					t.Errorf("example does not validate: %v", err)
				}
			}
		})
	}
	for name := range schemaCases() {
		if !seen[name] {
			t.Errorf("docs/exec.md has no example for %s", name)
		}
	}
}
