package k8s

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strings"
	"syscall"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// Op is what a worker was doing when the API server answered: the same answer means different
// things for different operations (NotFound is success for a delete, AlreadyExists for an
// idempotent create).
type Op int

// Operations.
const (
	OpCreate Op = iota // creating an object kubeclip names itself
	OpApply            // server-side apply of a tenant object
	OpDelete           // deleting, or waiting for a deletion
	OpRead             // get, list, watch, logs
)

// Meaning is the one table of what a Kubernetes API error means for the message being handled.
// Every worker maps its Kubernetes errors through it, and the consume loop turns the result
// into the message's fate:
//
//	nil, AlreadyExists on create, NotFound on delete   → nil: done (ack)
//	exceeded ResourceQuota (Forbidden)                 → terminal quota_exceeded, naming the quota
//	                                                     and the field (Quota.Field)
//	ErrRunConflict                                     → terminal internal (the name is another run's)
//	Forbidden by RBAC                                  → retry, internal (the per-tenant RoleBinding
//	                                                     the tenant-worker has just created is not in
//	                                                     the authorizer's cache yet)
//	Forbidden otherwise (admission), Invalid, BadRequest, MethodNotSupported,
//	  RequestEntityTooLarge, UnsupportedMediaType,
//	  NotAcceptable                                    → terminal internal (a retry fails alike)
//	NotFound on create or apply                        → retry, internal once retries run out (a
//	                                                     namespace or Role the API server's caches
//	                                                     do not show yet)
//	Conflict                                           → retry, internal
//	TooManyRequests, ServerTimeout, Timeout,
//	  InternalError, ServiceUnavailable, other 5xx,
//	  network errors, a deadline                       → retry, backend_unavailable once retries
//	                                                     run out
//	anything else                                      → retry, internal
//
// The original error stays inside for kubeclip's logs; a terminal error's tenant-facing text is
// the code's (events.TerminalError.Public), so API server addresses, Secret names and RBAC
// subjects never reach a tenant.
func Meaning(op Op, err error) error {
	switch {
	case err == nil:
		return nil
	case op == OpCreate && apierrors.IsAlreadyExists(err), op == OpDelete && apierrors.IsNotFound(err):
		return nil
	}
	if _, ok := events.AsTerminal(err); ok {
		return err // already decided
	}
	if q, ok := QuotaRefusal(err); ok {
		return &events.TerminalError{Code: events.CodeQuotaExceeded, Field: q.Field(), Err: err, Message: q.String()}
	}
	switch {
	case errors.Is(err, ErrRunConflict):
		return events.Terminal(events.CodeInternal, "", err)
	case apierrors.IsForbidden(err) && rbacDenialRE.MatchString(err.Error()):
		return &events.RetryableError{Code: events.CodeInternal, Err: err}
	case apierrors.IsForbidden(err), apierrors.IsInvalid(err), apierrors.IsBadRequest(err),
		apierrors.IsMethodNotSupported(err), apierrors.IsRequestEntityTooLargeError(err),
		apierrors.IsUnsupportedMediaType(err), apierrors.IsNotAcceptable(err):
		return events.Terminal(events.CodeInternal, "", err)
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		return &events.RetryableError{Code: events.CodeInternal, Err: err}
	case unavailable(err):
		return &events.RetryableError{Code: events.CodeBackendUnavailable, Err: err}
	}
	return &events.RetryableError{Code: events.CodeInternal, Err: err}
}

// rbacDenialRE reads the RBAC authorizer's refusal (`User "…" cannot create resource "secrets"
// …`), as opposed to an admission plugin's (Pod Security, ValidatingAdmissionPolicy, quota),
// which a retry would meet again. RBAC authorizes from informer caches, so a RoleBinding created
// a moment ago can still be missing there.
var rbacDenialRE = regexp.MustCompile(`User ".*" cannot [a-z]+ resource `)

// unavailable reports an error that says the API server could not be reached or could not
// answer now.
func unavailable(err error) bool {
	if apierrors.IsTooManyRequests(err) || apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) ||
		apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err) || apierrors.IsUnexpectedServerError(err) {
		return true
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) && status.Status().Code >= 500 {
		return true
	}
	var netErr net.Error
	var opErr *net.OpError
	return errors.As(err, &netErr) || errors.As(err, &opErr) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, context.DeadlineExceeded)
}

// Quota is a ResourceQuota refusing an object.
type Quota struct {
	Name string
	// Detail is the API server's "requested: …, used: …, limited: …" part.
	Detail string
	// Resources are the quota's resources the object exceeded, in the API server's (sorted)
	// order: it lists only those in Detail.
	Resources []string
}

// Field names what the refusal is about. A volume claim's refusal names the storage resource it
// exceeded (persistentvolumeclaims, requests.storage, or their per-StorageClass forms): the
// company holds too many reusable leases' volumes, or too much storage in them. Any other
// refusal is a pod's, and names config.defaultResources, the company's knob for its pods'
// requests and limits.
func (q Quota) Field() string {
	for _, r := range q.Resources {
		if storageQuotaResource(r) {
			return r
		}
	}
	return "config.defaultResources"
}

// storageQuotaResource reports the quota resources a volume claim counts against: the claim
// count and requested storage, overall or of one StorageClass
// (<class>.storageclass.storage.k8s.io/requests.storage).
func storageQuotaResource(r string) bool {
	_, name, _ := strings.Cut(r, ".storageclass.storage.k8s.io/")
	if name == "" {
		name = r
	}
	return name == string(corev1.ResourcePersistentVolumeClaims) || name == string(corev1.ResourceRequestsStorage)
}

func (q Quota) String() string {
	if q.Detail == "" {
		return fmt.Sprintf("the tenant's ResourceQuota %s refuses the run", q.Name)
	}
	return fmt.Sprintf("the tenant's ResourceQuota %s refuses the run (%s)", q.Name, q.Detail)
}

// quotaRE reads the quota admission plugin's refusal. The API server reports it only as a
// Forbidden status whose message says "exceeded quota: <name>, requested: …, used: …, limited:
// …" (k8s.io/apiserver's resourcequota admission; no structured cause), and the Job controller
// repeats that message in its FailedCreate event, so this pattern is the one place that text is
// read.
var quotaRE = regexp.MustCompile(`exceeded quota: ([a-z0-9]([-a-z0-9.]*[a-z0-9])?)(, (requested: .*))?$`)

// QuotaRefusal reports whether err is a ResourceQuota refusing an object, and which quota.
func QuotaRefusal(err error) (Quota, bool) {
	if !apierrors.IsForbidden(err) {
		return Quota{}, false
	}
	return QuotaFromMessage(err.Error())
}

// QuotaFromMessage parses a quota refusal out of an API server message, such as a Job's
// FailedCreate event.
func QuotaFromMessage(msg string) (Quota, bool) {
	m := quotaRE.FindStringSubmatch(msg)
	if m == nil {
		return Quota{}, false
	}
	return Quota{Name: m[1], Detail: m[4], Resources: exceededResources(m[4])}, true
}

// exceededResources reads the resource names of a refusal's "requested: a=1,b=2, used: …" part.
func exceededResources(detail string) []string {
	requested, _, _ := strings.Cut(strings.TrimPrefix(detail, "requested: "), ", used: ")
	var out []string
	for _, item := range strings.Split(requested, ",") {
		if name, _, ok := strings.Cut(item, "="); ok && name != "" {
			out = append(out, name)
		}
	}
	return out
}
