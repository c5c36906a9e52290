package k8s

// Field keys of this package's log records. They match the keys the workers use (run_id,
// namespace, attempt, ...), so records join up in one query.
const (
	logKeyNamespace = "namespace"
	logKeyPod       = "pod"
	logKeyContainer = "container"
	logKeyAttempt   = "attempt"
	logKeyBackoff   = "backoff"
	logKeyError     = "error"
)
