package policy_test

import (
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/oklog/ulid/v2"

	"github.com/kubeclip/kubeclip/pkg/policy"
)

func TestCompanySlug(t *testing.T) {
	// Expected hashes are sha256 of the raw input, computed outside Go (sha256sum):
	//   printf %s "$input" | sha256sum | cut -c1-8
	tests := []struct {
		input, want string
	}{
		{"3f2b6c1e-7a4d-4e5f-9a8b-0c1d2e3f4a5b", "3f2b6c1e-7a4d-4e5f-9a8b-0c1d2e3f4a5b"}, // full UUIDs stay untruncated
		{"Acme Corp", "acme-corp-a73cb456"},                                              // folded: the hash keeps it apart from "acme-corp"
		{"Foo_Bar.Baz", "foo-bar-baz-2e41f623"},
		{"  --Acme!!--  ", "acme-f340644b"},
		{"a---b", "a---b"}, // '-' runs inside are kept; an id that is its own slug stays as it is
		{"acme", "acme"},
		{"ACME", "acme-a8308e8e"},
		{"acme_corp", "acme-corp-cca8c794"},
		{"acme-corp", "acme-corp"},
		{"---", "company-cb3f91d5"},
		{"", "company-e3b0c442"},
		{"日本", "company-cf2abf0c"},
		{"Ünïcode Co", "n-code-co-0c9c8bf0"},
		{"İstanbul", "i-stanbul-24ec8f72"}, // JavaScript lower-cases İ to "i̇"
		{strings.Repeat("a", 53), strings.Repeat("a", 53)},
		{strings.Repeat("a", 54), strings.Repeat("a", 44) + "-a3f01b69"},
		{strings.Repeat("a", 60), strings.Repeat("a", 44) + "-11ee3912"},
		{"Acme Corporation International Holdings Limited Partnership of America Inc", "acme-corporation-international-holdings-limi-42e35a7c"},
		// The 44-character head ends in '-', which is trimmed before the hash.
		{strings.Repeat("abcdefghij", 4) + "abc--x-x-x-x-x-x-x-x-x-x", strings.Repeat("abcdefghij", 4) + "abc-aa3e4cf3"},
	}
	for _, tc := range tests {
		t.Run(tc.input, func(t *testing.T) {
			got := policy.CompanySlug(tc.input)
			if got != tc.want {
				t.Errorf("CompanySlug(%q) = %q, want %q", tc.input, got, tc.want)
			}
			if len(got) > 53 {
				t.Errorf("slug %q is longer than 53", got)
			}
		})
	}
}

// TestCompanySlugsAreDistinct is issue 8.13: distinct company ids that fold to one slug
// ("ACME" and "acme", "acme_corp" and "acme-corp") got one namespace.
func TestCompanySlugsAreDistinct(t *testing.T) {
	ids := []string{"acme", "ACME", "Acme", "acme_corp", "acme-corp", "acme.corp", "ACME_CORP", "---", "", "日本", "中国"}
	seen := map[string]string{}
	for _, id := range ids {
		slug := policy.CompanySlug(id)
		if other, dup := seen[slug]; dup {
			t.Errorf("CompanySlug(%q) = CompanySlug(%q) = %q", id, other, slug)
		}
		seen[slug] = id
	}
}

