// Package events is kubeclip's public event contract, with the JetStream plumbing beside it.
//
// The contract: the subjects and their parsers, the payload types Paperclip and kubeclip
// exchange (the contract's own types), the CloudEvents headers and message ids every message
// carries, the failure codes and the terminal error that carries one, strict decoding, and the
// JSON Schemas in docs/schemas. docs/contract.md describes it for consumers in other languages.
//
// The plumbing: the settings of the contract's streams and of every durable consumer, the
// Publisher, Follow, and the consume loop with the one classifier that decides each message's
// fate (Consume). KV buckets belong to their owners (pkg/lease, pkg/dispatch, pkg/runwatch,
// pkg/execsvc); the development nats-server is internal/embeddednats.
//
// The package does NATS I/O only; it never talks to Kubernetes.
package events
