// Package broker is the credential broker's core: grants, their placeholders and the store
// every broker replica shares (docs: issue 27). A pod gets a placeholder (Placeholder) instead
// of a brokered key's value; the real value is sealed into a grant in the KUBECLIP_GRANTS KV
// bucket (Store), bound to the lease, the hosts and headers it may go to, and the pod's IP; each
// replica keeps the bucket in memory (Cache) and resolves a placeholder there on the way to a
// bound host (Resolve), refusing it for one of the reasons of one table (Reason). The TLS
// proxy that does the swapping is pkg/broker/proxy; the CA its certificates come from is
// pkg/broker/ca.
//
// Secrets (real values, placeholders' secret parts, the sealing key) never appear in logs,
// errors, metrics or events: Placeholder and Secret print redacted, and errors name fields,
// never their values.
package broker
