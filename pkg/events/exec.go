package events

import (
	"fmt"
	"time"

	"github.com/kubeclip/kubeclip/pkg/execspec"
)

// Streams of a recorded exec's output chunk (RunExecEvent.Stream).
const (
	ExecStdout = "stdout"
	ExecStderr = "stderr"
)

// RunExecEvent is a recorded exec's output, coalesced, or, with Exit set, how it ended:
// <prefix>.run.<c>.<r>.exec. Recorded execs are the ones a client started with `record: true`
// (the Paperclip plugin's agent command); uploads and bridge polls are never recorded.
//
// Seq is the seq in sandboxd's journal of the exec (1, 2, … across stdout and stderr) of the
// last chunk the event holds: consecutive chunks of one stream are coalesced into one event, so
// seqs rise with gaps. The final event has the exec's last seq plus one. The message id is
// <companyId>.<runId>.exec.<execId>.<seq>, so an exec-worker that takes a stream over from a
// replica that died republishes what it cannot know was stored, and the stream keeps one copy.
type RunExecEvent struct {
	RunID     string    `json:"runId"`
	CompanyID string    `json:"companyId"`
	At        time.Time `json:"at"`
	ExecID    string    `json:"execId"`
	Seq       uint64    `json:"seq"`
	// Command is the base name of the command (never its arguments, environment or stdin).
	Command string `json:"command"`
	// Stream is ExecStdout or ExecStderr; empty on the final event.
	Stream string `json:"stream,omitempty"`
	// Text is the chunk as UTF-8. A character split between two chunks of a stream is carried
	// whole in the later one; bytes that are not UTF-8 are replaced with U+FFFD.
	Text string `json:"text,omitempty"`
	// Exit is set on the final event only.
	Exit *ExecExit `json:"exit,omitempty"`
	// RecordingStopped names the budget that stopped the recording (BudgetExec, BudgetRun,
	// BudgetCompany): set on the event at the first chunk not recorded (its Text empty) and on
	// the final event. The exec itself runs on; its client still receives all of its output.
	RecordingStopped BudgetKind `json:"recordingStopped,omitempty"`
	// Agent is the agent's stream-json result parsed from the exec's whole stdout (pkg/streamjson),
	// on the final event of an exec whose stdout had stream-json in it.
	Agent *AgentResult `json:"agent,omitempty"`
}

// ExecExit is how a recorded exec ended: sandboxd's exit frame, without its byte counts.
type ExecExit struct {
	// ExitCode is nil when the command was killed by a signal (a timeout too) or never ran.
	ExitCode *int `json:"exitCode"`
	// Signal is the signal's name ("SIGKILL") when one ended the command, else nil.
	Signal   *string `json:"signal"`
	TimedOut bool    `json:"timedOut"`
	// Truncated: the command wrote more than its journal's cap; events stop at the cap.
	Truncated bool `json:"truncated,omitempty"`
}

// ExecEventMsgID is the message id of a recorded exec's event: <companyId>.<runId>.exec.<execId>.<seq>.
func ExecEventMsgID(ref RunRef, execID string, seq uint64) string {
	return ref.MsgID(fmt.Sprintf("exec.%s.%d", execID, seq))
}

// Type implements Event.
func (RunExecEvent) Type() string { return runType(KindExec) }

// IDs implements Event.
func (e RunExecEvent) IDs() (string, string) { return e.CompanyID, e.RunID }

func (e RunExecEvent) address(s Subjects) (address, error) {
	if !execspec.ValidID(e.ExecID) {
		return address{}, InvalidRequest("execId", "must be %s", execspec.IDRule)
	}
	if e.Seq == 0 {
		return address{}, InvalidRequest("seq", "must be at least 1")
	}
	if e.Command == "" {
		return address{}, InvalidRequest("command", "must not be empty")
	}
	switch {
	case e.Exit == nil && e.Stream != ExecStdout && e.Stream != ExecStderr:
		return address{}, InvalidRequest("stream", "must be stdout or stderr, got %q", truncate(e.Stream, 16))
	case e.Exit != nil && (e.Stream != "" || e.Text != ""):
		return address{}, InvalidRequest("stream", "must be empty on the final event")
	case e.RecordingStopped != "" && !e.RecordingStopped.valid():
		return address{}, InvalidRequest("recordingStopped", "must be exec, run or company, got %q", truncate(string(e.RecordingStopped), 16))
	}
	return runAddress(s, e.CompanyID, e.RunID, KindExec, ExecEventMsgID(Ref(e.CompanyID, e.RunID), e.ExecID, e.Seq), 0)
}

func (e RunExecEvent) stamp(now time.Time) Event { e.At = stampTime(e.At, now); return e }
func (e RunExecEvent) eventTime() time.Time      { return e.At }
