package events

// Log field keys. Every component logs with these keys so one query finds a run across the
// tenant-worker, the dispatcher and the run-watcher. Payloads are never logged: an acquire's
// config may reference secrets.
const (
	LogKeyRunID     = "run_id"
	LogKeyTenant    = "tenant" // the Paperclip company id
	LogKeyNamespace = "namespace"
	LogKeySubject   = "subject"
	LogKeyMsgID     = "msg_id"
	LogKeyStream    = "stream"
	LogKeyConsumer  = "consumer"
	LogKeyStreamSeq = "stream_seq"
	LogKeyAttempt   = "attempt"
	LogKeyDelay     = "delay"
	LogKeyCode      = "code"
	LogKeyField     = "field"
	LogKeyStack     = "stack"
	LogKeyPanic     = "panic"
	LogKeySeq       = "seq"
)
