// Package events is kubeclip's public event contract and its JetStream plumbing.
//
// It holds the subjects and their parsers, the payload types Paperclip and kubeclip exchange,
// the CloudEvents headers and message ids every message carries, the settings of every stream,
// KV bucket and durable consumer, the Publisher, the consume loop with the one classifier that
// decides each message's fate (Consume). docs/events.md describes the
// contract for consumers in other languages.
//
// The package does NATS I/O only; it never talks to Kubernetes.
package events
