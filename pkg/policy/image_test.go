package policy_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/kubeclip/kubeclip/pkg/policy"
)

func TestGlobMatch(t *testing.T) {
	tests := []struct {
		pattern, value string
		want           bool
	}{
		{"ghcr.io/paperclipai/*", "ghcr.io/paperclipai/agent-runtime-claude:v1", true},
		{"ghcr.io/paperclipai/*", "ghcr.io/paperclipai/sub/agent:v1", false}, // * does not cross '/'
		{"ghcr.io/*/*", "ghcr.io/acme/agent:v1", true},
		{"ghcr.io/paperclipai/agent-runtime-*:v1", "ghcr.io/paperclipai/agent-runtime-codex:v1", true},
		{"ghcr.io/paperclipai/agent-runtime-*:v1", "ghcr.io/paperclipai/agent-runtime-codex:v2", false},
		{"ghcr.io/paperclipai/agent:v?", "ghcr.io/paperclipai/agent:v1", true},
		{"ghcr.io/paperclipai/agent:v?", "ghcr.io/paperclipai/agent:v10", false},
		{"ghcr.io/paperclipai/agent?v1", "ghcr.io/paperclipai/agent/v1", false}, // ? does not match '/'
		{"ghcr.io/x", "ghcrxio/x", false},                                       // '.' is literal
		{"ghcr.io/x", "ghcr.io/x:v1", false},                                    // anchored
		{"ghcr.io/x", "pre/ghcr.io/x", false},
		{"r.io/a+b:v1", "r.io/a+b:v1", true}, // regex metacharacters are literal
		{"r.io/a+b:v1", "r.io/aab:v1", false},
		{"r.io/(x|y)[0]^$:{1}", "r.io/(x|y)[0]^$:{1}", true},
		{`r.io/a\d`, `r.io/a\d`, true},
		{`r.io/a\d`, `r.io/a1`, false},
		{"*", "nginx", true},
		{"*", "library/nginx", false},
		{"", "", true},
		{"", "x", false},
		{"r.io/*@sha256:*", "r.io/img@sha256:abc", true},
	}
	for _, tc := range tests {
		t.Run(tc.pattern+" "+tc.value, func(t *testing.T) {
			if got := policy.GlobMatch(tc.pattern, tc.value); got != tc.want {
				t.Errorf("GlobMatch(%q, %q) = %v, want %v", tc.pattern, tc.value, got, tc.want)
			}
		})
	}
}

func TestRewriteRegistry(t *testing.T) {
	tests := []struct {
		image, registry, want string
	}{
		{"ghcr.io/paperclipai/agent-runtime-claude:v1", "registry.example.com", "registry.example.com/agent-runtime-claude:v1"},
		{"ghcr.io/paperclipai/agent-runtime-claude:v1", "registry.example.com/mirror/", "registry.example.com/mirror/agent-runtime-claude:v1"},
		{"ghcr.io/paperclipai/agent-runtime-claude:v1", "registry.example.com///", "registry.example.com/agent-runtime-claude:v1"},
		{"ghcr.io/paperclipai/nested/agent:v1", "r.example.com", "r.example.com/nested/agent:v1"},
		{"ghcr.io/paperclipai/agent", "r.example.com", "r.example.com/agent"},                                                 // no tag
		{"docker.io/nginx:1.27", "r.example.com", "r.example.com/nginx:1.27"},                                                 // two segments: keep the last
		{"nginx:1.27", "r.example.com", "r.example.com/nginx:1.27"},                                                           // one segment
		{"ghcr.io/org/img@sha256:abcd", "r.example.com", "r.example.com/img@sha256:abcd"},                                     // digest split at the last ':'
		{"localhost:5000/org/img", "r.example.com", "r.example.com/localhost:5000/org/img"},                                   // upstream quirk: the port is taken for a tag
		{"ghcr.io/paperclipai/agent-runtime-claude:v1", "https://r.example.com/m", "r.example.com/m/agent-runtime-claude:v1"}, // scheme dropped (deviation)
		{"ghcr.io/paperclipai/agent-runtime-claude:v1", "http://10.0.0.5:5000", "10.0.0.5:5000/agent-runtime-claude:v1"},
	}
	for _, tc := range tests {
		t.Run(tc.image+" "+tc.registry, func(t *testing.T) {
			if got := policy.RewriteRegistry(tc.image, tc.registry); got != tc.want {
				t.Errorf("RewriteRegistry(%q, %q) = %q, want %q", tc.image, tc.registry, got, tc.want)
			}
		})
	}
}

