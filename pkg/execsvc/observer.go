package execsvc

import (
	"time"

	"github.com/kubeclip/kubeclip/pkg/execproto"
)

// Observer is told what the service does, for metrics. Nothing it is told names a command's
// arguments, environment, stdin or output.
type Observer interface {
	// ExecRequest reports a request answered: with `started` (code "") or an `error`, and how
	// long that took (a start that waited for its pod included).
	ExecRequest(op execproto.Op, code execproto.Code, took time.Duration)
	// ExecSessions moves the number of exec streams being served by delta.
	ExecSessions(delta int)
	// ExecOutput reports output bytes relayed to a client.
	ExecOutput(bytes int)
	// ExecDropped reports a request dropped without an answer, and why (DropReplyNotInbox).
	ExecDropped(reason string)
	// ExecEnvDropped reports environment keys a start's env policy kept from the pod.
	ExecEnvDropped(keys int)
}

// Reasons of ExecDropped.
const (
	// DropReplyNotInbox: the request's reply subject is not a client's inbox (Options.Replies).
	DropReplyNotInbox = "reply_not_inbox"
)

type nopObserver struct{}

func (nopObserver) ExecRequest(execproto.Op, execproto.Code, time.Duration) {}
func (nopObserver) ExecSessions(int)                                        {}
func (nopObserver) ExecOutput(int)                                          {}
func (nopObserver) ExecDropped(string)                                      {}
func (nopObserver) ExecEnvDropped(int)                                      {}