func TestTenantNamespace(t *testing.T) {
	withSlug := policy.DefaultConfig()
	withSlug.CompanySlug = "acme"
	longPrefix := policy.DefaultConfig()
	longPrefix.NamespacePrefix = "a-very-long-tenant-prefix-x-"
	digitsOnly := policy.DefaultConfig()
	digitsOnly.NamespacePrefix = "p"
	tests := []struct {
		name      string
		cfg       policy.Config
		companyID string
		want      string
		wantErr   []policy.FieldError
	}{
		{name: "default", cfg: policy.DefaultConfig(), companyID: "3f2b6c1e-7a4d-4e5f-9a8b-0c1d2e3f4a5b", want: "paperclip-3f2b6c1e-7a4d-4e5f-9a8b-0c1d2e3f4a5b"},
		{name: "configured slug", cfg: withSlug, companyID: "3f2b6c1e-7a4d-4e5f-9a8b-0c1d2e3f4a5b", want: "paperclip-acme"},
		{name: "derived slug", cfg: policy.DefaultConfig(), companyID: "Acme_Corp", want: "paperclip-acme-corp-e45676e9"},
		{name: "exactly 63", cfg: longPrefix, companyID: strings.Repeat("c", 35), want: "a-very-long-tenant-prefix-x-" + strings.Repeat("c", 35)},
		{name: "over 63", cfg: longPrefix, companyID: strings.Repeat("c", 36), wantErr: []policy.FieldError{{"namespacePrefix",
			`tenant namespace "a-very-long-tenant-prefix-x-cccccccccccccccccccccccccccccccccccc" (namespacePrefix + company slug) is 64 characters; the limit is 63`}}},
		{name: "empty company id", cfg: policy.DefaultConfig(), companyID: "", wantErr: []policy.FieldError{{"companyId", "required"}}},
		{name: "company id not a label value", cfg: policy.DefaultConfig(), companyID: "acme corp", wantErr: []policy.FieldError{{"companyId", msgLabelValue}}},
		{name: "short prefix", cfg: digitsOnly, companyID: "7", want: "p7"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := policy.TenantNamespace(tc.cfg, tc.companyID)
			if tc.wantErr != nil {
				var verr *policy.ValidationError
				if !errors.As(err, &verr) {
					t.Fatalf("error = %v, want *ValidationError", err)
				}
				if diff := cmp.Diff(tc.wantErr, verr.Errors); diff != "" {
					t.Errorf("(-want +got):\n%s", diff)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("TenantNamespace = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestWorkloadName(t *testing.T) {
	id := ulid.MustParse("01J9ZXKQ3V4W5X6Y7Z8A9B0C1D")
	if got, want := policy.WorkloadName(id), "pc-01j9zxkq3v4w5x6y7z8a9b0c1d"; got != want {
		t.Errorf("WorkloadName = %q, want %q", got, want)
	}
	// Any ULID gives "pc-" + 26 characters of the lower-case Crockford alphabet.
	re := regexp.MustCompile(`^pc-[0-9abcdefghjkmnpqrstvwxyz]{26}$`)
	for i := range 100 {
		id := ulid.MustNew(ulid.Timestamp(time.UnixMilli(int64(i)*1e9)), ulid.DefaultEntropy())
		if name := policy.WorkloadName(id); !re.MatchString(name) {
			t.Fatalf("WorkloadName(%s) = %q", id, name)
		}
	}
	if got := policy.SecretName("pc-01j9zxkq3v4w5x6y7z8a9b0c1d"); got != "pc-01j9zxkq3v4w5x6y7z8a9b0c1d-env" {
		t.Errorf("SecretName = %q", got)
	}
}

func TestScopedEgressPolicyName(t *testing.T) {
	long := strings.Repeat("h", 200) + strings.Repeat("t", 100)
	tests := []struct {
		workload, want string
	}{
		{"pc-01j9zxkq3v4w5x6y7z8a9b0c1d", "pc-01j9zxkq3v4w5x6y7z8a9b0c1d-egress"},
		{strings.Repeat("w", 246), strings.Repeat("w", 246) + "-egress"},
		// head (246-26 = 220 chars) + "-" + last 25 chars + "-egress" = 253.
		{long, strings.Repeat("h", 200) + strings.Repeat("t", 20) + "-" + strings.Repeat("t", 25) + "-egress"},
	}
	for _, tc := range tests {
		got := policy.ScopedEgressPolicyName(tc.workload)
		if got != tc.want || len(got) > 253 {
			t.Errorf("ScopedEgressPolicyName(len %d) = %q (len %d), want %q", len(tc.workload), got, len(got), tc.want)
		}
	}
}

func TestRunLabels(t *testing.T) {
	got := policy.RunLabels("run-1", "agent-1", "company-1", "claude_local")
	want := map[string]string{
		"paperclip.io/run-id":     "run-1",
		"paperclip.io/agent-id":   "agent-1", // the agent, not the run (fixes the TS stand-in)
		"paperclip.io/company-id": "company-1",
		"paperclip.io/adapter":    "claude_local",
		"paperclip.io/managed-by": "kubeclip",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	noAgent := policy.RunLabels("run-1", "", "company-1", "claude_local")
	if _, ok := noAgent["paperclip.io/agent-id"]; ok {
		t.Errorf("empty agent id produced a label")
	}
}

func TestRunSpecValidate(t *testing.T) {
	good := testRunSpec(policy.DefaultConfig())
	tests := []struct {
		name   string
		mutate func(*policy.RunSpec)
		want   []policy.FieldError
	}{
		{name: "valid", mutate: func(*policy.RunSpec) {}},
		{name: "no agent id is fine", mutate: func(s *policy.RunSpec) { s.AgentID = "" }},
		{name: "run id missing", mutate: func(s *policy.RunSpec) { s.RunID = "" }, want: []policy.FieldError{{"runId", "required"}}},
		{name: "run id too long", mutate: func(s *policy.RunSpec) { s.RunID = strings.Repeat("r", 64) }, want: []policy.FieldError{{"runId", msgLabelValue}}},
		{name: "agent id bad", mutate: func(s *policy.RunSpec) { s.AgentID = "agent/1" }, want: []policy.FieldError{{"agentId", msgLabelValue}}},
		{name: "company id bad", mutate: func(s *policy.RunSpec) { s.CompanyID = "-acme" }, want: []policy.FieldError{{"companyId", msgLabelValue}}},
		{name: "adapter missing", mutate: func(s *policy.RunSpec) { s.AdapterType = "" }, want: []policy.FieldError{{"adapterType", "required"}}},
		{name: "namespace bad", mutate: func(s *policy.RunSpec) { s.Namespace = "Tenant" }, want: []policy.FieldError{{"namespace", msgDNSLabel}}},
		{name: "workload bad", mutate: func(s *policy.RunSpec) { s.WorkloadName = "pc.x" }, want: []policy.FieldError{{"workloadName", msgDNSLabel}}},
		{name: "image missing", mutate: func(s *policy.RunSpec) { s.Image = "" }, want: []policy.FieldError{{"image", "required"}}},
		{name: "image whitespace", mutate: func(s *policy.RunSpec) { s.Image = "x :1" }, want: []policy.FieldError{{"image", msgImageRef}}},
		{name: "pull policy", mutate: func(s *policy.RunSpec) { s.ImagePullPolicy = "Sometimes" }, want: []policy.FieldError{{"imagePullPolicy", `must be one of Always, IfNotPresent, Never, got "Sometimes"`}}},
		{name: "deadline", mutate: func(s *policy.RunSpec) { zero := int64(0); s.ActiveDeadlineSeconds = &zero }, want: []policy.FieldError{{"activeDeadlineSeconds", "must be > 0"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := good
			tc.mutate(&s)
			err := s.Validate()
			if tc.want == nil {
				if err != nil {
					t.Fatalf("Validate = %v", err)
				}
				return
			}
			var verr *policy.ValidationError
			if !errors.As(err, &verr) {
				t.Fatalf("Validate = %v, want *ValidationError", err)
			}
			if diff := cmp.Diff(tc.want, verr.Errors); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
