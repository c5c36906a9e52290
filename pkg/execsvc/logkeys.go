package execsvc

// Log field keys beyond pkg/events' (run_id, tenant, namespace, code). Logs name the exec, its
// command's base name, sizes and exit status; never arguments, environment, stdin or output.
const (
	logKeyExecID   = "exec_id"
	logKeyCommand  = "command"
	logKeyOp       = "op"
	logKeyPod      = "pod"
	logKeyFromSeq  = "from_seq"
	logKeyOffset   = "offset"
	logKeyLastSeq  = "last_seq"
	logKeyExitCode = "exit_code"
	logKeySignal   = "signal"
	logKeyTimedOut = "timed_out"
	logKeyBytes    = "bytes"
	logKeyRoute    = "route"
	logKeyReplica  = "replica"
	logKeyDuration = "duration"
	// logKeyBudget names the budget that stopped a recording (events.BudgetKind), logKeyLimit
	// its size in bytes.
	logKeyBudget = "budget"
	logKeyLimit  = "limit_bytes"
	// logKeyEnvDropped names the environment keys the env policy dropped: names, never values.
	logKeyEnvDropped = "env_dropped"
)
