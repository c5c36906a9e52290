package tenant

import (
	"context"
	"errors"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/k8s"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// record is a namespace's KUBECLIP_TENANTS entry (lease.TenantRecord: the dispatcher checks
// ownership from it too). pkg/lease owns its reads and writes.
type record = lease.TenantRecord

// ownedRecord returns ns's record after making sure it belongs to the plan's company, claiming
// it when nobody has. A namespace of another company, one that exists in the cluster without
// being this company's tenant, or one over the company's cap is refused with
// namespace_not_allowed, before anything is applied.
func (w *Worker) ownedRecord(ctx context.Context, plan lease.Plan) (record, uint64, error) {
	ns := plan.Namespace
	var admitted error // checkCluster's or countClaim's, returned as is
	rec, rev, err := lease.ClaimTenant(ctx, w.tenants, ns, plan.Request.CompanyID, w.opts.Now(), func() error {
		admitted = w.checkCluster(ctx, plan)
		if admitted == nil {
			admitted = w.countClaim(ctx, plan)
		}
		return admitted
	})
	var tooMany *lease.TooManyTenantsError
	switch {
	case err == nil:
		return rec, rev, nil
	case errors.Is(err, lease.ErrTenantOfAnother):
		return record{}, 0, refuse(plan, "namespace %s belongs to another company", ns)
	case errors.As(err, &tooMany):
		return record{}, 0, refuse(plan, "the company already has %d tenant namespaces (%s), the most this kubeclip installation allows; use one of them",
			len(tooMany.Namespaces), strings.Join(tooMany.Namespaces, ", "))
	case admitted != nil && errors.Is(err, admitted):
		return record{}, 0, err
	}
	return record{}, 0, fmt.Errorf("claiming namespace %s: %w", ns, err)
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
// holds as many namespaces as the operator allows (lease.TooManyTenantsError).
func (w *Worker) countClaim(ctx context.Context, plan lease.Plan) error {
	return lease.CountTenant(ctx, w.tenants, plan.Request.CompanyID, plan.Namespace, w.opts.Operator.MaxNamespacesPerCompany)
}

// refuse is the namespace_not_allowed failure, naming the config field that chose the name.
func refuse(plan lease.Plan, format string, args ...any) error {
	field := "config.namespacePrefix"
	if plan.Config.CompanySlug != "" {
		field = "config.companySlug"
	}
	return events.Terminalf(events.CodeNamespaceNotAllowed, field, format, args...)
}
