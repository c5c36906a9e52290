package k8s

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"syscall"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// TestMeaning is the error table: one row per kind of answer.
func TestMeaning(t *testing.T) {
	gr := schema.GroupResource{Group: "batch", Resource: "jobs"}
	pods := schema.GroupResource{Resource: "pods"}
	gk := schema.GroupKind{Group: "batch", Kind: "Job"}
	const quotaMsg = "exceeded quota: paperclip-quota, requested: limits.cpu=2, used: limits.cpu=20, limited: limits.cpu=20"
	refused := &url.Error{Op: "Post", URL: "https://10.96.0.1:443/api", Err: &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}}
	type fate struct {
		terminal, retry bool
		code            events.Code
	}
	done := fate{}
	terminal := func(c events.Code) fate { return fate{terminal: true, code: c} }
	retry := func(c events.Code) fate { return fate{retry: true, code: c} }
	tests := []struct {
		name string
		op   Op
		err  error
		want fate
	}{
		{"nil", OpCreate, nil, done},
		{"already exists on create", OpCreate, apierrors.NewAlreadyExists(gr, "pc-a"), done},
		{"not found on delete", OpDelete, apierrors.NewNotFound(gr, "pc-a"), done},
		{"quota on create", OpCreate, apierrors.NewForbidden(pods, "pc-a", errors.New(quotaMsg)), terminal(events.CodeQuotaExceeded)},
		{"forbidden by RBAC", OpCreate, apierrors.NewForbidden(gr, "pc-a", errors.New(`User "system:serviceaccount:kubeclip:dispatcher" cannot create resource "jobs" in API group "batch" in the namespace "paperclip-acme"`)), retry(events.CodeInternal)},
		{"forbidden by admission", OpCreate, apierrors.NewForbidden(pods, "pc-a", errors.New(`violates PodSecurity "restricted:latest": privileged`)), terminal(events.CodeInternal)},
		{"invalid", OpApply, apierrors.NewInvalid(gk, "pc-a", field.ErrorList{field.Invalid(field.NewPath("metadata", "name"), "x", "bad")}), terminal(events.CodeInternal)},
		{"bad request", OpCreate, apierrors.NewBadRequest("bad"), terminal(events.CodeInternal)},
		{"run conflict", OpCreate, fmt.Errorf("creating: %w", ErrRunConflict), terminal(events.CodeInternal)},
		{"not found on create", OpCreate, apierrors.NewNotFound(schema.GroupResource{Resource: "namespaces"}, "t-x"), retry(events.CodeInternal)},
		{"already exists on apply", OpApply, apierrors.NewAlreadyExists(gr, "pc-a"), retry(events.CodeInternal)},
		{"conflict", OpDelete, apierrors.NewConflict(gr, "pc-a", errors.New("conflict")), retry(events.CodeInternal)},
		{"too many requests", OpCreate, apierrors.NewTooManyRequests("slow down", 1), retry(events.CodeBackendUnavailable)},
		{"internal error", OpCreate, apierrors.NewInternalError(errors.New("etcd")), retry(events.CodeBackendUnavailable)},
		{"server timeout", OpCreate, apierrors.NewServerTimeout(gr, "create", 1), retry(events.CodeBackendUnavailable)},
		{"service unavailable", OpRead, apierrors.NewServiceUnavailable("later"), retry(events.CodeBackendUnavailable)},
		{"connection refused", OpCreate, refused, retry(events.CodeBackendUnavailable)},
		{"deadline", OpDelete, fmt.Errorf("waiting: %w", context.DeadlineExceeded), retry(events.CodeBackendUnavailable)},
		{"something else", OpCreate, errors.New("odd"), retry(events.CodeInternal)},
		{"a decision already made", OpCreate, events.Terminalf(events.CodeInvalidConfig, "config.x", "bad"), terminal(events.CodeInvalidConfig)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Meaning(tc.op, tc.err)
			var got fate
			if te, ok := events.AsTerminal(err); ok {
				got = terminal(te.Code)
			}
			var re *events.RetryableError
			if errors.As(err, &re) {
				got = retry(re.Code)
			}
			if err != nil && got == done {
				t.Fatalf("Meaning = %v, neither terminal nor retryable", err)
			}
			if got != tc.want {
				t.Errorf("Meaning = %+v (%v), want %+v", got, err, tc.want)
			}
			if tc.err != nil && err != nil && !errors.Is(err, tc.err) {
				t.Errorf("Meaning dropped the original error from the chain")
			}
		})
	}
}

