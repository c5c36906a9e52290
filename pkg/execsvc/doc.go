// Package execsvc is kubeclip's exec service: it runs the commands Paperclip (and the kubeclip
// CLI) send over core NATS in the pods of exec-capable leases, through the sandboxd daemon each
// such pod runs (pkg/sandboxd), and relays their output back (docs/exec.md, "NATS protocol").
//
// Every request is checked against the lease record of the company and run its subject names
// before anything reaches a pod. A replica serves an exec's stream from sandboxd's journal, so
// when it dies the client attaches through any other replica and continues from the seq it
// needs: no chunk is lost or repeated, and the exit arrives once. Nothing of a request (env,
// stdin, arguments) or of its output is logged, put in an error or a metric; recorded execs'
// output goes to the run stream only.
package execsvc
