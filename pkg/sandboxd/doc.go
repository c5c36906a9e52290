// Package sandboxd runs commands inside an exec-capable agent pod for kubeclip's exec service.
//
// The daemon (Server) is PID 1 of the pod. It starts each command in its own process group,
// journals every read of the command's stdout and stderr as a numbered chunk on disk, and serves
// the journal as a stream of frames, so a client that lost its connection resumes from the last
// chunk it holds with no gap and no duplicate. It reaps every orphan of the pod (Reaper) and
// drains on SIGTERM. Client speaks the same HTTP/1.1 API over any byte stream: TCP with TLS
// pinned to the lease's key (keys.go), or the Kubernetes exec API through `sandboxd proxy`,
// which bridges stdin/stdout to the daemon's unix socket. A warm pod's daemon starts unbound,
// keyed by the pod's bind seed, and serves nothing until Bind installs a lease's seed and
// environment (bind.go).
//
// docs/exec.md is the contract this package implements.
package sandboxd