func TestResolveImage(t *testing.T) {
	claude, err := policy.GetAdapterDefaults("claude_local", nil)
	if err != nil {
		t.Fatal(err)
	}
	plain := policy.DefaultConfig()
	mirrored := policy.DefaultConfig()
	mirrored.ImageRegistry = "registry.example.com/mirror"
	allowing := policy.DefaultConfig()
	allowing.ImageAllowList = []string{"kubeclip.local/*", "ghcr.io/acme/agent:v?"}
	allowing.ImageRegistry = "registry.example.com"
	allowingRuntime := allowing
	allowingRuntime.ImageAllowList = []string{"registry.example.com/agent-runtime-*:v1"}
	// Issue 15 item 9: the operator's list binds every company's (their intersection).
	operator := policy.Operator{ImageAllowList: []string{"ghcr.io/paperclipai/*", "kubeclip.local/*"}}
	companyNarrows := policy.DefaultConfig()
	companyNarrows.ImageAllowList = []string{"ghcr.io/paperclipai/agent-runtime-codex:*"}
	companyWidens := policy.DefaultConfig()
	companyWidens.ImageAllowList = []string{"docker.io/evil/*"}
	tests := []struct {
		name     string
		op       policy.Operator
		override string
		cfg      policy.Config
		want     string
		wantErr  string
	}{
		{name: "default image", cfg: plain, want: "ghcr.io/paperclipai/agent-runtime-claude:v1"},
		{name: "registry rewrite", cfg: mirrored, want: "registry.example.com/mirror/agent-runtime-claude:v1"},
		{name: "allowed override is used as is", override: "kubeclip.local/agent-stub:dev", cfg: allowing, want: "kubeclip.local/agent-stub:dev"},
		{name: "second glob", override: "ghcr.io/acme/agent:v3", cfg: allowing, want: "ghcr.io/acme/agent:v3"},
		{name: "override outside allowlist", override: "docker.io/evil/agent:v1", cfg: allowing, wantErr: `Image override "docker.io/evil/agent:v1" is not in allowlist`},
		// Issue 8.9: the allowlist binds the image the run uses, not only an override.
		{name: "rewritten runtime image outside allowlist", cfg: allowing, wantErr: `Image "registry.example.com/agent-runtime-claude:v1" of adapter claude_local (its runtimeImage, after imageRegistry) is not in imageAllowList`},
		{name: "runtime image inside allowlist", cfg: allowingRuntime, want: "registry.example.com/agent-runtime-claude:v1"},
		{name: "empty allowlist allows no override", override: "kubeclip.local/agent-stub:dev", cfg: plain, wantErr: `Image override "kubeclip.local/agent-stub:dev" is not in allowlist`},
		{name: "operator list allows the built-in image", op: operator, cfg: plain, want: "ghcr.io/paperclipai/agent-runtime-claude:v1"},
		{name: "operator list refuses a mirror it does not name", op: operator, cfg: mirrored,
			wantErr: `Image "registry.example.com/mirror/agent-runtime-claude:v1" is not an image this kubeclip installation allows (ghcr.io/paperclipai/*, kubeclip.local/*)`},
		{name: "company list narrows the operator's", op: operator, cfg: companyNarrows,
			wantErr: `Image "ghcr.io/paperclipai/agent-runtime-claude:v1" of adapter claude_local (its runtimeImage, after imageRegistry) is not in imageAllowList`},
		{name: "company list cannot widen the operator's", op: operator, override: "docker.io/evil/agent:v1", cfg: companyWidens,
			wantErr: `Image "docker.io/evil/agent:v1" is not an image this kubeclip installation allows (ghcr.io/paperclipai/*, kubeclip.local/*)`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.op.ResolveImage(tc.override, claude, tc.cfg)
			if tc.wantErr != "" {
				var ierr *policy.ImageNotAllowedError
				if !errors.Is(err, policy.ErrImageNotAllowed) || !errors.As(err, &ierr) || err.Error() != tc.wantErr {
					t.Fatalf("error = %v, want %q matching ErrImageNotAllowed", err, tc.wantErr)
				}
				if policy.ErrImageNotAllowed.Error() != policy.CodeImageNotAllowed {
					t.Errorf("sentinel text %q, want the failed-event code", policy.ErrImageNotAllowed)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("ResolveImage = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// Issue 15 item 18: an invalid image reference (UPPER/Case@sha256:zz) reached a Job. Every
// image a run may use is a reference in the distribution grammar, or the config field it came
// from is named.
func TestImageReferences(t *testing.T) {
	for _, ref := range []string{
		"busybox", "kubeclip.local/agent-stub:dev", "ghcr.io/paperclipai/agent-runtime-claude:v1",
		"registry.example.com:5000/a/b/c:1.2_3", "ghcr.io/x/y@sha256:" + strings.Repeat("ab", 32),
		"ghcr.io/x/y:v1@sha256:" + strings.Repeat("0f", 32),
	} {
		cfg := mustConfig(t, `{"adapterType":"x","adapters":[{"adapterType":"x","runtimeImage":`+strconv.Quote(ref)+`}]}`)
		if _, err := (policy.Operator{}).ResolveImage("", mustAdapter(t, cfg, "x"), cfg); err != nil {
			t.Errorf("%s: %v", ref, err)
		}
	}
	for ref, reason := range map[string]string{
		"UPPER/Case@sha256:zz":                       "repository name must be lowercase",
		"upper/case@sha256:zz":                       "invalid reference format",
		"ghcr.io/Org/image:v1":                       "repository name must be lowercase",
		"ghcr.io/x/y@sha256:abc":                     "invalid reference format",
		"ghcr.io/x/y@md5:" + strings.Repeat("a", 32): "invalid digest",
		"ghcr.io/x/y:" + strings.Repeat("t", 129):    "invalid reference format",
		"ghcr.io/x y:v1":                             "invalid reference format",
		"ghcr.io/x/y:v1:v2":                          "invalid reference format",
	} {
		_, err := policy.ParseConfig([]byte(`{"adapterType":"x","adapters":[{"adapterType":"x","runtimeImage":` + strconv.Quote(ref) + `}]}`))
		var ve *policy.ValidationError
		if !errors.As(err, &ve) || ve.Errors[0].Field != "adapters[0].runtimeImage" || !strings.HasSuffix(ve.Errors[0].Message, reason) {
			t.Errorf("%s: error %v, want adapters[0].runtimeImage: ...%s", ref, err, reason)
		}
	}
	// A registry that turns a valid image into an invalid one is named, not the image.
	cfg := policy.DefaultConfig()
	cfg.ImageRegistry = "registry.example.com/Mirror"
	_, err := (policy.Operator{}).ResolveImage("", mustAdapter(t, cfg, "claude_local"), cfg)
	var ve *policy.ValidationError
	if !errors.As(err, &ve) || ve.Errors[0].Field != "imageRegistry" {
		t.Errorf("rewritten into an invalid reference: %v, want a ValidationError naming imageRegistry", err)
	}
}
