package k8s

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

func TestValidateRunInput(t *testing.T) {
	job := func(ns, name, runID string) *batchv1.Job {
		j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		if runID != "" {
			j.Labels = map[string]string{LabelRunID: runID}
		}
		return j
	}
	secret := func(ns, name, runID string) *corev1.Secret {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		if runID != "" {
			s.Labels = map[string]string{LabelRunID: runID}
		}
		return s
	}
	tests := []struct {
		name    string
		secret  *corev1.Secret
		job     *batchv1.Job
		wantErr bool
	}{
		{"valid", secret("t-x", "pc-a-env", "r1"), job("t-x", "pc-a", "r1"), false},
		{"nil secret", nil, job("t-x", "pc-a", "r1"), true},
		{"no job name", secret("t-x", "pc-a-env", "r1"), job("t-x", "", "r1"), true},
		{"no namespace", secret("", "pc-a-env", "r1"), job("", "pc-a", "r1"), true},
		{"namespaces differ", secret("t-y", "pc-a-env", "r1"), job("t-x", "pc-a", "r1"), true},
		{"job without run id", secret("t-x", "pc-a-env", "r1"), job("t-x", "pc-a", ""), true},
		{"secret without run id", secret("t-x", "pc-a-env", ""), job("t-x", "pc-a", "r1"), true},
		{"run ids differ", secret("t-x", "pc-a-env", "r2"), job("t-x", "pc-a", "r1"), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := validateRunInput(tc.secret, &jobWorkload{job: tc.job})
			if (err != nil) != tc.wantErr {
				t.Fatalf("validateRunInput error = %v, want error: %v", err, tc.wantErr)
			}
			if err != nil && !errors.Is(err, ErrInvalidObject) {
				t.Errorf("error %v is not ErrInvalidObject", err)
			}
		})
	}
}

// TestIsPermanentCreateError: which create errors make createRun remove the Secret it made.
func TestIsPermanentCreateError(t *testing.T) {
	gr := schema.GroupResource{Group: "batch", Resource: "jobs"}
	gk := schema.GroupKind{Group: "batch", Kind: "Job"}
	tests := []struct {
		err  error
		want bool
	}{
		{apierrors.NewInvalid(gk, "pc-a", field.ErrorList{field.Invalid(field.NewPath("metadata", "name"), "x", "bad")}), true},
		{apierrors.NewForbidden(gr, "pc-a", errors.New("exceeded quota: q, requested: count/jobs.batch=1")), true},
		{apierrors.NewBadRequest("bad"), true},
		{apierrors.NewNotFound(schema.GroupResource{Resource: "namespaces"}, "t-x"), true},
		{apierrors.NewConflict(gr, "pc-a", errors.New("conflict")), false},
		{apierrors.NewTooManyRequests("slow down", 1), false},
		{apierrors.NewInternalError(errors.New("etcd")), false},
		{apierrors.NewServerTimeout(gr, "create", 1), false},
		{apierrors.NewServiceUnavailable("later"), false},
		{errors.New("connection refused"), false},
		{fmt.Errorf("wrapped: %w", apierrors.NewBadRequest("bad")), true},
	}
	for _, tc := range tests {
		if got := isPermanentCreateError(tc.err); got != tc.want {
			t.Errorf("isPermanentCreateError(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

func TestOwnerPatch(t *testing.T) {
	b, err := ownerPatch("batch/v1", "Job", "pc-a", "uid-1")
	if err != nil {
		t.Fatal(err)
	}
	want := `{"metadata":{"ownerReferences":[{"apiVersion":"batch/v1","kind":"Job","name":"pc-a","uid":"uid-1","controller":true,"blockOwnerDeletion":true}]}}`
	if diff := cmp.Diff(want, string(b)); diff != "" {
		t.Errorf("patch (-want +got):\n%s", diff)
	}
}

func TestRunDeleteOptionsDefaults(t *testing.T) {
	tests := []struct {
		in   RunDeleteOptions
		want RunDeleteOptions
	}{
		// Pins DefaultPodGracePeriod (5s) and Background propagation.
		{RunDeleteOptions{}, RunDeleteOptions{Propagation: metav1.DeletePropagationBackground, PodGracePeriod: 5 * time.Second}},
		{RunDeleteOptions{PodGracePeriod: 100 * time.Millisecond}, RunDeleteOptions{Propagation: metav1.DeletePropagationBackground, PodGracePeriod: time.Second}},
		{RunDeleteOptions{Propagation: metav1.DeletePropagationForeground, PodGracePeriod: 30 * time.Second}, RunDeleteOptions{Propagation: metav1.DeletePropagationForeground, PodGracePeriod: 30 * time.Second}},
	}
	for _, tc := range tests {
		if diff := cmp.Diff(tc.want, tc.in.withDefaults()); diff != "" {
			t.Errorf("withDefaults(%+v) (-want +got):\n%s", tc.in, diff)
		}
	}
}
