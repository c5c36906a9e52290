package main

import (
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestCreateRetryingConflictsRetriesOnlyConflicts(t *testing.T) {
	quota := schema.GroupResource{Resource: "resourcequotas"}
	conflict := apierrors.NewConflict(quota, "q", nil)
	calls := 0
	err := createRetryingConflicts(func() error {
		if calls++; calls < 3 {
			return conflict
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("after two Conflicts: err %v after %d calls, want nil after 3", err, calls)
	}

	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "p", nil)
	calls = 0
	err = createRetryingConflicts(func() error { calls++; return forbidden })
	if !apierrors.IsForbidden(err) || calls != 1 {
		t.Fatalf("Forbidden: err %v after %d calls, want Forbidden after 1", err, calls)
	}
}
