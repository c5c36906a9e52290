package ops

import (
	"context"
	"fmt"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// AccessReviewer creates SelfSubjectAccessReviews (the clientset's
// AuthorizationV1().SelfSubjectAccessReviews()). Every authenticated user may (ClusterRole
// system:basic-user), so the self-check needs no RBAC rule of its own.
type AccessReviewer interface {
	Create(ctx context.Context, review *authorizationv1.SelfSubjectAccessReview, opts metav1.CreateOptions) (*authorizationv1.SelfSubjectAccessReview, error)
}

// KubernetesAccess is the permission name asks the API server about with a
// SelfSubjectAccessReview of attrs.
func KubernetesAccess(r AccessReviewer, name string, attrs authorizationv1.ResourceAttributes) Permission {
	return Permission{Kind: PermissionKubernetes, Name: name, Probe: func(ctx context.Context) (bool, error) {
		review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &attrs}}
		got, err := r.Create(ctx, review, metav1.CreateOptions{})
		if err != nil {
			return false, fmt.Errorf("reviewing access %s: %w", name, err)
		}
		return got.Status.Allowed, nil
	}}
}
