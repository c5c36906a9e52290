package k8s

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// SecretValues reads a Secret's keys and values. A missing Secret has none (an empty map, no
// error): the dispatcher's adapter Secret is optional. Errors name the Secret, never a value.
func SecretValues(ctx context.Context, cs kubernetes.Interface, ref types.NamespacedName) (map[string]string, error) {
	s, err := cs.CoreV1().Secrets(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return map[string]string{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading Secret %s: %w", ref, err)
	}
	values := make(map[string]string, len(s.Data))
	for k, v := range s.Data {
		values[k] = string(v)
	}
	return values, nil
}
