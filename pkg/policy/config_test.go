package policy_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/kubeclip/kubeclip/pkg/policy"
)

func TestParseConfigDefaults(t *testing.T) {
	want := policy.Config{
		NamespacePrefix:            "paperclip-",
		CompanySlug:                "",
		ImageRegistry:              "",
		ImageAllowList:             []string{},
		ImagePullSecrets:           []string{},
		EgressAllowFqdns:           []string{},
		EgressAllowCidrs:           []string{},
		EgressMode:                 policy.EgressStandard,
		DefaultResources:           nil,
		RuntimeClassName:           "",
		ServiceAccountAnnotations:  map[string]string{},
		JobTTLSecondsAfterFinished: 900,
		PodActivityDeadlineSec:     3600,
		AdapterType:                "claude_local",
		Adapters:                   nil,
		Backend:                    policy.BackendSandboxCR,
		PaperclipServerNamespace:   "paperclip",
		PaperclipServerPodLabels:   map[string]string{"app": "paperclip-server"},
	}
	for _, raw := range []string{`{}`, ``, "  \n", ` { } `} {
		got, err := policy.ParseConfig([]byte(raw))
		if err != nil {
			t.Fatalf("ParseConfig(%q): %v", raw, err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("ParseConfig(%q) defaults (-want +got):\n%s", raw, diff)
		}
	}
	if diff := cmp.Diff(want, policy.DefaultConfig()); diff != "" {
		t.Errorf("DefaultConfig (-want +got):\n%s", diff)
	}
	if err := policy.DefaultConfig().Validate(); err != nil {
		t.Errorf("DefaultConfig().Validate() = %v", err)
	}
	// Requirement: the default resources the Job gets.
	res := want.ContainerResources()
	if got := res.Limits.Cpu().String() + "/" + res.Limits.Memory().String() + " " + res.Requests.Cpu().String() + "/" + res.Requests.Memory().String(); got != "2/4Gi 250m/512Mi" {
		t.Errorf("default resources = %s", got)
	}
}

func TestParseConfigFull(t *testing.T) {
	raw := `{
	  "namespacePrefix": "pc-",
	  "companySlug": "acme",
	  "imageRegistry": "https://registry.example.com/mirror/",
	  "imageAllowList": ["ghcr.io/paperclipai/*"],
	  "imagePullSecrets": ["regcred"],
	  "egressAllowFqdns": ["github.com", "*.githubusercontent.com"],
	  "egressAllowCidrs": ["10.0.0.0/8", "0.0.0.0/0", "192.168.1.7/32"],
	  "egressMode": "cilium",
	  "defaultResources": {"requests": {"cpu": "500m"}, "limits": {"memory": "6Gi"}},
	  "runtimeClassName": "gvisor",
	  "serviceAccountAnnotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/x"},
	  "jobTtlSecondsAfterFinished": 0,
	  "podActivityDeadlineSec": 1e3,
	  "adapterType": "custom_local",
	  "adapters": [
	    {"adapterType": "custom_local", "runtimeImage": "ghcr.io/acme/custom:v2", "envKeys": ["CUSTOM_KEY"],
	     "allowFqdns": ["api.custom.example"], "probeCommand": ["custom", "--version"], "defaultEnv": {"MODE": "fast"}},
	    {"adapterType": "other", "enabled": false}
	  ],
	  "backend": "job",
	  "paperclipServerNamespace": "paperclip-system",
	  "paperclipServerPodLabels": {"app.kubernetes.io/name": "paperclip", "tier": "server"}
	}`
	want := policy.Config{
		NamespacePrefix:            "pc-",
		CompanySlug:                "acme",
		ImageRegistry:              "https://registry.example.com/mirror/",
		ImageAllowList:             []string{"ghcr.io/paperclipai/*"},
		ImagePullSecrets:           []string{"regcred"},
		EgressAllowFqdns:           []string{"github.com", "*.githubusercontent.com"},
		EgressAllowCidrs:           []string{"10.0.0.0/8", "0.0.0.0/0", "192.168.1.7/32"},
		EgressMode:                 policy.EgressCilium,
		DefaultResources:           &policy.ResourceOverrides{Requests: &policy.ResourceList{CPU: "500m"}, Limits: &policy.ResourceList{Memory: "6Gi"}},
		RuntimeClassName:           "gvisor",
		ServiceAccountAnnotations:  map[string]string{"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/x"},
		JobTTLSecondsAfterFinished: 0,
		PodActivityDeadlineSec:     1000,
		AdapterType:                "custom_local",
		Adapters: []policy.AdapterEntry{
			{AdapterType: "custom_local", Enabled: true, RuntimeImage: "ghcr.io/acme/custom:v2", EnvKeys: []string{"CUSTOM_KEY"},
				AllowFqdns: []string{"api.custom.example"}, ProbeCommand: []string{"custom", "--version"}, DefaultEnv: map[string]string{"MODE": "fast"}},
			{AdapterType: "other", Enabled: false},
		},
		Backend:                  policy.BackendJob,
		PaperclipServerNamespace: "paperclip-system",
		PaperclipServerPodLabels: map[string]string{"app.kubernetes.io/name": "paperclip", "tier": "server"},
	}
	got, err := policy.ParseConfig([]byte(raw))
	if err != nil {
		t.Fatalf("ParseConfig: %v", err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}

	// The JSON form is the normalized config: it parses back to the same Config.
	data, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	again, err := policy.ParseConfig(data)
	if err != nil {
		t.Fatalf("re-parsing the normalized config: %v", err)
	}
	if diff := cmp.Diff(got, again, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}

	// Field-by-field resource override (the TS builder replaced requests/limits wholesale).
	res := got.ContainerResources()
	if g := res.Requests.Cpu().String() + "/" + res.Requests.Memory().String() + " " + res.Limits.Cpu().String() + "/" + res.Limits.Memory().String(); g != "500m/512Mi 2/6Gi" {
		t.Errorf("resources = %s, want 500m/512Mi 2/6Gi", g)
	}
}

func TestParseConfigIntegers(t *testing.T) {
	tests := []struct {
		raw     string
		wantTTL int32
	}{
		{raw: `{"jobTtlSecondsAfterFinished": 2.0}`, wantTTL: 2},
		{raw: `{"jobTtlSecondsAfterFinished": 1e3}`, wantTTL: 1000},
		{raw: `{"jobTtlSecondsAfterFinished": -0}`, wantTTL: 0},
		{raw: `{"jobTtlSecondsAfterFinished": 2147483647}`, wantTTL: 2147483647},
	}
	for _, tc := range tests {
		t.Run(tc.raw, func(t *testing.T) {
			got, err := policy.ParseConfig([]byte(tc.raw))
			if err != nil {
				t.Fatal(err)
			}
			if got.JobTTLSecondsAfterFinished != tc.wantTTL {
				t.Errorf("ttl = %d, want %d", got.JobTTLSecondsAfterFinished, tc.wantTTL)
			}
		})
	}
}

// Messages the validation table repeats.
const (
	msgRegex32      = "must be 1-32 characters of a-z, 0-9 and '-'"
	msgCredentials  = "not accepted in a lease's config: cluster credentials belong to the kubeclip workers"
	msgSubdomain    = "must be a DNS-1123 subdomain: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit, at most 253 characters"
	msgDNSLabel     = "must be a DNS-1123 label: lowercase letters, digits and '-', starting and ending with a letter or digit, at most 63 characters"
	msgLabelValue   = "must be a valid label value: at most 63 characters of letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
	msgQualified    = "an optional DNS subdomain prefix and '/', then a name of at most 63 characters of letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
	msgEnvName      = "must be an environment variable name: letters, digits, '-', '.' and '_', not starting with a digit, at most 253 characters"
	msgBuiltinTypes = "claude_local, codex_local, cursor_local, gemini_local, opencode_local, pi_local"
	msgDNSNameRule  = ": want labels of letters, digits and '-' separated by '.', at most 253 characters"
	msgQuantity     = "must be a Kubernetes quantity such as 500m or 1Gi, got "
	msgImageRef     = "must be an image reference such as ghcr.io/org/image:tag or ghcr.io/org/image@sha256:<64 hex digits>: invalid reference format"
)

func TestParseConfigValidation(t *testing.T) {
	longPrefix := strings.Repeat("p", 32)
	bigAnnotation := strings.Repeat("x", 256*1024)
	tests := []struct {
		name string
		raw  string
		want []policy.FieldError
	}{
		// The document.
		{"array document", `[]`, []policy.FieldError{{"config", "expected an object, got array"}}},
		{"null document", `null`, []policy.FieldError{{"config", "expected an object, got null"}}},
		{"truncated JSON", `{"namespacePrefix":`, []policy.FieldError{{"config", "invalid JSON: unexpected end of input"}}},
		{"syntax error", `{"namespacePrefix" "x"}`, []policy.FieldError{{"config", "invalid JSON: syntax error at byte 20"}}},
		{"trailing data", `{} {}`, []policy.FieldError{{"config", "invalid JSON: unexpected data after the top-level value"}}},
		{"unknown field", `{"zzz": 1, "egressModes": "x"}`, []policy.FieldError{{"egressModes", "unknown field"}, {"zzz", "unknown field"}}},
		{"unknown field with odd name", `{"a b": 1}`, []policy.FieldError{{`["a b"]`, "unknown field"}}},
		// Issue 8.13: the last of two keys would win silently.
		{"duplicate key", `{"backend": "job", "backend": "sandbox-cr"}`, []policy.FieldError{{"backend", "duplicate key"}}},
		{"case-variant key", `{"backend": "job", "Backend": "x"}`, []policy.FieldError{{"Backend", `key differs from "backend" only in case`}}},
		{"lone case-variant key", `{"NAMESPACEPREFIX": "kube-"}`, []policy.FieldError{{"NAMESPACEPREFIX", "unknown field"}}},
		{"duplicate nested key", `{"adapters": [{"adapterType": "x", "envKeys": [], "envKeys": ["KUBECLIP_NATS_PASSWORD"]}]}`, []policy.FieldError{{"adapters[0].envKeys", "duplicate key"}}},
		// Credentials belong to the workers.
		{"inCluster", `{"inCluster": true}`, []policy.FieldError{{"inCluster", msgCredentials}}},
		{"kubeconfig", `{"kubeconfig": "apiVersion: v1\nusers:\n- user: {token: sekrit}"}`, []policy.FieldError{{"kubeconfig", msgCredentials}}},
		// namespacePrefix / companySlug.
		{"prefix upper case", `{"namespacePrefix": "Paperclip-"}`, []policy.FieldError{{"namespacePrefix", msgRegex32}}},
		{"prefix empty", `{"namespacePrefix": ""}`, []policy.FieldError{{"namespacePrefix", msgRegex32}}},
		{"prefix 33 chars", `{"namespacePrefix": "` + longPrefix + `x"}`, []policy.FieldError{{"namespacePrefix", msgRegex32}}},
		{"prefix leading dash", `{"namespacePrefix": "-pc-"}`, []policy.FieldError{{"namespacePrefix", "must start with a lowercase letter or digit (it begins the namespace name)"}}},
		{"prefix not a string", `{"namespacePrefix": 5}`, []policy.FieldError{{"namespacePrefix", "expected a string, got number"}}},
		{"slug upper case", `{"companySlug": "Acme"}`, []policy.FieldError{{"companySlug", msgRegex32}}},
		{"slug leading dash", `{"companySlug": "-acme"}`, []policy.FieldError{{"companySlug", "must not start or end with '-'"}}},
		{"slug trailing dash", `{"companySlug": "acme-"}`, []policy.FieldError{{"companySlug", "must not start or end with '-'"}}},
		{"prefix+slug over 63", `{"namespacePrefix": "` + longPrefix + `", "companySlug": "` + strings.Repeat("s", 32) + `"}`,
			[]policy.FieldError{{"companySlug", "namespacePrefix + companySlug is 64 characters; a namespace name is at most 63"}}},
		// imageRegistry.
		{"registry scheme", `{"imageRegistry": "ftp://r.example.com"}`, []policy.FieldError{{"imageRegistry", `must be an http(s) URL or host[:port][/path], got scheme "ftp"`}}},
		{"registry credentials", `{"imageRegistry": "https://user:sekrit@r.example.com"}`, []policy.FieldError{{"imageRegistry", "must not contain credentials"}}},
		{"registry port", `{"imageRegistry": "r.example.com:99999"}`, []policy.FieldError{{"imageRegistry", `invalid registry port "99999"`}}},
		{"registry path upper case", `{"imageRegistry": "r.example.com/Mirror"}`, []policy.FieldError{{"imageRegistry", `invalid registry path component "Mirror": lowercase letters and digits separated by '.', '_', '__' or '-'`}}},
		{"registry query", `{"imageRegistry": "https://r.example.com/x?y=1"}`, []policy.FieldError{{"imageRegistry", "must not have a query or fragment"}}},
		{"registry host", `{"imageRegistry": "bad_host/x"}`, []policy.FieldError{{"imageRegistry", `invalid registry host "bad_host"`}}},
		{"registry no host", `{"imageRegistry": "https:///x"}`, []policy.FieldError{{"imageRegistry", "must be an http(s) URL or host[:port][/path]: missing host"}}},
		// Lists.
		{"allowlist not array", `{"imageAllowList": "ghcr.io/*"}`, []policy.FieldError{{"imageAllowList", "expected an array of strings, got string"}}},
		{"allowlist element", `{"imageAllowList": ["ok", 1]}`, []policy.FieldError{{"imageAllowList[1]", "expected a string, got number"}}},
		{"pull secret name", `{"imagePullSecrets": ["regcred", "Bad_Name"]}`, []policy.FieldError{{"imagePullSecrets[1]", msgSubdomain}}},
		{"pull secret empty", `{"imagePullSecrets": [""]}`, []policy.FieldError{{"imagePullSecrets[0]", "must not be empty"}}},
		{"fqdn with space", `{"egressAllowFqdns": ["api.example.com", "exa mple.com"]}`, []policy.FieldError{{"egressAllowFqdns[1]", `invalid DNS name "exa mple.com"` + msgDNSNameRule}}},
		{"fqdn double wildcard", `{"egressAllowFqdns": ["*.*.example.com"]}`, []policy.FieldError{{"egressAllowFqdns[0]", `invalid DNS name "*.*.example.com": '*' is only allowed as a leading "*." label`}}},
		{"fqdn inner wildcard", `{"egressAllowFqdns": ["foo*.example.com"]}`, []policy.FieldError{{"egressAllowFqdns[0]", `invalid DNS name "foo*.example.com": '*' is only allowed as a leading "*." label`}}},
		{"fqdn trailing dot", `{"egressAllowFqdns": ["api.example.com."]}`, []policy.FieldError{{"egressAllowFqdns[0]", `invalid DNS name "api.example.com."` + msgDNSNameRule}}},
		{"fqdn bare wildcard", `{"egressAllowFqdns": ["*."]}`, []policy.FieldError{{"egressAllowFqdns[0]", `invalid DNS name "*."` + msgDNSNameRule}}},
		// CIDRs.
		{"cidr octet 256", `{"egressAllowCidrs": ["10.0.0.0/8", "192.168.0.0/16", "256.1.1.1/8"]}`, []policy.FieldError{{"egressAllowCidrs[2]", `invalid IPv4 CIDR "256.1.1.1/8": octet 256 is out of range 0-255`}}},
		{"cidr prefix 33", `{"egressAllowCidrs": ["1.2.3.4/33"]}`, []policy.FieldError{{"egressAllowCidrs[0]", `invalid IPv4 CIDR "1.2.3.4/33": prefix length 33 is out of range 0-32`}}},
		{"cidr no prefix", `{"egressAllowCidrs": ["10.0.0.0"]}`, []policy.FieldError{{"egressAllowCidrs[0]", `invalid IPv4 CIDR "10.0.0.0": missing /prefix-length (e.g. 10.0.0.0/8)`}}},
		{"cidr octet leading zero", `{"egressAllowCidrs": ["010.0.0.0/8"]}`, []policy.FieldError{{"egressAllowCidrs[0]", `invalid IPv4 CIDR "010.0.0.0/8": octet "010" has a leading zero`}}},
		{"cidr prefix leading zero", `{"egressAllowCidrs": ["10.0.0.0/08"]}`, []policy.FieldError{{"egressAllowCidrs[0]", `invalid IPv4 CIDR "10.0.0.0/08": prefix length "08" has a leading zero`}}},
		{"cidr host bits", `{"egressAllowCidrs": ["10.0.0.1/8"]}`, []policy.FieldError{{"egressAllowCidrs[0]", `invalid IPv4 CIDR "10.0.0.1/8": bits are set beyond the /8 prefix (did you mean 10.0.0.0/8 or 10.0.0.1/32?)`}}},
		{"cidr ipv6", `{"egressAllowCidrs": ["fd00::/8"]}`, []policy.FieldError{{"egressAllowCidrs[0]", `invalid IPv4 CIDR "fd00::/8": only IPv4 CIDRs are supported`}}},
		{"cidr three octets", `{"egressAllowCidrs": ["1.2.3/8"]}`, []policy.FieldError{{"egressAllowCidrs[0]", `invalid IPv4 CIDR "1.2.3/8": want four dot-separated octets`}}},
		{"cidr letters", `{"egressAllowCidrs": ["a.b.c.d/8"]}`, []policy.FieldError{{"egressAllowCidrs[0]", `invalid IPv4 CIDR "a.b.c.d/8": octet "a" is not a decimal number`}}},
		{"cidr empty prefix", `{"egressAllowCidrs": ["1.2.3.4/"]}`, []policy.FieldError{{"egressAllowCidrs[0]", `invalid IPv4 CIDR "1.2.3.4/": prefix length "" is empty`}}},
		{"cidr 4-digit octet", `{"egressAllowCidrs": ["1000.0.0.0/8"]}`, []policy.FieldError{{"egressAllowCidrs[0]", `invalid IPv4 CIDR "1000.0.0.0/8": octet "1000" has more than 3 digits`}}},
		// Enums.
		{"egressMode unknown", `{"egressMode": "calico"}`, []policy.FieldError{{"egressMode", `must be one of "cilium", "standard", got "calico"`}}},
		{"egressMode type", `{"egressMode": true}`, []policy.FieldError{{"egressMode", "expected a string, got boolean"}}},
		{"backend unknown", `{"backend": "vm"}`, []policy.FieldError{{"backend", `must be one of "sandbox-cr", "job", "pod", got "vm"`}}},
		// defaultResources.
		{"resources not object", `{"defaultResources": []}`, []policy.FieldError{{"defaultResources", "expected an object, got array"}}},
		{"resources unknown key", `{"defaultResources": {"limits": {"gpu": "1"}}}`, []policy.FieldError{{"defaultResources.limits.gpu", "unknown field"}}},
		{"resources unknown section", `{"defaultResources": {"claims": {}}}`, []policy.FieldError{{"defaultResources.claims", "unknown field"}}},
		{"quantity unparsable", `{"defaultResources": {"limits": {"memory": "lots"}}}`, []policy.FieldError{{"defaultResources.limits.memory", msgQuantity + `"lots"`}}},
		{"quantity empty", `{"defaultResources": {"limits": {"cpu": ""}}}`, []policy.FieldError{{"defaultResources.limits.cpu", msgQuantity + "an empty string"}}},
		{"quantity not string", `{"defaultResources": {"requests": {"cpu": 1}}}`, []policy.FieldError{{"defaultResources.requests.cpu", "expected a string, got number"}}},
		{"quantity negative", `{"defaultResources": {"requests": {"cpu": "-1"}}}`, []policy.FieldError{{"defaultResources.requests.cpu", "must not be negative"}}},
		{"limit over LimitRange max", `{"defaultResources": {"limits": {"cpu": "8"}}}`, []policy.FieldError{{"defaultResources.limits.cpu", "8 exceeds the tenant LimitRange maximum 4"}}},
		{"request under LimitRange min", `{"defaultResources": {"requests": {"memory": "64Mi"}}}`, []policy.FieldError{{"defaultResources.requests.memory", "64Mi is below the tenant LimitRange minimum 128Mi"}}},
		{"request over limit", `{"defaultResources": {"requests": {"cpu": "3"}}}`, []policy.FieldError{{"defaultResources.requests.cpu", "request 3 exceeds the limit 2"}}},
		{"limit under default request", `{"defaultResources": {"limits": {"cpu": "100m"}}}`, []policy.FieldError{{"defaultResources.limits.cpu", "limit 100m is below the default request 250m"}}},
		// runtimeClassName, annotations.
		{"runtimeClassName", `{"runtimeClassName": "Kata_Qemu"}`, []policy.FieldError{{"runtimeClassName", msgSubdomain}}},
		{"annotation key", `{"serviceAccountAnnotations": {"bad key": "sekrit"}}`, []policy.FieldError{{`serviceAccountAnnotations["bad key"]`, "must be a valid annotation key: " + msgQualified}}},
		{"annotation value type", `{"serviceAccountAnnotations": {"a": 1}}`, []policy.FieldError{{`serviceAccountAnnotations["a"]`, "expected a string, got number"}}},
		{"annotations too big", `{"serviceAccountAnnotations": {"a": "` + bigAnnotation + `"}}`, []policy.FieldError{{"serviceAccountAnnotations", "total size 262145 bytes exceeds Kubernetes' limit of 262144"}}},
		// Integers.
		{"ttl negative", `{"jobTtlSecondsAfterFinished": -1}`, []policy.FieldError{{"jobTtlSecondsAfterFinished", "must be >= 0"}}},
		{"ttl fraction", `{"jobTtlSecondsAfterFinished": 1.5}`, []policy.FieldError{{"jobTtlSecondsAfterFinished", "must be an integer, got 1.5"}}},
		{"ttl string", `{"jobTtlSecondsAfterFinished": "900"}`, []policy.FieldError{{"jobTtlSecondsAfterFinished", "expected a number, got string"}}},
		{"ttl over int32", `{"jobTtlSecondsAfterFinished": 3000000000}`, []policy.FieldError{{"jobTtlSecondsAfterFinished", "must be at most 2147483647"}}},
		{"ttl null", `{"jobTtlSecondsAfterFinished": null}`, []policy.FieldError{{"jobTtlSecondsAfterFinished", "expected a number, got null"}}},
		{"deadline zero", `{"podActivityDeadlineSec": 0}`, []policy.FieldError{{"podActivityDeadlineSec", "must be > 0"}}},
		{"deadline negative", `{"podActivityDeadlineSec": -5}`, []policy.FieldError{{"podActivityDeadlineSec", "must be > 0"}}},
		{"deadline huge", `{"podActivityDeadlineSec": 1e400}`, []policy.FieldError{{"podActivityDeadlineSec", "number is out of range"}}},
		{"deadline over safe integer", `{"podActivityDeadlineSec": 1e16}`, []policy.FieldError{{"podActivityDeadlineSec", "must be at most 9007199254740991"}}},
		// Issue 8.7: the deadline becomes the agent guard's TTL; 2^53-1 seconds overflowed it.
		{"deadline over a week", `{"podActivityDeadlineSec": 604801}`, []policy.FieldError{{"podActivityDeadlineSec", "must be at most 604800 (7 days)"}}},
		{"deadline max safe integer", `{"podActivityDeadlineSec": 9007199254740991}`, []policy.FieldError{{"podActivityDeadlineSec", "must be at most 604800 (7 days)"}}},
		{"deadline fraction", `{"podActivityDeadlineSec": 10.25}`, []policy.FieldError{{"podActivityDeadlineSec", "must be an integer, got 10.25"}}},
		// adapterType and the registry.
		{"adapterType unknown", `{"adapterType": "claude_k8s"}`, []policy.FieldError{{"adapterType", "must be a built-in adapter type (" + msgBuiltinTypes + `) or declared in adapters, got "claude_k8s"`}}},
		{"adapterType empty", `{"adapterType": ""}`, []policy.FieldError{{"adapterType", "must not be empty"}}},
		{"adapterType not in registry", `{"adapters": [{"adapterType": "custom", "runtimeImage": "x:1"}]}`,
			[]policy.FieldError{{"adapterType", `"claude_local" is not declared in adapters (a configured adapter registry replaces the built-in adapters)`}}},
		{"default adapter without image", `{"adapterType": "custom", "adapters": [{"adapterType": "custom"}]}`,
			[]policy.FieldError{{"adapters[0].runtimeImage", `required: "custom" is the default adapterType`}}},
		{"adapters not array", `{"adapters": {}}`, []policy.FieldError{{"adapters", "expected an array, got object"}}},
		{"adapter entry not object", `{"adapters": ["claude_local"]}`, []policy.FieldError{{"adapters[0]", "expected an object, got string"}}},
		{"adapter unknown key", `{"adapters": [{"adapterType": "claude_local", "runtimeImage": "x", "foo": 1}]}`, []policy.FieldError{{"adapters[0].foo", "unknown field"}}},
		{"adapter missing type", `{"adapters": [{"runtimeImage": "x"}]}`, []policy.FieldError{{"adapters[0].adapterType", "required"}}},
		{"adapter empty type", `{"adapterType": "claude_local", "adapters": [{"adapterType": "claude_local", "runtimeImage": "x"}, {"adapterType": ""}]}`,
			[]policy.FieldError{{"adapters[1].adapterType", "must not be empty"}}},
		{"adapter duplicate", `{"adapters": [{"adapterType": "claude_local", "runtimeImage": "x"}, {"adapterType": "claude_local", "runtimeImage": "y"}]}`,
			[]policy.FieldError{{"adapters[1].adapterType", "duplicate of adapters[0]"}}},
		{"adapter type not a label value", `{"adapters": [{"adapterType": "claude_local", "runtimeImage": "x"}, {"adapterType": "has space"}]}`,
			[]policy.FieldError{{"adapters[1].adapterType", "must be a valid label value (it labels the run's objects): at most 63 characters of letters, digits, '-', '_' and '.', starting and ending with a letter or digit"}}},
		{"adapter envKeys reserved", `{"adapters": [{"adapterType": "claude_local", "runtimeImage": "x", "envKeys": ["BOOTSTRAP_TOKEN"]}]}`,
			[]policy.FieldError{{"adapters[0].envKeys[0]", "BOOTSTRAP_TOKEN is reserved"}}},
		{"adapter envKeys name", `{"adapters": [{"adapterType": "claude_local", "runtimeImage": "x", "envKeys": ["OK", "1BAD"]}]}`,
			[]policy.FieldError{{"adapters[0].envKeys[1]", msgEnvName}}},
		{"adapter defaultEnv reserved", `{"adapters": [{"adapterType": "claude_local", "runtimeImage": "x", "defaultEnv": {"BOOTSTRAP_TOKEN": "sekrit"}}]}`,
			[]policy.FieldError{{`adapters[0].defaultEnv["BOOTSTRAP_TOKEN"]`, "BOOTSTRAP_TOKEN is reserved"}}},
		{"adapter defaultEnv key", `{"adapters": [{"adapterType": "claude_local", "runtimeImage": "x", "defaultEnv": {"A=B": "sekrit"}}]}`,
			[]policy.FieldError{{`adapters[0].defaultEnv["A=B"]`, msgEnvName}}},
		{"adapter defaultEnv value type", `{"adapters": [{"adapterType": "claude_local", "runtimeImage": "x", "defaultEnv": {"K": 5}}]}`,
			[]policy.FieldError{{`adapters[0].defaultEnv["K"]`, "expected a string, got number"}}},
		{"adapter allowFqdns", `{"adapters": [{"adapterType": "claude_local", "runtimeImage": "x", "allowFqdns": ["api..example.com"]}]}`,
			[]policy.FieldError{{"adapters[0].allowFqdns[0]", `invalid DNS name "api..example.com"` + msgDNSNameRule}}},
		{"adapter enabled type", `{"adapters": [{"adapterType": "claude_local", "runtimeImage": "x", "enabled": "yes"}]}`,
			[]policy.FieldError{{"adapters[0].enabled", "expected a boolean, got string"}}},
		{"adapter image whitespace", `{"adapters": [{"adapterType": "claude_local", "runtimeImage": "ghcr.io/x y:1"}]}`,
			[]policy.FieldError{{"adapters[0].runtimeImage", msgImageRef}}},
		{"adapter probeCommand type", `{"adapters": [{"adapterType": "claude_local", "runtimeImage": "x", "probeCommand": "claude --version"}]}`,
			[]policy.FieldError{{"adapters[0].probeCommand", "expected an array of strings, got string"}}},
		// Paperclip server selector.
		{"server namespace", `{"paperclipServerNamespace": "Paperclip"}`, []policy.FieldError{{"paperclipServerNamespace", msgDNSLabel}}},
		{"server namespace empty", `{"paperclipServerNamespace": ""}`, []policy.FieldError{{"paperclipServerNamespace", "must not be empty"}}},
		{"server label value", `{"paperclipServerPodLabels": {"app": "paperclip server"}}`, []policy.FieldError{{`paperclipServerPodLabels["app"]`, msgLabelValue}}},
		{"server label key", `{"paperclipServerPodLabels": {"bad key!": "x"}}`, []policy.FieldError{{`paperclipServerPodLabels["bad key!"]`, "must be a valid label key: " + msgQualified}}},
		{"server labels type", `{"paperclipServerPodLabels": "app=x"}`, []policy.FieldError{{"paperclipServerPodLabels", "expected an object of strings, got string"}}},
		// Issue 15 item 15: an empty selector would admit every pod of the server's namespace.
		{"server labels empty", `{"paperclipServerPodLabels": {}}`, []policy.FieldError{{"paperclipServerPodLabels",
			`must select the Paperclip server's pods with at least one label: an empty selector would let tenant pods reach every pod of namespace "paperclip" on port 3100`}}},
		// Several problems at once are all reported, in field order.
		{"several", `{"egressAllowCidrs": ["1.2.3.4/33", "10.0.0.0/8", "300.0.0.0/8"], "egressMode": "x", "podActivityDeadlineSec": 0}`, []policy.FieldError{
			{"egressAllowCidrs[0]", `invalid IPv4 CIDR "1.2.3.4/33": prefix length 33 is out of range 0-32`},
			{"egressAllowCidrs[2]", `invalid IPv4 CIDR "300.0.0.0/8": octet 300 is out of range 0-255`},
			{"egressMode", `must be one of "cilium", "standard", got "x"`},
			{"podActivityDeadlineSec", "must be > 0"},
		}},
	}
	if len(tests) < 60 {
		t.Fatalf("the table has %d cases; keep at least 60", len(tests))
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := policy.ParseConfig([]byte(tc.raw))
			var verr *policy.ValidationError
			if !errors.As(err, &verr) {
				t.Fatalf("ParseConfig error = %v (%T), want a *ValidationError", err, err)
			}
			if diff := cmp.Diff(tc.want, verr.Errors); diff != "" {
				t.Errorf("field errors (-want +got):\n%s", diff)
			}
			if strings.Contains(err.Error(), "sekrit") {
				t.Errorf("error echoes a secret value: %v", err)
			}
		})
	}
}

