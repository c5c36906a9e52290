package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// EgressGrantPath is where a task-scoped egress grant lives in a lease request.
const EgressGrantPath = "executionWorkspaceSettings.networkEgress"

// Keys of the egress facts kubeclip adds to a run's env Secret (plugin.ts).
const (
	EnvEgressPolicy     = "PAPERCLIP_NETWORK_EGRESS_POLICY"
	EnvEgressGrantPath  = "PAPERCLIP_NETWORK_EGRESS_GRANT_PATH"
	EnvEgressAllowFqdns = "PAPERCLIP_NETWORK_EGRESS_ALLOW_FQDNS"
	EnvEgressAllowCidrs = "PAPERCLIP_NETWORK_EGRESS_ALLOW_CIDRS"
)

// EgressGrant is a run's task-scoped egress grant (scoped-network-egress.ts).
type EgressGrant struct {
	AllowFqdns []string `json:"allowFqdns"`
	AllowCidrs []string `json:"allowCidrs"`
}

// Empty reports whether the grant allows nothing, in which case no policy is rendered.
func (g EgressGrant) Empty() bool { return len(g.AllowFqdns) == 0 && len(g.AllowCidrs) == 0 }

// ParseEgressGrant reads `networkEgress.{allowFqdns,allowCidrs}` from a lease's
// executionWorkspaceSettings (parseScopedNetworkEgressGrant): entries are trimmed, empty ones
// dropped, duplicates dropped, FQDNs lower-cased. Absent or null settings, or settings without
// networkEgress, grant nothing. Other keys are ignored.
//
// Deviation: upstream validates nothing and silently ignores malformed parts. kubeclip
// rejects, in a *ValidationError with fields like
// `executionWorkspaceSettings.networkEgress.allowCidrs[1]` (indexes as written): settings or
// networkEgress that are not objects, lists that are not arrays of strings, invalid IPv4 CIDRs
// (as for egressAllowCidrs) and invalid DNS names (as for egressAllowFqdns).
func ParseEgressGrant(executionWorkspaceSettings json.RawMessage) (EgressGrant, error) {
	grant := EgressGrant{AllowFqdns: []string{}, AllowCidrs: []string{}}
	var errs fieldErrors
	const root = "executionWorkspaceSettings"
	if len(bytes.TrimSpace(executionWorkspaceSettings)) == 0 {
		return grant, nil
	}
	doc, ok := decodeJSON(executionWorkspaceSettings, root, root, &errs)
	if !ok {
		return EgressGrant{}, errs.err()
	}
	if doc == nil { // JSON null: no settings
		return grant, nil
	}
	settings, ok := doc.(map[string]any)
	if !ok {
		errs.add(root, "expected an object, got "+jsonKind(doc))
		return EgressGrant{}, errs.err()
	}
	ne, present := settings["networkEgress"]
	if !present || ne == nil {
		return grant, nil
	}
	obj, ok := ne.(map[string]any)
	if !ok {
		errs.add(EgressGrantPath, "expected an object, got "+jsonKind(ne))
		return EgressGrant{}, errs.err()
	}
	grant.AllowFqdns = grantList(obj, "allowFqdns", &errs, func(s string) (string, string) {
		s = strings.ToLower(s)
		return s, checkFQDN(s)
	})
	grant.AllowCidrs = grantList(obj, "allowCidrs", &errs, func(s string) (string, string) {
		return s, checkIPv4CIDR(s)
	})
	if err := errs.err(); err != nil {
		return EgressGrant{}, err
	}
	return grant, nil
}

func grantList(obj map[string]any, key string, errs *fieldErrors, check func(string) (string, string)) []string {
	out := []string{}
	path := EgressGrantPath + "." + key
	v, present := obj[key]
	if !present || v == nil {
		return out
	}
	arr, ok := v.([]any)
	if !ok {
		errs.add(path, "expected an array of strings, got "+jsonKind(v))
		return out
	}
	if !withinBound(errs, path, len(arr), MaxEgressEntries) {
		return out
	}
	for i, ev := range arr {
		s, ok := ev.(string)
		if !ok {
			errs.add(indexPath(path, i), "expected a string, got "+jsonKind(ev))
			continue
		}
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		s, msg := check(s)
		if msg != "" {
			errs.add(indexPath(path, i), msg)
			continue
		}
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

// EgressGrantEnv is the egress part of a run's env Secret, telling the agent what it may reach
// and where to ask for more.
func EgressGrantEnv(g EgressGrant) map[string]string {
	return map[string]string{
		EnvEgressPolicy:     "kubernetes-default-deny",
		EnvEgressGrantPath:  EgressGrantPath,
		EnvEgressAllowFqdns: strings.Join(g.AllowFqdns, ","),
		EnvEgressAllowCidrs: strings.Join(g.AllowCidrs, ","),
	}
}

// RenderScopedEgress renders a run's task-scoped egress policy, `<workload>-egress`, or nil for
// an empty grant. It selects the run's pods by paperclip.io/run-id, has no DNS or server rules
// (the tenant policy has them), and is owned (not controlled) by the workload so it goes with
// it. Standard mode: a NetworkPolicy with one rule per CIDR, or public IPv4 on 80/443 when only
// FQDNs are granted. Cilium mode: a CiliumNetworkPolicy with toFQDNs and toCIDRSet. A pod
// wired to the credential broker (spec.Broker) is never granted a bound host directly: the
// grant's FQDNs lose them as the tenant's do (RenderTenant), and a grant of bound hosts alone
// renders no policy.
func RenderScopedEgress(spec RunSpec, grant EgressGrant, owner metav1.OwnerReference) (*unstructured.Unstructured, error) {
	grant.AllowFqdns = spec.Broker.unbound(grant.AllowFqdns)
	if grant.Empty() {
		return nil, nil
	}
	if owner.UID == "" {
		return nil, errors.New("rendering scoped egress policy: the owner reference needs the workload's uid")
	}
	owner.Controller = ptrTo(false)
	owner.BlockOwnerDeletion = ptrTo(false)
	in := egressInput{
		namespace: spec.Namespace,
		name:      ScopedEgressPolicyName(spec.WorkloadName),
		selector:  map[string]string{LabelRunID: spec.RunID},
		fqdns:     slices.Clone(grant.AllowFqdns),
		cidrs:     slices.Clone(grant.AllowCidrs),
		owner:     &owner,
	}
	if spec.Config.EgressMode == EgressCilium {
		return ciliumPolicy(in), nil
	}
	return toUnstructured(egressNetworkPolicy(in))
}
