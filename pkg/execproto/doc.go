// Package execproto is the wire format of kubeclip's exec protocol on core NATS (docs/exec.md,
// "NATS protocol"): the subjects, the request and inbox message types, the headers, the error
// codes and the limits both sides keep. The exec-worker (pkg/execsvc) and the Go client
// (pkg/execclient) share it; the Paperclip plugin implements the same protocol in TypeScript
// from the document, and the JSON Schemas in docs/schemas/exec-*.json are checked against these
// types.
package execproto