func TestValidationErrorFormat(t *testing.T) {
	err := &policy.ValidationError{Errors: []policy.FieldError{{"a[0]", "bad"}, {"b.c", "worse"}}}
	if got, want := err.Error(), "a[0]: bad; b.c: worse"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if diff := cmp.Diff([]string{"a[0]", "b.c"}, err.Fields()); diff != "" {
		t.Errorf("Fields (-want +got):\n%s", diff)
	}
	wrapped := errors.Join(errors.New("context"), err)
	var got *policy.ValidationError
	if !errors.As(wrapped, &got) || got != err {
		t.Errorf("errors.As through a wrapper failed")
	}
}

// A Config built in code gets the same checks as a parsed one.
func TestConfigValidateInCode(t *testing.T) {
	cfg := policy.DefaultConfig()
	cfg.EgressAllowCidrs = []string{"10.0.0.0/8", "10.1.0.0/8"}
	cfg.JobTTLSecondsAfterFinished = -1
	err := cfg.Validate()
	var verr *policy.ValidationError
	if !errors.As(err, &verr) {
		t.Fatalf("Validate = %v", err)
	}
	want := []policy.FieldError{
		{"egressAllowCidrs[1]", `invalid IPv4 CIDR "10.1.0.0/8": bits are set beyond the /8 prefix (did you mean 10.0.0.0/8 or 10.1.0.0/32?)`},
		{"jobTtlSecondsAfterFinished", "must be >= 0"},
	}
	if diff := cmp.Diff(want, verr.Errors); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestCIDREdgeCases(t *testing.T) {
	tests := []struct {
		cidr   string
		wantOK bool
	}{
		{"0.0.0.0/0", true},
		{"255.255.255.255/32", true},
		{"10.0.0.0/8", true},
		{"100.64.0.0/10", true},
		{"192.168.1.7/32", true},
		{"0.0.0.0/32", true},
		{"1.2.3.4/0", false}, // host bits under /0
		{"256.1.1.1/8", false},
		{"1.2.3.4/33", false},
		{"01.2.3.4/32", false}, // leading zero: rejected (documented policy)
		{"1.2.3.4/032", false},
		{"1.2.3.4/-1", false},
		{"1.2.3.4/8/8", false},
		{" 10.0.0.0/8", false},
		{"1.2.3.4.5/32", false},
		{"", false},
	}
	for _, tc := range tests {
		t.Run(tc.cidr, func(t *testing.T) {
			raw, _ := json.Marshal(map[string]any{"egressAllowCidrs": []string{tc.cidr}})
			_, err := policy.ParseConfig(raw)
			if gotOK := err == nil; gotOK != tc.wantOK {
				t.Errorf("ParseConfig(egressAllowCidrs=[%q]) error = %v, want ok=%v", tc.cidr, err, tc.wantOK)
			}
		})
	}
}

func TestRegistryAccepted(t *testing.T) {
	for _, reg := range []string{
		"registry.example.com", "registry.example.com:5000", "localhost:5000/mirror",
		"https://registry.example.com", "http://10.0.0.5:5000/a/b", "registry.example.com/mirror/", "REGISTRY.example.com",
	} {
		raw, _ := json.Marshal(map[string]any{"imageRegistry": reg})
		if _, err := policy.ParseConfig(raw); err != nil {
			t.Errorf("imageRegistry %q rejected: %v", reg, err)
		}
	}
}

func TestFQDNAccepted(t *testing.T) {
	for _, f := range []string{"api.anthropic.com", "*.githubusercontent.com", "localhost", "API.OpenAI.com", "xn--bcher-kva.example"} {
		raw, _ := json.Marshal(map[string]any{"egressAllowFqdns": []string{f}})
		if _, err := policy.ParseConfig(raw); err != nil {
			t.Errorf("egressAllowFqdns %q rejected: %v", f, err)
		}
	}
}
