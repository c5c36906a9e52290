package app_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/kubeclip/kubeclip/internal/app"
	"github.com/kubeclip/kubeclip/internal/config"
	"github.com/kubeclip/kubeclip/pkg/broker/ca"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

func tenancyOperator(t *testing.T, env map[string]string, args ...string) (policy.Operator, *config.Set, error) {
	t.Helper()
	var ten app.Tenancy
	s := config.New("test", func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	ten.Bind(s)
	if err := s.Parse(args); err != nil {
		t.Fatalf("Parse: %v", err)
	}
	op, err := ten.Operator(s)
	return op, s, err
}

// Issue 15 items 9 and 10: the operator's bounds on company knobs and the tenant quota are
// flags (and environment variables) of the tenant-worker and the dispatcher, with defaults that
// change nothing for a company that uses no knob: no runtime class or annotation choosable,
// every image pulled unless preloaded (the local cluster's), the quota as it was hard-coded.
func TestTenancyBounds(t *testing.T) {
	op, _, err := tenancyOperator(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(op.RuntimeClasses) != 0 || op.DefaultRuntimeClass != "" || len(op.ServiceAccountAnnotationKeys) != 0 || len(op.ImageAllowList) != 0 {
		t.Errorf("defaults allow knobs: %+v", op)
	}
	if diff := cmp.Diff(policy.DefaultPreloadedImages, op.PreloadedImages); diff != "" {
		t.Errorf("preloaded images (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(policy.FormatResourceList(policy.DefaultTenantQuota()), policy.FormatResourceList(op.TenantQuota)); diff != "" {
		t.Errorf("tenant quota (-want +got):\n%s", diff)
	}

	op, _, err = tenancyOperator(t, map[string]string{
		"KUBECLIP_RUNTIME_CLASSES":                 "kata, gvisor",
		"KUBECLIP_SERVICE_ACCOUNT_ANNOTATION_KEYS": "eks.amazonaws.com/role-arn",
		"KUBECLIP_TENANT_QUOTA":                    "pods=5,limits.ephemeral-storage=60Gi",
	}, "--default-runtime-class", "gvisor", "--image-allow-list", "ghcr.io/paperclipai/*", "--preloaded-images", "")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"kata", "gvisor", "gvisor", "eks.amazonaws.com/role-arn", "ghcr.io/paperclipai/*"}
	got := append(append(append(append(op.RuntimeClasses, op.DefaultRuntimeClass), op.ServiceAccountAnnotationKeys...), op.ImageAllowList...), op.PreloadedImages...)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("settings (-want +got):\n%s", diff)
	}
	if q := op.TenantQuota[corev1.ResourcePods]; q.String() != "5" || len(op.TenantQuota) != 2 {
		t.Errorf("tenant quota %s", policy.FormatResourceList(op.TenantQuota))
	}

	for _, tc := range []struct{ args []string }{
		{[]string{"--tenant-quota", "pods=lots"}},
		{[]string{"--runtime-classes", "Not_A_Name"}},
		{[]string{"--tenant-quota", "limits.ephemeral-storage=1Gi"}},
	} {
		_, s, err := tenancyOperator(t, nil, tc.args...)
		if err == nil || !strings.Contains(err.Error(), s.Names(strings.TrimPrefix(tc.args[0], "--"))) {
			t.Errorf("%v: error %v, want one naming %s", tc.args, err, s.Names(strings.TrimPrefix(tc.args[0], "--")))
		}
	}
}

// Issue 27: the broker wiring is three flags of the tenant-worker and the dispatcher; unset,
// nothing is wired; set, the CA file is read; wrong, the error names the flags and variables.
func TestTenancyBroker(t *testing.T) {
	op, _, err := tenancyOperator(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	if op.Broker.Enabled() {
		t.Errorf("wired by default: %+v", op.Broker)
	}

	authority, err := ca.Generate(ca.Options{Hosts: []string{"api.anthropic.com", "api.openai.com"}})
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(caFile, authority.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	op, _, err = tenancyOperator(t, map[string]string{"KUBECLIP_BROKER_ADDRESS": "10.96.0.42", "KUBECLIP_BROKER_HOSTS": "api.anthropic.com, api.openai.com"},
		"--broker-ca-file", caFile)
	if err != nil {
		t.Fatal(err)
	}
	want := policy.Broker{Address: "10.96.0.42", Hosts: []string{"api.anthropic.com", "api.openai.com"}, CACert: string(authority.CertPEM())}
	if diff := cmp.Diff(want, op.Broker); diff != "" {
		t.Errorf("broker (-want +got):\n%s", diff)
	}

	for _, tc := range []struct {
		name    string
		env     map[string]string
		wantErr string
	}{
		{"service link not expanded", map[string]string{"KUBECLIP_BROKER_ADDRESS": "$(CREDENTIAL_BROKER_SERVICE_HOST)", "KUBECLIP_BROKER_HOSTS": "api.openai.com", "KUBECLIP_BROKER_CA_FILE": caFile},
			"--broker-address (KUBECLIP_BROKER_ADDRESS), --broker-hosts (KUBECLIP_BROKER_HOSTS), --broker-ca-file (KUBECLIP_BROKER_CA_FILE): --broker-address \"$(CREDENTIAL_BROKER_SERVICE_HOST)\" is not an IP address"},
		{"missing CA file", map[string]string{"KUBECLIP_BROKER_ADDRESS": "10.96.0.42", "KUBECLIP_BROKER_HOSTS": "api.openai.com", "KUBECLIP_BROKER_CA_FILE": caFile + ".missing"},
			"--broker-ca-file (KUBECLIP_BROKER_CA_FILE): open "},
		{"a host the CA does not cover", map[string]string{"KUBECLIP_BROKER_ADDRESS": "10.96.0.42", "KUBECLIP_BROKER_HOSTS": "generativelanguage.googleapis.com", "KUBECLIP_BROKER_CA_FILE": caFile},
			"do not cover generativelanguage.googleapis.com"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := tenancyOperator(t, tc.env)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Operator: %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}
