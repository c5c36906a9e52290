// Package policy holds kubeclip's pure decisions: the provider config (parse, defaults,
// validation), the adapter registry, the image allowlist, names and labels, and every Kubernetes
// object kubeclip renders for a tenant or a run.
//
// It is a port of Paperclip's TypeScript Kubernetes sandbox provider
// (packages/plugins/sandbox-providers/kubernetes: types.ts, adapter-defaults.ts, utils.ts,
// image-allowlist.ts, tenant-orchestrator.ts, network-policy.ts, cilium-network-policy.ts,
// scoped-network-egress.ts, secret-manager.ts, pod-spec-builder.ts, sandbox-cr-builder.ts,
// lease-expiry.ts). Where kubeclip deliberately behaves differently, the code says so in a
// comment that starts with "Deviation:".
//
// The package does no I/O: it never reads the environment, the clock or crypto/rand. Callers
// pass an env lookup function, the current time and a source of randomness. Applying the
// rendered objects is pkg/k8s's job.
package policy
