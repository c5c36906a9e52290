// Package lease turns an acquire request into a plan: the validated provider config, the run's
// adapter, image, tenant namespace, egress grant and deadline. The plan is decided once, by the
// tenant-worker where the acquire is accepted (New), and travels to the dispatcher with the
// dispatch (Plan.Encode, Decode), which never derives it again; every refusal is an
// events.TerminalError carrying the failed-event code and the offending field.
package lease

import (
	"errors"
	"strings"
	"time"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// Plan is everything an acquire decides before anything is created.
type Plan struct {
	Request     events.AcquireRequest
	Config      policy.Config
	AdapterType string
	Adapter     policy.AdapterDefaults
	Image       string
	Namespace   string
	Grant       policy.EgressGrant
	// Deadline bounds the lease when the request asked for an expiry; nil otherwise.
	Deadline *policy.LeaseDeadline
	// Operator is the installation's policy the plan was checked against.
	Operator policy.Operator
}

// New validates req against the operator's policy and derives its plan. now bounds a requested
// expiry.
func New(req events.AcquireRequest, now time.Time, op policy.Operator) (Plan, error) {
	op = op.WithDefaults()
	if err := req.Validate(); err != nil {
		return Plan{}, err
	}
	cfg, err := policy.ParseConfig(req.Config)
	if err != nil {
		return Plan{}, fieldError(events.CodeInvalidConfig, "config.", err)
	}
	// The operator's bounds: adapter keys (from the worker's environment) only the adapter's
	// own, egress only to the public internet, runtime class and ServiceAccount annotations only
	// as the operator allows.
	if err := op.CheckConfig(cfg); err != nil {
		return Plan{}, fieldError(events.CodeInvalidConfig, "config.", err)
	}
	cfg.RuntimeClassName = op.RuntimeClass(cfg)
	adapterType, err := policy.ResolveRunAdapterType(req.AdapterType, cfg)
	if err != nil {
		return Plan{}, adapterError(err)
	}
	adapter, err := cfg.Adapter(adapterType)
	if err != nil {
		return Plan{}, adapterError(err)
	}
	image, err := op.ResolveImage("", adapter, cfg)
	if err != nil {
		return Plan{}, imageError(err)
	}
	ns, err := policy.TenantNamespace(cfg, req.CompanyID)
	if err != nil {
		return Plan{}, namespaceError(err)
	}
	if err := op.CheckNamespace(cfg, ns); err != nil {
		return Plan{}, fieldError(events.CodeNamespaceNotAllowed, "config.", err)
	}
	grant, err := policy.ParseEgressGrant(req.ExecutionWorkspaceSettings)
	if err == nil {
		err = op.CheckEgressGrant(grant)
	}
	if err != nil {
		return Plan{}, fieldError(events.CodeInvalidRequest, "", err)
	}
	deadline, err := leaseDeadline(req, cfg, now)
	if err != nil {
		return Plan{}, err
	}
	p := Plan{
		Request: req, Config: cfg, AdapterType: adapterType, Adapter: adapter,
		Image: image, Namespace: ns, Grant: grant, Deadline: deadline, Operator: op,
	}
	// The ids become label values on every object of the run: refuse them now, not halfway.
	if err := p.RunSpec("pc-validation").Validate(); err != nil {
		return Plan{}, fieldError(events.CodeInvalidRequest, "", err)
	}
	return p, nil
}

// leaseDeadline is the lease's hard stop seen from now: the expiry the request asked for,
// bounded, or an exec-capable lease's activity deadline. The one rule for both the plan's
// decision (New) and its dispatch (Decode): a deadline counts from the moment it is computed,
// and a dispatch may come long after the acquire (an acquire parked behind its agent's run), so
// the dispatcher computes it again from the same inputs at its own now.
func leaseDeadline(req events.AcquireRequest, cfg policy.Config, now time.Time) (*policy.LeaseDeadline, error) {
	deadline, err := policy.ComputeBoundedLeaseDeadline(req.RequestedExpiresAt, now)
	if err != nil {
		return nil, events.Terminal(events.CodeInvalidRequest, "requestedExpiresAt", err)
	}
	if deadline == nil && cfg.Backend.ExecCapable() {
		// An exec-capable lease is a pod that lives until it is released, at most its
		// activity deadline: that is its real expiry, and Paperclip is told so.
		deadline = &policy.LeaseDeadline{
			ActiveDeadlineSeconds: cfg.PodActivityDeadlineSec,
			HardStopAt:            now.Truncate(time.Second).Add(time.Duration(cfg.PodActivityDeadlineSec) * time.Second).UTC(),
		}
	}
	return deadline, nil
}

// Tenant renders the tenant objects the plan's run needs. The egress allow-list covers the
// config's default adapter as well as the run's, so a per-run adapter override adds to the
// tenant's policy instead of making it flap between adapters.
func (p Plan) Tenant() (policy.Tenant, error) {
	adapters := []policy.AdapterDefaults{p.Adapter}
	if p.Config.AdapterType != p.AdapterType {
		if def, err := p.Config.Adapter(p.Config.AdapterType); err == nil {
			adapters = append([]policy.AdapterDefaults{def}, adapters...)
		}
	}
	t, err := policy.RenderTenant(p.Config, p.Request.CompanyID, p.Operator, adapters...)
	if err != nil {
		return policy.Tenant{}, fieldError(events.CodeInvalidConfig, "config.", err)
	}
	return t, nil
}

// RunSpec is the spec of the run's workload under the given name.
func (p Plan) RunSpec(workloadName string) policy.RunSpec {
	spec := policy.RunSpec{
		RunID:        p.Request.RunID,
		CompanyID:    p.Request.CompanyID,
		AgentID:      p.Request.AgentID,
		IssueID:      p.Request.IssueID,
		AdapterType:  p.AdapterType,
		Namespace:    p.Namespace,
		WorkloadName: workloadName,
		Image:        p.Image,
		// Pulled every time unless the nodes hold it preloaded: the registry then checks this
		// pod's credentials, not another company's that brought the image to the node.
		ImagePullPolicy: p.Operator.PullPolicy(p.Image),
		Config:          p.Config,
		// Every pod of the installation is wired to the credential broker alike, when the
		// operator deployed one: the tenant-worker applied its CA with the tenant.
		Broker: p.Operator.Broker,
	}
	if p.Deadline != nil {
		secs := p.Deadline.ActiveDeadlineSeconds
		spec.ActiveDeadlineSeconds = &secs
	}
	return spec
}

// RunDeadline is how long from the acquire the lease's hard stop is (0: none).
func (p Plan) RunDeadline() time.Duration {
	if p.Deadline == nil {
		return 0
	}
	return time.Duration(p.Deadline.ActiveDeadlineSeconds) * time.Second
}

// ExpiresAt is the lease's hard stop, when it has one.
func (p Plan) ExpiresAt() *time.Time {
	if p.Deadline == nil {
		return nil
	}
	t := p.Deadline.HardStopAt
	return &t
}

// fieldError turns a policy validation error into a TerminalError whose field is the first
// failing field, prefixed to say where in the request it sits ("config.").
func fieldError(code events.Code, prefix string, err error) error {
	var ve *policy.ValidationError
	if !errors.As(err, &ve) || len(ve.Errors) == 0 {
		return events.Terminal(code, strings.TrimSuffix(prefix, "."), err)
	}
	parts := make([]string, len(ve.Errors))
	for i, fe := range ve.Errors {
		parts[i] = prefix + fe.Field + ": " + fe.Message
	}
	// The field goes in front of the message by itself; keep the first one out of the list.
	first := prefix + ve.Errors[0].Field
	msg := strings.TrimPrefix(strings.Join(parts, "; "), first+": ")
	return events.Terminal(code, first, errors.New(msg))
}

// imageError names the config field that chose a refused image: imageAllowList when the
// company's own list refused it, else where the image came from.
func imageError(err error) error {
	var ine *policy.ImageNotAllowedError
	if errors.As(err, &ine) {
		return events.Terminal(events.CodeImageNotAllowed, "config."+ine.Field, err)
	}
	return fieldError(events.CodeInvalidConfig, "config.", err)
}

func adapterError(err error) error {
	if errors.Is(err, policy.ErrUnknownAdapter) {
		return events.Terminal(events.CodeUnknownAdapter, "adapterType", err)
	}
	return fieldError(events.CodeInvalidConfig, "config.", err)
}

// namespaceError names the request field a bad tenant namespace comes from.
func namespaceError(err error) error {
	var ve *policy.ValidationError
	if errors.As(err, &ve) && len(ve.Errors) > 0 && ve.Errors[0].Field == "companyId" {
		return fieldError(events.CodeInvalidRequest, "", err)
	}
	return fieldError(events.CodeInvalidConfig, "config.", err)
}
