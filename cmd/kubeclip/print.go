package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// printer writes run events for a person to read.
type printer struct {
	w io.Writer
}

func (p printer) print(r events.Received) {
	switch ev := r.Event.(type) {
	case events.RunCreatedEvent:
		p.line("created", "lease %s: %s %s/%s (Secret %s)", ev.ProviderLeaseID, ev.Backend, ev.Namespace, ev.WorkloadName, ev.SecretName)
	case events.RunStatusEvent:
		detail := ""
		if ev.Reason != "" {
			detail = " " + ev.Reason
		}
		if ev.Message != "" {
			detail += ": " + ev.Message
		}
		pod := ""
		if ev.PodName != "" {
			pod = " (pod " + ev.PodName + ")"
		}
		p.line("status", "%s%s%s", ev.Phase, detail, pod)
	case events.RunLogEvent:
		if ev.LogStopped != "" {
			p.line(fmt.Sprintf("log %d", ev.Seq), "log stopped: the %s budget is used up (docs/security.md, Budgets)", ev.LogStopped)
		}
		for _, l := range ev.Lines {
			ts := l.TS
			if t, err := time.Parse(time.RFC3339Nano, l.TS); err == nil {
				ts = t.Format("15:04:05.000")
			}
			p.line(fmt.Sprintf("log %d", ev.Seq), "%s  %s", ts, l.Text)
		}
	case events.RunResultEvent:
		exit := ""
		if ev.ExitCode != nil {
			exit = fmt.Sprintf(" exit=%d", *ev.ExitCode)
		}
		reason := ""
		if ev.Reason != "" {
			reason = " reason=" + ev.Reason
		}
		p.line("result", "%s%s%s", ev.Outcome, exit, reason)
		if a := ev.Agent; a != nil {
			parts := []string{"session=" + a.SessionID, "model=" + a.Model}
			if a.Usage != nil {
				parts = append(parts, fmt.Sprintf("tokens in/out/cached=%d/%d/%d", a.Usage.InputTokens, a.Usage.OutputTokens, a.Usage.CachedInputTokens))
			}
			if a.CostUSD != nil {
				parts = append(parts, fmt.Sprintf("cost=$%.4f", *a.CostUSD))
			}
			if a.IsError {
				parts = append(parts, "isError=true errorCode="+a.ErrorCode)
			}
			p.line("agent", "%s", strings.Join(parts, " "))
			if a.Summary != "" {
				p.line("summary", "%s", a.Summary)
			}
		}
	case events.RunReleasedEvent:
		if ev.Unknown {
			p.line("released", "lease %s %s: the company has no such lease; nothing was ended", ev.ProviderLeaseID, ev.State)
			break
		}
		p.line("released", "lease %s %s", ev.ProviderLeaseID, ev.State)
	case events.RunSuspendedEvent:
		p.line("suspended", "lease %s: pod of generation %d deleted, volume %s kept", ev.ProviderLeaseID, ev.Generation, ev.VolumeClaim)
	case events.RunResumedEvent:
		p.line("resumed", "lease %s from %s: generation %d, resume %d", ev.ProviderLeaseID, ev.From, ev.Generation, ev.Resumes)
	case events.RunExecEvent:
		p.exec(ev)
	case events.RunUsageEvent:
		for _, u := range ev.Usage {
			unmetered := ""
			for _, outcome := range slices.Sorted(maps.Keys(u.Unmetered)) {
				unmetered += fmt.Sprintf(" unmetered %s=%d", outcome, u.Unmetered[outcome])
			}
			p.line("usage", "%s %s %s: calls=%d tokens in/out/cache read/cache write=%d/%d/%d/%d%s", u.Key, u.Host, u.Format,
				u.Calls, u.InputTokens, u.OutputTokens, u.CacheReadTokens, u.CacheWriteTokens, unmetered)
		}
	case events.RunFailedEvent:
		field := ""
		if ev.Field != "" {
			field = " field=" + ev.Field
		}
		p.line("failed", "%s%s: %s", ev.Code, field, ev.Message)
	}
}

// exec prints a recorded exec's chunk line by line, or how it ended.
func (p printer) exec(ev events.RunExecEvent) {
	if e := ev.Exit; e != nil {
		how := "exit=?"
		switch {
		case e.TimedOut:
			how = "timed out"
		case e.Signal != nil:
			how = "signal=" + *e.Signal
		case e.ExitCode != nil:
			how = fmt.Sprintf("exit=%d", *e.ExitCode)
		}
		p.line("exec", "%s %s %s", ev.ExecID, ev.Command, how)
		return
	}
	if ev.RecordingStopped != "" {
		p.line("exec", "%s %s recording stopped: the %s budget is used up (docs/security.md, Budgets)", ev.ExecID, ev.Command, ev.RecordingStopped)
		return
	}
	for _, l := range strings.Split(strings.TrimSuffix(ev.Text, "\n"), "\n") {
		p.line("exec "+ev.Stream, "%s  %s", ev.Command, l)
	}
}

func (p printer) line(tag, format string, args ...any) {
	fmt.Fprintf(p.w, "%-9s %s\n", "["+tag+"]", fmt.Sprintf(format, args...))
}
