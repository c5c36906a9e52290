package events_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kubeclip/kubeclip/pkg/events"
)

const schemaDir = "../../docs/schemas"

// schemaCase ties one object schema (a file, and a path of property names inside it) to the Go
// type that produces it: a value with every field set and the zero value.
type schemaCase struct {
	file string
	path []string
	full any
	zero any
}

func fullAcquire() events.AcquireRequest {
	return events.AcquireRequest{
		RunID: "r1", CompanyID: "c1", EnvironmentID: "e1", AgentID: "a1", IssueID: "i1",
		AdapterType: "claude_local", ExecutionWorkspaceSettings: json.RawMessage(`{"mode":"isolated"}`),
		RequestedExpiresAt: "2026-08-24T12:00:00Z", Config: json.RawMessage(`{"inCluster":true}`),
		ReuseLease: true,
	}
}

func schemaCases() []schemaCase {
	at := time.Date(2026, 8, 24, 10, 0, 0, 0, time.UTC)
	usage := events.AgentUsage{InputTokens: 1, OutputTokens: 2, CachedInputTokens: 3}
	agent := events.AgentResult{SessionID: "s", Model: "m", Usage: &usage, CostUSD: ptr(0.5), Summary: "done", IsError: true, ErrorCode: "claude_refusal"}
	line := events.LogLine{TS: ts, Text: "x", Partial: true}
	exit := events.ExecExit{ExitCode: ptr(0), Signal: ptr("SIGKILL"), TimedOut: true, Truncated: true}
	row := events.ModelUsage{Key: "ANTHROPIC_API_KEY", Host: "api.anthropic.com", Format: events.UsageFormatAnthropicMessages, Calls: 2, InputTokens: 1, OutputTokens: 2, CacheReadTokens: 3, CacheWriteTokens: 4, Unmetered: map[string]int64{"failed": 1}}
	return []schemaCase{
		{file: "lease-acquire.json", full: fullAcquire(), zero: events.AcquireRequest{}},
		{file: "lease-release.json", full: events.ReleaseRequest{RunID: "r1", CompanyID: "c1", ProviderLeaseID: "pc-1", CancelActiveWork: true, ReleaseID: "x1", Destroy: true}, zero: events.ReleaseRequest{}},
		{file: "lease-resume.json", full: events.ResumeRequest{RunID: "r1", CompanyID: "c1", ProviderLeaseID: "pc-1", ResumeID: "x1"}, zero: events.ResumeRequest{}},
		{file: "kubeclip-dispatch.json", full: events.DispatchRequest{AcquireRequest: fullAcquire(), Namespace: "paperclip-c1", Plan: json.RawMessage(`{"namespace":"paperclip-c1"}`)}, zero: events.DispatchRequest{}},
		{file: "run-created.json", full: events.RunCreatedEvent{RunID: "r1", CompanyID: "c1", At: at, ProviderLeaseID: "pc-1", Namespace: "n", WorkloadName: "pc-1", SecretName: "pc-1-env", Backend: "job", PodName: "p", Phase: events.PhaseRunning, ExpiresAt: &at, Warm: true}, zero: events.RunCreatedEvent{}},
		{file: "run-status.json", full: events.RunStatusEvent{RunID: "r1", CompanyID: "c1", At: at, Phase: events.PhasePending, Reason: "Unschedulable", Message: "0/1 nodes", PodName: "p", PodIP: "10.244.0.17"}, zero: events.RunStatusEvent{}},
		{file: "run-log.json", full: events.RunLogEvent{RunID: "r1", CompanyID: "c1", At: at, Seq: 1, Pod: "p", Container: "c", Lines: []events.LogLine{line}, LogStopped: events.BudgetRun}, zero: events.RunLogEvent{}},
		{file: "run-log.json", path: []string{"lines", "items"}, full: line, zero: events.LogLine{}},
		{file: "run-result.json", full: events.RunResultEvent{RunID: "r1", CompanyID: "c1", At: at, Outcome: events.OutcomeFailed, ExitCode: ptr(1), Reason: "OOMKilled", Message: "m", Agent: &agent}, zero: events.RunResultEvent{}},
		{file: "run-result.json", path: []string{"agent"}, full: agent, zero: events.AgentResult{}},
		{file: "run-result.json", path: []string{"agent", "usage"}, full: usage, zero: events.AgentUsage{}},
		{file: "run-released.json", full: events.RunReleasedEvent{RunID: "r1", CompanyID: "c1", At: at, ProviderLeaseID: "pc-1", State: events.ReleaseStopped, ReleaseID: "x1", Unknown: true}, zero: events.RunReleasedEvent{}},
		{file: "run-failed.json", full: events.RunFailedEvent{RunID: "r1", CompanyID: "c1", At: at, Code: events.CodeInternal, Message: "m", Field: "f", Request: events.LeaseRelease, RequestID: "x1"}, zero: events.RunFailedEvent{}},
		{file: "run-exec.json", full: events.RunExecEvent{RunID: "r1", CompanyID: "c1", At: at, ExecID: "01K3", Seq: 2, Command: "claude", Stream: events.ExecStdout, Text: "x", Exit: &exit, RecordingStopped: events.BudgetRun, Agent: &agent}, zero: events.RunExecEvent{}},
		{file: "run-exec.json", path: []string{"exit"}, full: exit, zero: events.ExecExit{}},
		{file: "run-exec.json", path: []string{"agent"}, full: agent, zero: events.AgentResult{}},
		{file: "run-exec.json", path: []string{"agent", "usage"}, full: usage, zero: events.AgentUsage{}},
		{file: "run-suspended.json", full: events.RunSuspendedEvent{RunID: "r1", CompanyID: "c1", At: at, ProviderLeaseID: "pc-1", Generation: 1, VolumeClaim: "pc-1-home"}, zero: events.RunSuspendedEvent{}},
		{file: "run-usage.json", full: events.RunUsageEvent{RunID: "r1", CompanyID: "c1", At: at, Meter: "01K3M", Seq: 1, Usage: []events.ModelUsage{row}}, zero: events.RunUsageEvent{}},
		{file: "run-usage.json", path: []string{"usage", "items"}, full: row, zero: events.ModelUsage{}},
		{file: "run-resumed.json", full: events.RunResumedEvent{RunID: "r1", CompanyID: "c1", At: at, ProviderLeaseID: "pc-1", From: events.ResumedFromSuspended, Generation: 1, Resumes: 2, ResumeID: "x1", ExpiresAt: &at, PodIP: "10.244.0.23"}, zero: events.RunResumedEvent{}},
	}
}

