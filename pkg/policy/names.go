package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"

	"github.com/oklog/ulid/v2"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Label keys and values kubeclip puts on what it creates.
const (
	LabelRunID     = "paperclip.io/run-id"
	LabelAgentID   = "paperclip.io/agent-id"
	LabelCompanyID = "paperclip.io/company-id"
	LabelAdapter   = "paperclip.io/adapter"
	LabelManagedBy = "paperclip.io/managed-by"
	// LabelRole marks agent pods; the tenant egress policies select on it.
	LabelRole = "paperclip.io/role"

	ManagedBy = "kubeclip"
	RoleAgent = "agent"

	// ManagedBySelector selects everything kubeclip manages.
	ManagedBySelector = LabelManagedBy + "=" + ManagedBy

	// AnnotationIssueID records the Paperclip issue a run works on, when it has one.
	AnnotationIssueID = "paperclip.io/issue-id"
)

// Pod Security Admission labels of a tenant namespace.
const (
	labelPSSEnforce = "pod-security.kubernetes.io/enforce"
	labelPSSAudit   = "pod-security.kubernetes.io/audit"
	labelPSSWarn    = "pod-security.kubernetes.io/warn"
	pssRestricted   = "restricted"
)

// maxSlugLength and the 44-character head before the hash come from utils.ts.
const (
	maxSlugLength = 53
	slugHeadLen   = 44
)

var (
	nonSlugRunRE = regexp.MustCompile(`[^a-z0-9-]+`)
)

// CompanySlug derives a namespace-safe slug from a company id: lower-case, runs of characters
// outside [a-z0-9-] become one '-', leading and trailing '-' are trimmed (deriveCompanySlug).
//
// Deviation: upstream maps distinct ids to one slug ("ACME" and "acme", "acme_corp" and
// "acme-corp"), and so to one namespace. Here an id that is its own slug (a lower-case UUID, say)
// stays as it is, and any other, as well as a slug longer than 53 characters, becomes its first
// 44 characters (trailing '-' trimmed, "company" when nothing is left) + "-" + the first 8 hex
// digits of sha256(id): readable, and distinct for distinct ids. Tenant namespaces are claimed
// by one company each on top of this (the tenant-worker's ownership record), so even a slug a
// company chose itself cannot reach another company's namespace.
func CompanySlug(input string) string {
	slug := strings.Trim(nonSlugRunRE.ReplaceAllString(jsToLower(input), "-"), "-")
	if slug != "" && slug == input && len(slug) <= maxSlugLength {
		return slug
	}
	head := strings.TrimRight(slug[:min(len(slug), slugHeadLen)], "-")
	if head == "" {
		head = "company"
	}
	sum := sha256.Sum256([]byte(input))
	return head + "-" + hex.EncodeToString(sum[:])[:8]
}

// jsToLower is JavaScript's String.prototype.toLowerCase as far as it can change the result
// of CompanySlug: Go's strings.ToLower maps U+0130 (İ) to "i", JavaScript to "i̇" (i + U+0307).
func jsToLower(s string) string {
	return strings.ToLower(strings.ReplaceAll(s, "\u0130", "i\u0307"))
}

// TenantNamespace is the namespace of a company's runs: namespacePrefix + (companySlug, or the
// slug of companyID). Deviation: upstream never checks the result; kubeclip requires a valid
// DNS-1123 label of at most 63 characters and a companyID usable as a label value.
func TenantNamespace(cfg Config, companyID string) (string, error) {
	var errs fieldErrors
	checkID(&errs, "companyId", companyID)
	if err := errs.err(); err != nil {
		return "", err
	}
	slug := cfg.CompanySlug
	if slug == "" {
		slug = CompanySlug(companyID)
	}
	ns := cfg.NamespacePrefix + slug
	if len(ns) > validation.DNS1123LabelMaxLength {
		errs.add("namespacePrefix", fmt.Sprintf("tenant namespace %s (namespacePrefix + company slug) is %d characters; the limit is 63", quoteShort(ns), len(ns)))
	} else if msg := checkDNSLabel(ns); msg != "" {
		errs.add("namespacePrefix", "tenant namespace "+quoteShort(ns)+" (namespacePrefix + company slug) "+msg)
	}
	if err := errs.err(); err != nil {
		return "", err
	}
	return ns, nil
}

// checkID reports an id that is empty or not a valid label value.
func checkID(errs *fieldErrors, field, id string) {
	if id == "" {
		errs.add(field, "required")
	} else if msg := checkLabelValue(id); msg != "" {
		errs.add(field, msg)
	}
}

// WorkloadName is the name of a run's Job or Sandbox: "pc-" + the 26-character ULID in lower
// case (Crockford base32, the alphabet of utils.ts).
func WorkloadName(id ulid.ULID) string {
	return "pc-" + strings.ToLower(id.String())
}

// SecretName is the name of a run's env Secret.
func SecretName(workload string) string {
	return workload + "-env"
}

// ScopedEgressPolicyName is the name of a run's task-scoped egress policy: workload + "-egress",
// with an over-long workload name cut to head + "-" + its last 25 characters
// (scoped-network-egress.ts) so the result fits in 253 characters.
func ScopedEgressPolicyName(workload string) string {
	const suffix = "-egress"
	const maxWorkload = validation.DNS1123SubdomainMaxLength - len(suffix)
	if len(workload) > maxWorkload {
		workload = workload[:maxWorkload-26] + "-" + workload[len(workload)-25:]
	}
	return workload + suffix
}

// RunLabels are the labels of a run's workload (paperclipLabels). Deviation: agent-id carries
// the agent's id (upstream put the run id there as a stand-in); an empty agentID leaves the
// label out. Managed-by is "kubeclip".
func RunLabels(runID, agentID, companyID, adapterType string) map[string]string {
	l := map[string]string{
		LabelRunID:     runID,
		LabelCompanyID: companyID,
		LabelAdapter:   adapterType,
		LabelManagedBy: ManagedBy,
	}
	if agentID != "" {
		l[LabelAgentID] = agentID
	}
	return l
}
