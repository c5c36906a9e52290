package sandboxd

// Log field keys. Logs name the exec, its command's base name, sizes, exit status and durations;
// never its arguments, environment, stdin or output, which carry the tenant's secrets and data.
const (
	LogKeyExecID      = "exec_id"
	LogKeyCommand     = "command"
	LogKeyPID         = "pid"
	LogKeyExitCode    = "exit_code"
	LogKeySignal      = "signal"
	LogKeyTimedOut    = "timed_out"
	LogKeyTruncated   = "truncated"
	LogKeyStdoutBytes = "stdout_bytes"
	LogKeyStderrBytes = "stderr_bytes"
	LogKeyDuration    = "duration"
	LogKeyExecError   = "exec_error" // why a command did not start: names a command or a path
	LogKeyRunning     = "running"
	LogKeyMethod      = "method"
	LogKeyRoute       = "route"
	LogKeyStatus      = "status"
	LogKeyAddr        = "addr"
	LogKeySocket      = "socket"
	LogKeyJournalDir  = "journal_dir"
	LogKeyUnbound     = "unbound"
	LogKeyEnvVars     = "env_vars" // how many variables a bind installed; never their values
)
