package policy

import (
	"encoding/hex"
	"errors"
	"fmt"
	"io"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
)

// bootstrapTokenBytes is the token's entropy (randomBytes(32) upstream), hex-encoded to 64
// characters.
const bootstrapTokenBytes = 32

// NewBootstrapToken reads 32 random bytes from r (crypto/rand.Reader in production) and
// returns them hex-encoded.
func NewBootstrapToken(r io.Reader) (string, error) {
	b := make([]byte, bootstrapTokenBytes)
	if _, err := io.ReadFull(r, b); err != nil {
		return "", fmt.Errorf("reading bootstrap token randomness: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// OwnerReference points at a run's workload (the Job, or the Sandbox in the API version it was
// created with) once the API server has given it a UID. RenderSecret and RenderScopedEgress
// set the controller flags they need.
func OwnerReference(apiVersion, kind, name string, uid types.UID) metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: apiVersion, Kind: kind, Name: name, UID: uid}
}

// RenderSecret renders a run's env Secret (createPerRunSecret in secret-manager.ts):
// `<workload>-env`, type Opaque, labelled with the run id and managed-by, owned by the workload
// (controller and blockOwnerDeletion, so it is garbage-collected with it), holding
// BOOTSTRAP_TOKEN and the adapter env as stringData.
//
// It fails if the owner has no UID, the token is empty, adapterEnv sets BOOTSTRAP_TOKEN
// (ErrReservedEnvKey), or a key is not a valid Secret key. Errors name keys, never values.
func RenderSecret(spec RunSpec, owner metav1.OwnerReference, bootstrapToken string, adapterEnv map[string]string) (*corev1.Secret, error) {
	if owner.UID == "" {
		return nil, errors.New("rendering run secret: the owner reference needs the workload's uid")
	}
	if bootstrapToken == "" {
		return nil, errors.New("rendering run secret: empty bootstrap token")
	}
	if _, ok := adapterEnv[BootstrapTokenKey]; ok {
		return nil, fmt.Errorf("rendering run secret: adapterEnv must not contain %s (reserved key): %w", BootstrapTokenKey, ErrReservedEnvKey)
	}
	data := map[string]string{BootstrapTokenKey: bootstrapToken}
	for _, k := range sortedKeys(adapterEnv) {
		if len(validation.IsConfigMapKey(k)) > 0 {
			return nil, fmt.Errorf("rendering run secret: key %s is not a valid Secret key", quoteShort(k))
		}
		data[k] = adapterEnv[k]
	}
	owner.Controller = ptrTo(true)
	owner.BlockOwnerDeletion = ptrTo(true)
	return &corev1.Secret{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{
			Name:            SecretName(spec.WorkloadName),
			Namespace:       spec.Namespace,
			Labels:          map[string]string{LabelRunID: spec.RunID, LabelManagedBy: ManagedBy},
			OwnerReferences: []metav1.OwnerReference{owner},
		},
		Type:       corev1.SecretTypeOpaque,
		StringData: data,
	}, nil
}
