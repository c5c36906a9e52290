package lease

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// decided is what New decided of a plan, as it travels with the dispatch: everything but the
// request (the dispatch carries it), the deadline (a matter of when, leaseDeadline) and the
// operator's policy (each worker has its own, and the dispatcher's names the adapter keys it
// copies into the run's Secret).
type decided struct {
	Config      policy.Config          `json:"config"`
	AdapterType string                 `json:"adapterType"`
	Adapter     policy.AdapterDefaults `json:"adapter"`
	Image       string                 `json:"image"`
	Namespace   string                 `json:"namespace"`
	Grant       policy.EgressGrant     `json:"grant"`
}

// Encode is the plan's decisions for the dispatch (events.DispatchRequest.Plan).
func (p Plan) Encode() (json.RawMessage, error) {
	data, err := json.Marshal(decided{
		Config: p.Config, AdapterType: p.AdapterType, Adapter: p.Adapter,
		Image: p.Image, Namespace: p.Namespace, Grant: p.Grant,
	})
	if err != nil {
		return nil, fmt.Errorf("encoding the plan of run %s: %w", p.Request.RunID, err)
	}
	return data, nil
}

// Decode is the plan the tenant-worker decided for req (Encode), as the dispatcher takes it:
// trusted, not derived again. Only the tenant-worker's NATS user may publish a dispatch, and
// the dispatcher checks the namespace against the tenant record. The provider config is not
// parsed here and no operator bound is checked again: a change to a rule is made in New alone.
// What is computed is the deadline, from the same inputs at now (leaseDeadline); op is the
// dispatcher's own policy, for what it renders (pull policy, the broker's wiring, adapter keys).
func Decode(req events.AcquireRequest, data json.RawMessage, now time.Time, op policy.Operator) (Plan, error) {
	var d decided
	if err := json.Unmarshal(data, &d); err != nil {
		return Plan{}, events.Terminalf(events.CodeInternal, "plan", "the dispatch of run %s carries a plan that does not decode: %v", req.RunID, err)
	}
	if d.Namespace == "" || d.Image == "" || d.Config.Backend == "" {
		return Plan{}, events.Terminalf(events.CodeInternal, "plan", "the dispatch of run %s carries an incomplete plan (namespace %q, image %q, backend %q)", req.RunID, d.Namespace, d.Image, d.Config.Backend)
	}
	deadline, err := leaseDeadline(req, d.Config, now)
	if err != nil {
		return Plan{}, err
	}
	return Plan{
		Request: req, Config: d.Config, AdapterType: d.AdapterType, Adapter: d.Adapter,
		Image: d.Image, Namespace: d.Namespace, Grant: d.Grant, Deadline: deadline, Operator: op.WithDefaults(),
	}, nil
}
