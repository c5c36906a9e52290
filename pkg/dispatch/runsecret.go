package dispatch

import (
	"context"
	"encoding/hex"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubeclip/kubeclip/pkg/broker/mintclient"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execspec"
	"github.com/kubeclip/kubeclip/pkg/k8s"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
	"github.com/kubeclip/kubeclip/pkg/workload"
)

// adapterSecretTTL is how long the adapter key Secret is cached: key rotation shows up within a
// minute without a GET per acquire.
const adapterSecretTTL = 30 * time.Second

// renderSecret renders the run's Secret: bootstrap token, adapter API keys from the dispatcher's
// own environment or its adapter Secret, the adapter's default env and the egress grant env.
// The owner reference is set by workload.Created.AdoptSecret once the workload has a UID.
func (d *Dispatcher) renderSecret(ctx context.Context, plan lease.Plan, spec policy.RunSpec, w workload.Workload) (*corev1.Secret, error) {
	lookup, err := d.adapterKeys(ctx)
	if err != nil {
		return nil, err
	}
	env := policy.BuildAdapterEnv(plan.Adapter, lookup)
	for k, v := range policy.EgressGrantEnv(plan.Grant) {
		env[k] = v
	}
	if env, err = d.placeholders(ctx, plan, spec, env); err != nil {
		return nil, err
	}
	if w.Backend().ExecCapable() {
		// sandboxd's key for this lease; the exec-worker derives the same from the master key.
		// Only the pod's init container reads it (not the agent container's environment).
		env[execspec.SeedEnv] = hex.EncodeToString(execspec.DeriveSeed(d.opts.SandboxKey, spec.Namespace, spec.WorkloadName))
	}
	token, err := policy.NewBootstrapToken(d.opts.Random)
	if err != nil {
		return nil, err
	}
	placeholder := policy.OwnerReference("batch/v1", "Job", spec.WorkloadName, "set-on-create")
	secret, err := policy.RenderSecret(spec, placeholder, token, env)
	if err != nil {
		return nil, events.Terminal(events.CodeInvalidConfig, "config.adapters", err)
	}
	return secret, nil
}

// Minter mints a lease's placeholders: env with each brokered key's value replaced by its
// placeholder, or an error naming the key (pkg/broker/mintclient.Client).
type Minter interface {
	Placeholders(ctx context.Context, lease mintclient.Lease, keys []string, env map[string]string) (map[string]string, error)
}

var _ Minter = (*mintclient.Client)(nil)

// placeholders replaces the brokered keys' values in a run Secret's env with the lease's
// placeholders (issue 27), so the Secret, the pod's environment and a warm pod's bind (which
// sends the Secret's keys) carry placeholders only. It runs before anything of the run is
// created, so a broker that does not answer or refuses fails the dispatch with nothing to
// undo; what the failure means is mintclient.Meaning's to say. The mint is idempotent per
// lease and key, so a redelivered dispatch renders the same Secret.
func (d *Dispatcher) placeholders(ctx context.Context, plan lease.Plan, spec policy.RunSpec, env map[string]string) (map[string]string, error) {
	if len(d.opts.BrokeredKeys) == 0 {
		return env, nil
	}
	ref := mintclient.Lease{CompanyID: plan.Request.CompanyID, RunID: plan.Request.RunID, LeaseID: spec.WorkloadName}
	out, err := d.opts.Minter.Placeholders(ctx, ref, d.opts.BrokeredKeys, env)
	if err != nil {
		return nil, mintclient.Meaning(err)
	}
	return out, nil
}

// adapterKeys returns the lookup for adapter API keys: the adapter Secret's keys first, then
// the dispatcher's environment.
func (d *Dispatcher) adapterKeys(ctx context.Context) (func(string) (string, bool), error) {
	if d.opts.AdapterSecret.Name == "" {
		return d.opts.LookupEnv, nil
	}
	d.secretMu.Lock()
	defer d.secretMu.Unlock()
	if d.secretValues == nil || d.opts.Now().Sub(d.secretFetched) > adapterSecretTTL {
		// Optional: a missing Secret means no keys from it, not a stuck dispatcher.
		values, err := k8s.SecretValues(ctx, d.opts.Clientset, d.opts.AdapterSecret)
		if err != nil {
			return nil, err
		}
		d.secretValues, d.secretFetched = values, d.opts.Now()
	}
	values := d.secretValues
	return func(k string) (string, bool) {
		if v, ok := values[k]; ok && v != "" {
			return v, true
		}
		return d.opts.LookupEnv(k)
	}, nil
}
