package policy_test

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/kubeclip/kubeclip/pkg/policy"
)

// Issue 15 item 9: a tenant container whose image is already on the node ran it without a pull
// (IfNotPresent), so another company's private image, cached there with its pull secret, ran
// for a company that holds no credentials. A tenant's image is pulled every time, so the
// registry checks this pod's credentials.
func TestTenantImagesArePulledEveryTime(t *testing.T) {
	spec := testRunSpec(policy.DefaultConfig())
	for name, pod := range renderedPods(t, spec) {
		for _, c := range pod.Spec.Containers {
			if c.ImagePullPolicy != corev1.PullAlways {
				t.Errorf("%s: container %s pulls %s, want Always", name, c.Name, c.ImagePullPolicy)
			}
		}
	}
}

// Issue 15 items 9 and 18: the operator bounds a company's isolation knobs (runtime class,
// ServiceAccount annotations) and which API keys each adapter may name.
func TestOperatorBoundsCompanyKnobs(t *testing.T) {
	def := policy.DefaultOperator()
	op := policy.DefaultOperator()
	op.RuntimeClasses = []string{"kata"}
	op.DefaultRuntimeClass = "gvisor"
	op.ServiceAccountAnnotationKeys = []string{"iam.gke.io/gcp-service-account"}
	op.AdapterEnvKeys = []string{"CUSTOM_KEY"}
	tests := []struct {
		name        string
		op          policy.Operator
		cfg         string
		want        []policy.FieldError
		wantRuntime string
	}{
		{name: "defaults", op: def, cfg: `{}`},
		{name: "no runtime class may be chosen by default", op: def, cfg: `{"runtimeClassName":"runc"}`,
			want: []policy.FieldError{{"runtimeClassName", `"runc" is not a runtime class this kubeclip installation allows (allowed: none)`}}},
		{name: "the operator's default runtime class", op: op, cfg: `{}`, wantRuntime: "gvisor"},
		{name: "an allowed runtime class", op: op, cfg: `{"runtimeClassName":"kata"}`, wantRuntime: "kata"},
		{name: "the default runtime class named", op: op, cfg: `{"runtimeClassName":"gvisor"}`, wantRuntime: "gvisor"},
		{name: "opting out of the sandboxed runtime", op: op, cfg: `{"runtimeClassName":"runc"}`,
			want: []policy.FieldError{{"runtimeClassName", `"runc" is not a runtime class this kubeclip installation allows (allowed: gvisor, kata)`}}},
		{name: "no annotation by default", op: def, cfg: `{"serviceAccountAnnotations":{"eks.amazonaws.com/role-arn":"arn:aws:iam::1:role/x"}}`,
			want: []policy.FieldError{{`serviceAccountAnnotations["eks.amazonaws.com/role-arn"]`, "is not a ServiceAccount annotation this kubeclip installation allows (allowed: none)"}}},
		{name: "an allowed annotation", op: op, cfg: `{"serviceAccountAnnotations":{"iam.gke.io/gcp-service-account":"a@p.iam.gserviceaccount.com"}}`, wantRuntime: "gvisor"},
		{name: "another annotation", op: op, cfg: `{"serviceAccountAnnotations":{"eks.amazonaws.com/role-arn":"x"}}`,
			want: []policy.FieldError{{`serviceAccountAnnotations["eks.amazonaws.com/role-arn"]`, "is not a ServiceAccount annotation this kubeclip installation allows (allowed: iam.gke.io/gcp-service-account)"}}},
		{name: "a built-in type keeps its own keys", op: def, cfg: `{"adapters":[{"adapterType":"claude_local","runtimeImage":"r.example.com/c:v1","envKeys":["ANTHROPIC_API_KEY"]},
			{"adapterType":"cursor_local","runtimeImage":"r.example.com/c:v1","envKeys":["ANTHROPIC_API_KEY","OPENAI_API_KEY"]}]}`},
		{name: "a custom adapter has only the operator's keys", op: op, cfg: `{"adapterType":"mine","adapters":[{"adapterType":"mine","runtimeImage":"r.example.com/m:v1","envKeys":["CUSTOM_KEY","OPENAI_API_KEY"]}]}`,
			want:        []policy.FieldError{{"adapters[0].envKeys[1]", `"OPENAI_API_KEY" is not a key of adapter "mine" (its own: CUSTOM_KEY)`}},
			wantRuntime: "gvisor"},
		{name: "a built-in may not borrow another built-in's key", op: def, cfg: `{"adapters":[{"adapterType":"pi_local","runtimeImage":"r.example.com/p:v1","envKeys":["OPENROUTER_API_KEY"]}],"adapterType":"pi_local"}`,
			want: []policy.FieldError{{"adapters[0].envKeys[0]", `"OPENROUTER_API_KEY" is not a key of adapter "pi_local" (its own: ANTHROPIC_API_KEY)`}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := mustConfig(t, tc.cfg)
			err := tc.op.CheckConfig(cfg)
			var got []policy.FieldError
			var ve *policy.ValidationError
			if errors.As(err, &ve) {
				got = ve.Errors
			} else if err != nil {
				t.Fatalf("CheckConfig = %v, want a ValidationError", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("errors (-want +got):\n%s", diff)
			}
			if err == nil {
				if got := tc.op.RuntimeClass(cfg); got != tc.wantRuntime {
					t.Errorf("RuntimeClass = %q, want %q", got, tc.wantRuntime)
				}
			}
		})
	}
}

// Images the nodes hold without a registry (the local cluster's) run as they are; every other
// tenant image is pulled.
func TestOperatorPullPolicy(t *testing.T) {
	op := policy.Operator{PreloadedImages: policy.DefaultPreloadedImages}
	for image, want := range map[string]corev1.PullPolicy{
		"kubeclip.local/agent-stub:dev":               corev1.PullIfNotPresent,
		"ghcr.io/paperclipai/agent-runtime-claude:v1": corev1.PullAlways,
		"kubeclip.local.evil.example/x:v1":            corev1.PullAlways,
	} {
		if got := op.PullPolicy(image); got != want {
			t.Errorf("PullPolicy(%s) = %s, want %s", image, got, want)
		}
	}
	if got := (policy.Operator{}).PullPolicy("kubeclip.local/agent-stub:dev"); got != corev1.PullAlways {
		t.Errorf("with no preloaded images: %s, want Always", got)
	}
}

// The operator's own settings are checked when the workers start.
func TestOperatorKnobsAreValidated(t *testing.T) {
	for name, mutate := range map[string]func(*policy.Operator){
		"runtime class":  func(o *policy.Operator) { o.RuntimeClasses = []string{"Kata"} },
		"default class":  func(o *policy.Operator) { o.DefaultRuntimeClass = "g visor" },
		"annotation key": func(o *policy.Operator) { o.ServiceAccountAnnotationKeys = []string{"bad key!"} },
	} {
		op := policy.DefaultOperator()
		mutate(&op)
		if err := op.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if err := policy.DefaultOperator().Validate(); err != nil {
		t.Errorf("DefaultOperator: %v", err)
	}
}
