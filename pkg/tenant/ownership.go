package tenant

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/k8s"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// record is a namespace's KUBECLIP_TENANTS entry (lease.TenantRecord: the dispatcher checks
// ownership from it too).
type record = lease.TenantRecord

// companyRecord is KUBECLIP_TENANTS' index of the namespaces one company claimed, kept under
// companyKey, so the per-company cap holds across every tenant-worker replica.
type companyRecord struct {
	Namespaces []string `json:"namespaces"`
}

// companyKey is a company's index key: "companies." + its id. Company ids are label values
// ([A-Za-z0-9._-]), valid KV key characters, and namespace names never contain '.', so it
// cannot meet a namespace's key.
func companyKey(companyID string) string { return "companies." + companyID }

// maxClaimAttempts bounds the compare-and-set loops of a claim: few writers race on one key.
const maxClaimAttempts = 5

// ownedRecord returns ns's record after making sure it belongs to the plan's company, claiming
// it when nobody has. A namespace of another company, one that exists in the cluster without
// being this company's tenant, or one over the company's cap is refused with
// namespace_not_allowed, before anything is applied.
func (w *Worker) ownedRecord(ctx context.Context, plan lease.Plan) (record, uint64, error) {
	ns, company := plan.Namespace, plan.Request.CompanyID
	for range maxClaimAttempts {
		rec, rev, found, err := w.record(ctx, ns)
		if err != nil {
			return record{}, 0, err
		}
		if found && rec.CompanyID != "" {
			if rec.CompanyID != company {
				return record{}, 0, refuse(plan, "namespace %s belongs to another company", ns)
			}
			return rec, rev, nil
		}
		if err := w.checkCluster(ctx, plan); err != nil {
			return record{}, 0, err
		}
		if err := w.countClaim(ctx, plan); err != nil {
			return record{}, 0, err
		}
		rec.CompanyID, rec.ClaimedAt = company, w.opts.Now().UTC()
		data, err := json.Marshal(rec)
		if err != nil {
			return record{}, 0, fmt.Errorf("encoding tenant record: %w", err)
		}
		if found {
			rev, err = w.tenants.Update(ctx, ns, data, rev) // a record from before ownership
		} else {
			rev, err = w.tenants.Create(ctx, ns, data)
		}
		switch {
		case err == nil:
			return rec, rev, nil
		case errors.Is(err, jetstream.ErrKeyExists), errors.Is(err, jetstream.ErrKeyRevisionMismatch):
			continue // someone claimed it meanwhile: read who
		default:
			return record{}, 0, fmt.Errorf("claiming namespace %s: %w", ns, err)
		}
	}
	return record{}, 0, fmt.Errorf("claiming namespace %s: its record keeps changing", ns)
}

// checkCluster refuses a namespace that exists without being this company's kubeclip tenant:
// Kubernetes' own, kubeclip's, Paperclip's, or any other a company might name to take over.
func (w *Worker) checkCluster(ctx context.Context, plan lease.Plan) error {
	ns, company := plan.Namespace, plan.Request.CompanyID
	obj, err := w.opts.Clientset.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return k8s.Meaning(k8s.OpRead, err)
	}
	l := obj.Labels
	if l[policy.LabelManagedBy] != policy.ManagedBy || l[policy.LabelCompanyID] != company {
		return refuse(plan, "namespace %s already exists and is not this company's kubeclip tenant", ns)
	}
	return nil // this company's tenant from before ownership records: adopt it
}

// countClaim adds the namespace to the company's index, refusing it when the company already
// holds as many namespaces as the operator allows.
func (w *Worker) countClaim(ctx context.Context, plan lease.Plan) error {
	ns, key := plan.Namespace, companyKey(plan.Request.CompanyID)
	limit := w.opts.Operator.MaxNamespacesPerCompany
	for range maxClaimAttempts {
		var idx companyRecord
		entry, err := w.tenants.Get(ctx, key)
		var rev uint64
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return fmt.Errorf("reading the namespaces of company %s: %w", plan.Request.CompanyID, err)
		default:
			rev = entry.Revision()
			if err := json.Unmarshal(entry.Value(), &idx); err != nil {
				return fmt.Errorf("decoding the namespaces of company %s: %w", plan.Request.CompanyID, err)
			}
		}
		if slices.Contains(idx.Namespaces, ns) {
			return nil
		}
		if len(idx.Namespaces) >= limit {
			return refuse(plan, "the company already has %d tenant namespaces (%s), the most this kubeclip installation allows; use one of them",
				len(idx.Namespaces), strings.Join(idx.Namespaces, ", "))
		}
		idx.Namespaces = append(idx.Namespaces, ns)
		data, err := json.Marshal(idx)
		if err != nil {
			return fmt.Errorf("encoding company record: %w", err)
		}
		if rev == 0 {
			_, err = w.tenants.Create(ctx, key, data)
		} else {
			_, err = w.tenants.Update(ctx, key, data, rev)
		}
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return fmt.Errorf("recording the namespaces of company %s: %w", plan.Request.CompanyID, err)
		}
	}
	return fmt.Errorf("recording the namespaces of company %s: the record keeps changing", plan.Request.CompanyID)
}

// refuse is the namespace_not_allowed failure, naming the config field that chose the name.
func refuse(plan lease.Plan, format string, args ...any) error {
	field := "config.namespacePrefix"
	if plan.Config.CompanySlug != "" {
		field = "config.companySlug"
	}
	return events.Terminalf(events.CodeNamespaceNotAllowed, field, format, args...)
}

// record returns what KUBECLIP_TENANTS says about ns, its revision, and whether it has an
// entry.
func (w *Worker) record(ctx context.Context, ns string) (record, uint64, bool, error) {
	return lease.ReadTenant(ctx, w.tenants, ns)
}
