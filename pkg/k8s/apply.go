package k8s

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
)

// DefaultFieldManager is the server-side apply field manager of every kubeclip write.
const DefaultFieldManager = "kubeclip"

// ErrInvalidObject marks an object the Applier refuses before sending it (no kind, no name, a
// namespace missing on a namespaced kind or present on a cluster-scoped one). It is a bug in the
// renderer, not something a retry fixes.
var ErrInvalidObject = errors.New("invalid object")

// NewRESTMapper returns the mapper the Applier wants: discovery results cached in memory and
// loaded on first use. Once loaded, the cache is considered fresh forever, so a kind installed
// later (a CRD such as CiliumNetworkPolicy) is only found after a Reset; the Applier resets once
// when a mapping is not found.
func NewRESTMapper(dc discovery.DiscoveryInterface) meta.ResettableRESTMapper {
	return restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
}

// ApplierOptions configures an Applier.
type ApplierOptions struct {
	// Dynamic sends the apply and delete requests.
	Dynamic dynamic.Interface
	// Mapper maps kinds to resources and scopes. Use NewRESTMapper; if it implements
	// meta.ResettableRESTMapper it is reset once when a kind is not found.
	Mapper meta.RESTMapper
	// FieldManager names the owner of the applied fields. Default DefaultFieldManager.
	FieldManager string
}

// Applier server-side applies rendered objects (a tenant's Namespace, ServiceAccount, Role,
// RoleBinding, ResourceQuota, LimitRange and network policies) and deletes them by kind.
type Applier struct {
	dyn          dynamic.Interface
	mapper       meta.RESTMapper
	fieldManager string
}

// NewApplier validates opts and returns an Applier.
func NewApplier(opts ApplierOptions) (*Applier, error) {
	if opts.Dynamic == nil {
		return nil, errors.New("applier: Dynamic client is required")
	}
	if opts.Mapper == nil {
		return nil, errors.New("applier: Mapper is required")
	}
	if opts.FieldManager == "" {
		opts.FieldManager = DefaultFieldManager
	}
	return &Applier{dyn: opts.Dynamic, mapper: opts.Mapper, fieldManager: opts.FieldManager}, nil
}

// Apply server-side applies objs one by one, in the given order (a Namespace before what lives
// in it), and stops at the first error. Force is set: kubeclip owns every field it renders, and a
// conflict with another manager (someone's kubectl edit) must not wedge the tenant. Applying an
// unchanged object is a no-op on the server (no new resourceVersion).
//
// Errors read "applying <Kind> <ns>/<name>: ..." and wrap the API error, so apierrors.IsInvalid,
// apierrors.IsForbidden and meta.IsNoMatchError (the kind's CRD is not installed) still work.
func (a *Applier) Apply(ctx context.Context, objs ...*unstructured.Unstructured) error {
	for _, obj := range objs {
		if err := a.applyOne(ctx, obj); err != nil {
			return err
		}
	}
	return nil
}

func (a *Applier) applyOne(ctx context.Context, obj *unstructured.Unstructured) error {
	if obj == nil {
		return fmt.Errorf("applying nil object: %w", ErrInvalidObject)
	}
	gvk := obj.GroupVersionKind()
	ns, name := obj.GetNamespace(), obj.GetName()
	if gvk.Kind == "" || gvk.Version == "" || name == "" {
		return fmt.Errorf("applying %s: apiVersion, kind and metadata.name are required: %w", objRef(gvk.Kind, ns, name), ErrInvalidObject)
	}
	mapping, err := a.mapping(gvk)
	if err != nil {
		return fmt.Errorf("applying %s: %w", objRef(gvk.Kind, ns, name), err)
	}
	var ri dynamic.ResourceInterface
	switch namespaced := mapping.Scope.Name() == meta.RESTScopeNameNamespace; {
	case namespaced && ns == "":
		return fmt.Errorf("applying %s: namespaced kind without metadata.namespace: %w", objRef(gvk.Kind, ns, name), ErrInvalidObject)
	case !namespaced && ns != "":
		return fmt.Errorf("applying %s: cluster-scoped kind with metadata.namespace: %w", objRef(gvk.Kind, ns, name), ErrInvalidObject)
	case namespaced:
		ri = a.dyn.Resource(mapping.Resource).Namespace(ns)
	default:
		ri = a.dyn.Resource(mapping.Resource)
	}
	_, err = ri.Apply(ctx, name, obj, metav1.ApplyOptions{FieldManager: a.fieldManager, Force: true})
	if err != nil {
		return fmt.Errorf("applying %s: %w", objRef(gvk.Kind, ns, name), err)
	}
	return nil
}

// Delete deletes one object. It is done when the object is gone: NotFound and a kind the cluster
// does not know (its CRD is not installed, so no such object can exist) return nil. Deletion is
// Background: dependents are collected by the garbage collector afterwards.
func (a *Applier) Delete(ctx context.Context, gvk schema.GroupVersionKind, namespace, name string) error {
	mapping, err := a.mapping(gvk)
	if meta.IsNoMatchError(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("deleting %s: %w", objRef(gvk.Kind, namespace, name), err)
	}
	var ri dynamic.ResourceInterface = a.dyn.Resource(mapping.Resource)
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		ri = a.dyn.Resource(mapping.Resource).Namespace(namespace)
	}
	propagation := metav1.DeletePropagationBackground
	err = ri.Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &propagation})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("deleting %s: %w", objRef(gvk.Kind, namespace, name), err)
	}
	return nil
}

// mapping resolves gvk, resetting a resettable mapper once when the kind is unknown: the cached
// discovery may predate a CRD installed since.
func (a *Applier) mapping(gvk schema.GroupVersionKind) (*meta.RESTMapping, error) {
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if !meta.IsNoMatchError(err) {
		return m, err
	}
	r, ok := a.mapper.(meta.ResettableRESTMapper)
	if !ok {
		return nil, err
	}
	r.Reset()
	return a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
}

// objRef formats "Kind ns/name" or "Kind name" for error messages.
func objRef(kind, namespace, name string) string {
	if kind == "" {
		kind = "object"
	}
	if namespace == "" {
		return kind + " " + name
	}
	return kind + " " + namespace + "/" + name
}