// TestQuotaRefusalIsNamedWithoutInternals: the tenant reads the quota's name and numbers, not
// the object or the user that was refused.
func TestQuotaRefusalIsNamedWithoutInternals(t *testing.T) {
	err := apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "pc-01jxyz",
		errors.New("exceeded quota: paperclip-quota, requested: pods=1, used: pods=20, limited: pods=20"))
	te, ok := events.AsTerminal(Meaning(OpCreate, err))
	if !ok {
		t.Fatal("not terminal")
	}
	got := te.Public()
	want := "config.defaultResources: the tenant's ResourceQuota paperclip-quota refuses the run (requested: pods=1, used: pods=20, limited: pods=20)"
	if got != want {
		t.Errorf("Public() = %q, want %q", got, want)
	}
	if strings.Contains(got, "pc-01jxyz") {
		t.Errorf("Public() names the refused object: %q", got)
	}
	if _, ok := QuotaFromMessage(`Error creating: pods "pc-x-1" is forbidden: exceeded quota: q1, requested: requests.cpu=1, used: requests.cpu=10, limited: requests.cpu=10`); !ok {
		t.Error("a Job controller's FailedCreate message is not read as a quota refusal")
	}
	if _, ok := QuotaFromMessage("pods is forbidden: violates PodSecurity"); ok {
		t.Error("a PodSecurity refusal read as a quota refusal")
	}
}

// Issue 19: a volume claim the tenant quota refuses fails with quota_exceeded naming the quota
// resource it exceeded (the claim count or the storage requested), not the pods' resources
// field; a refusal of both names the first the API server lists. The numbers stay in the text.
func TestStorageQuotaRefusalNamesTheResource(t *testing.T) {
	pvcs := schema.GroupResource{Resource: "persistentvolumeclaims"}
	for _, tc := range []struct {
		msg, wantField string
	}{
		{"exceeded quota: paperclip-quota, requested: requests.storage=10Gi, used: requests.storage=25Gi, limited: requests.storage=30Gi", "requests.storage"},
		{"exceeded quota: paperclip-quota, requested: persistentvolumeclaims=1, used: persistentvolumeclaims=2, limited: persistentvolumeclaims=2", "persistentvolumeclaims"},
		{"exceeded quota: paperclip-quota, requested: persistentvolumeclaims=1,requests.storage=10Gi, used: persistentvolumeclaims=2,requests.storage=25Gi, limited: persistentvolumeclaims=2,requests.storage=30Gi", "persistentvolumeclaims"},
		{"exceeded quota: q, requested: fast.storageclass.storage.k8s.io/requests.storage=10Gi, used: fast.storageclass.storage.k8s.io/requests.storage=0, limited: fast.storageclass.storage.k8s.io/requests.storage=5Gi", "fast.storageclass.storage.k8s.io/requests.storage"},
		{"exceeded quota: paperclip-quota, requested: limits.cpu=2,pods=1, used: limits.cpu=20,pods=3, limited: limits.cpu=20,pods=20", "config.defaultResources"},
	} {
		t.Run(tc.wantField, func(t *testing.T) {
			te, ok := events.AsTerminal(Meaning(OpCreate, apierrors.NewForbidden(pvcs, "pc-01jxyz-data", errors.New(tc.msg))))
			if !ok || te.Code != events.CodeQuotaExceeded {
				t.Fatalf("Meaning = %v, want terminal %s", te, events.CodeQuotaExceeded)
			}
			if te.Field != tc.wantField {
				t.Errorf("field %q, want %q", te.Field, tc.wantField)
			}
			detail := tc.msg[strings.Index(tc.msg, "requested: "):]
			if want := tc.wantField + ": the tenant's ResourceQuota "; !strings.HasPrefix(te.Public(), want) || !strings.HasSuffix(te.Public(), "("+detail+")") {
				t.Errorf("Public() = %q, want %q... (%s)", te.Public(), want, detail)
			}
		})
	}
}
