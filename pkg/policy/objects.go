package policy

import (
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Group/version/kinds and resources of the objects kubeclip renders that typed clients do not
// cover.
var (
	CiliumNetworkPolicyGVK = schema.GroupVersionKind{Group: "cilium.io", Version: "v2", Kind: "CiliumNetworkPolicy"}
	CiliumNetworkPolicyGVR = schema.GroupVersionResource{Group: "cilium.io", Version: "v2", Resource: "ciliumnetworkpolicies"}
	NetworkPolicyGVK       = schema.GroupVersionKind{Group: "networking.k8s.io", Version: "v1", Kind: "NetworkPolicy"}
	NetworkPolicyGVR       = schema.GroupVersionResource{Group: "networking.k8s.io", Version: "v1", Resource: "networkpolicies"}
)

// ObjectRef names one object: enough for a dynamic client to delete it.
type ObjectRef struct {
	GVK       schema.GroupVersionKind
	GVR       schema.GroupVersionResource
	Namespace string
	Name      string
}

// ToUnstructured converts a rendered typed object (its TypeMeta must be set) to the form the
// dynamic client applies, as Tenant.Objects does.
func ToUnstructured(obj runtime.Object) (*unstructured.Unstructured, error) {
	return toUnstructured(obj)
}

// toUnstructured converts a typed object whose TypeMeta is set. It goes through JSON so that
// zero values the API omits (creationTimestamp, empty status) are left out, and through
// unstructured's own decoder so whole numbers are int64, as the dynamic client expects.
func toUnstructured(obj runtime.Object) (*unstructured.Unstructured, error) {
	data, err := json.Marshal(obj)
	if err != nil {
		return nil, fmt.Errorf("encoding %T: %w", obj, err)
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(data); err != nil {
		return nil, fmt.Errorf("decoding %T: %w", obj, err)
	}
	for _, k := range []string{"spec", "status"} {
		if m, ok := u.Object[k].(map[string]any); ok && len(m) == 0 {
			delete(u.Object, k)
		}
	}
	return u, nil
}

func stringMapToAny(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