func loadSchema(t *testing.T, file string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(schemaDir, file))
	if err != nil {
		t.Fatal(err)
	}
	var s map[string]any
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatalf("%s is not JSON: %v", file, err)
	}
	return s
}

// objectSchema follows path (property names, or "items") from the schema root.
func objectSchema(t *testing.T, root map[string]any, path []string) map[string]any {
	t.Helper()
	cur := root
	for _, p := range path {
		var next any
		if p == "items" {
			next = cur["items"]
		} else {
			props, _ := cur["properties"].(map[string]any)
			next = props[p]
		}
		m, ok := next.(map[string]any)
		if !ok {
			t.Fatalf("schema has no object at %v", path)
		}
		cur = m
	}
	return cur
}

func propertyNames(s map[string]any) []string {
	props, _ := s["properties"].(map[string]any)
	var out []string
	for k := range props {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func requiredNames(s map[string]any) []string {
	var out []string
	for _, r := range s["required"].([]any) {
		out = append(out, r.(string))
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
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// assertAllSet fails when a Go field of v is zero, so a field added to a payload type cannot
// slip past the schema comparison by being left out of the test value.
func assertAllSet(t *testing.T, v reflect.Value, path string) {
	t.Helper()
	for v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct {
		return
	}
	for i := range v.NumField() {
		f := v.Type().Field(i)
		if !f.IsExported() || f.Tag.Get("json") == "-" {
			continue
		}
		fv := v.Field(i)
		if fv.IsZero() {
			t.Errorf("test value leaves %s.%s unset", path, f.Name)
			continue
		}
		if f.Anonymous {
			assertAllSet(t, fv, path)
		}
	}
}

func TestSchemasMatchPayloadTypes(t *testing.T) {
	for _, tc := range schemaCases() {
		name := strings.Join(append([]string{tc.file}, tc.path...), "/")
		t.Run(name, func(t *testing.T) {
			root := loadSchema(t, tc.file)
			if root["$schema"] != "https://json-schema.org/draft/2020-12/schema" {
				t.Errorf("$schema = %v, want draft 2020-12", root["$schema"])
			}
			s := objectSchema(t, root, tc.path)
			assertAllSet(t, reflect.ValueOf(tc.full), reflect.TypeOf(tc.full).Name())
			if diff := cmp.Diff(propertyNames(s), jsonKeys(t, tc.full)); diff != "" {
				t.Errorf("schema properties vs Go fields (-schema +go):\n%s", diff)
			}
			if diff := cmp.Diff(requiredNames(s), jsonKeys(t, tc.zero)); diff != "" {
				t.Errorf("schema required vs fields always present (-schema +go):\n%s", diff)
			}
		})
	}
}

// eventSchemas lists the schemas of this package's payloads. The exec-*.json files in the same
// directory are the core NATS messages of the exec protocol, not events: pkg/execproto's schema
// test covers them.
func eventSchemas(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(schemaDir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	return slices.DeleteFunc(files, func(f string) bool { return strings.HasPrefix(filepath.Base(f), "exec-") })
}

func TestEverySchemaIsCovered(t *testing.T) {
	files := eventSchemas(t)
	covered := map[string]bool{}
	for _, tc := range schemaCases() {
		covered[tc.file] = true
	}
	for _, f := range files {
		if !covered[filepath.Base(f)] {
			t.Errorf("%s has no schemaCase", f)
		}
	}
	if len(files) != 14 {
		t.Errorf("found %d schemas, want 14", len(files))
	}
}

var exampleRE = regexp.MustCompile("(?s)<!-- example: ([a-z-]+) -->\n```json\n(.*?)\n```")

// TestDocExamples checks every example in docs/contract.md against its schema's property names
// and decodes it with the decoder a consumer would use.
func TestDocExamples(t *testing.T) {
	data, err := os.ReadFile("../../docs/contract.md")
	if err != nil {
		t.Fatal(err)
	}
	matches := exampleRE.FindAllStringSubmatch(string(data), -1)
	seen := map[string]bool{}
	var s events.Subjects
	for _, m := range matches {
		name, body := m[1], []byte(m[2])
		seen[name] = true
		t.Run(name, func(t *testing.T) {
			schema := loadSchema(t, name+".json")
			keys := jsonKeys(t, json.RawMessage(body))
			props := propertyNames(schema)
			for _, k := range keys {
				if !slices.Contains(props, k) {
					t.Errorf("example field %q is not in the schema", k)
				}
			}
			for _, r := range requiredNames(schema) {
				if !slices.Contains(keys, r) {
					t.Errorf("example lacks required field %q", r)
				}
			}
			var ids struct{ RunID, CompanyID string }
			if err := json.Unmarshal(body, &ids); err != nil {
				t.Fatal(err)
			}
			switch name {
			case "lease-acquire":
				subj, _ := s.Lease(ids.CompanyID, events.LeaseAcquire)
				_, err = s.DecodeAcquire(subj, body)
			case "lease-release":
				subj, _ := s.Lease(ids.CompanyID, events.LeaseDestroy)
				_, err = s.DecodeRelease(subj, body)
			case "lease-resume":
				subj, _ := s.Lease(ids.CompanyID, events.LeaseResume)
				_, err = s.DecodeResume(subj, body)
			case "kubeclip-dispatch":
				subj, _ := events.DispatchSubject(ids.CompanyID, ids.RunID)
				_, err = events.DecodeDispatch(subj, body)
			default:
				subj, _ := s.Run(ids.CompanyID, ids.RunID, events.RunKind(strings.TrimPrefix(name, "run-")))
				_, err = s.DecodeRunEvent(subj, body)
			}
			if err != nil {
				t.Errorf("example does not decode: %v", err)
			}
		})
	}
	for _, f := range eventSchemas(t) {
		if name := strings.TrimSuffix(filepath.Base(f), ".json"); !seen[name] {
			t.Errorf("docs/contract.md has no example for %s", name)
		}
	}
}

// TestOutcomeSchemaEnum: the result schema lists exactly the outcomes a result may carry, so a
// new outcome cannot reach consumers undocumented.
func TestOutcomeSchemaEnum(t *testing.T) {
	s := objectSchema(t, loadSchema(t, "run-result.json"), []string{"outcome"})
	var inSchema []events.Outcome
	for _, v := range s["enum"].([]any) {
		inSchema = append(inSchema, events.Outcome(v.(string)))
	}
	if diff := cmp.Diff(events.Outcomes(), inSchema); diff != "" {
		t.Errorf("outcomes (-Go +schema):\n%s", diff)
	}
}
