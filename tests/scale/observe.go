package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// runs records, per run, when the bench received its created, running and ready events, how many
// created events it got (more than one is a doubled lease), its log lines, and any failed or
// result event (a live lease must have neither). One ordered consumer reads every run event, as a
// Paperclip consumer would.
type runs struct {
	mu      sync.Mutex
	byID    map[string]*runSeen
	changed chan struct{}
}

type runSeen struct {
	published time.Time
	created   time.Time
	// running is the first status with phase Running (a Job lease's: it has no Ready); ready
	// the first Running/Ready (an exec-capable lease's).
	running time.Time
	ready   time.Time
	creates int
	ended   string // the failed or result event's kind and detail
	// logLines are the texts of the run's log events in order; logSeq the last event's Seq, and
	// logOutOfOrder whether an event came with another Seq than the next (doubled or lost).
	logLines      []string
	logSeq        uint64
	logOutOfOrder bool
}

func watchRuns(ctx context.Context, js jetstream.JetStream, s events.Subjects) (*runs, error) {
	cons, err := js.OrderedConsumer(ctx, s.RunStream(), jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{s.RunAll()}, DeliverPolicy: jetstream.DeliverNewPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("creating the run event consumer: %w", err)
	}
	it, err := cons.Messages()
	if err != nil {
		return nil, fmt.Errorf("reading run events: %w", err)
	}
	r := &runs{byID: map[string]*runSeen{}, changed: make(chan struct{})}
	go func() {
		defer it.Stop()
		for {
			m, err := it.Next(jetstream.NextContext(ctx))
			if err != nil {
				return // ctx done; the bench's waits report what is missing
			}
			if ev, err := s.DecodeRunEvent(m.Subject(), m.Data()); err == nil {
				r.record(ev, time.Now())
			}
		}
	}()
	return r, nil
}

func (r *runs) published(runID string, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seenLocked(runID).published = at
}

func (r *runs) seenLocked(runID string) *runSeen {
	s, ok := r.byID[runID]
	if !ok {
		s = &runSeen{}
		r.byID[runID] = s
	}
	return s
}

func (r *runs) record(ev events.Event, at time.Time) {
	_, runID := ev.IDs()
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.seenLocked(runID)
	switch e := ev.(type) {
	case events.RunCreatedEvent:
		s.creates++
		if s.created.IsZero() {
			s.created = at
		}
	case events.RunStatusEvent:
		if e.Phase == events.PhaseRunning && s.running.IsZero() {
			s.running = at
		}
		if e.Phase == events.PhaseRunning && e.Reason == events.ReasonReady && s.ready.IsZero() {
			s.ready = at
		}
	case events.RunLogEvent:
		if e.Seq != s.logSeq+1 {
			s.logOutOfOrder = true
		}
		s.logSeq = max(s.logSeq, e.Seq)
		for _, l := range e.Lines {
			s.logLines = append(s.logLines, l.Text)
		}
	case events.RunFailedEvent:
		s.ended = fmt.Sprintf("failed %s: %s", e.Code, e.Message)
	case events.RunResultEvent:
		s.ended = fmt.Sprintf("result %s", e.Outcome)
	default:
		return
	}
	close(r.changed)
	r.changed = make(chan struct{})
}

// tally is what the bench saw of a set of runs.
type tally struct {
	created, running, ready, doubled, ended int
	// logged counts the runs whose log is agentLog exactly, each line once and in order;
	// logWrong those whose log has more lines than agentLog, other lines, or an event out of
	// order.
	logged, logWrong int
	firstLogWrong    string
	firstEnded       string
	lastCreated      time.Time
}

func (r *runs) tally(ids []string) tally {
	r.mu.Lock()
	defer r.mu.Unlock()
	var t tally
	for _, id := range ids {
		s := r.seenLocked(id)
		if !s.created.IsZero() {
			t.created++
			if s.created.After(t.lastCreated) {
				t.lastCreated = s.created
			}
		}
		if !s.running.IsZero() {
			t.running++
		}
		if !s.ready.IsZero() {
			t.ready++
		}
		switch {
		case s.logOutOfOrder || len(s.logLines) > len(agentLog) || !slices.Equal(s.logLines, agentLog[:len(s.logLines)]):
			if t.logWrong == 0 {
				t.firstLogWrong = fmt.Sprintf("%s: log %q (events in order: %t)", id, s.logLines, !s.logOutOfOrder)
			}
			t.logWrong++
		case len(s.logLines) == len(agentLog):
			t.logged++
		}
		if s.creates > 1 {
			t.doubled++
		}
		if s.ended != "" {
			if t.ended == 0 {
				t.firstEnded = id + ": " + s.ended
			}
			t.ended++
		}
	}
	return t
}

// waitFor waits until done holds for the tally of ids, or until the tally has not changed for
// stall, and returns the last tally. A stall, not a total: at 10,000 Job leases the local Job
// controller alone takes over 20 minutes to make the pods (about 7.6 pods/s), steadily.
func (r *runs) waitFor(ctx context.Context, ids []string, stall time.Duration, done func(tally) bool) (tally, error) {
	timer := time.NewTimer(stall)
	defer timer.Stop()
	var last tally
	for {
		r.mu.Lock()
		ch := r.changed
		r.mu.Unlock()
		t := r.tally(ids)
		if done(t) {
			return t, nil
		}
		if t != last {
			timer.Reset(stall)
			last = t
		}
		select {
		case <-ch:
		case <-timer.C:
			return t, fmt.Errorf("no progress for %s (created %d, running %d, ready %d, logged %d, ended %d of %d)", stall, t.created, t.running, t.ready, t.logged, t.ended, len(ids))
		case <-ctx.Done():
			return t, context.Cause(ctx)
		}
	}
}

// latencies returns each run's publish → created time, in ms, for the runs that have one.
func (r *runs) latencies(ids []string) []float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]float64, 0, len(ids))
	for _, id := range ids {
		s := r.seenLocked(id)
		if !s.created.IsZero() {
			out = append(out, float64(s.created.Sub(s.published).Microseconds())/1000)
		}
	}
	return out
}

// procSample is one reading of a process's resident memory and CPU time.
type procSample struct {
	rss int64 // bytes
	hwm int64 // peak RSS, bytes
	cpu time.Duration
}

// readProc reads /proc/<pid>/status's VmRSS and /proc/<pid>/stat's utime + stime.
func readProc(pid int) (procSample, error) {
	var s procSample
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, err
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		for key, to := range map[string]*int64{"VmRSS:": &s.rss, "VmHWM:": &s.hwm} {
			if rest, ok := strings.CutPrefix(line, key); ok {
				kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
				if err != nil {
					return s, fmt.Errorf("parsing %s %q: %w", key, rest, err)
				}
				*to = kb * 1024
			}
		}
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, err
	}
	// The fields after the command (which may hold spaces) start after the last ')'.
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	if len(fields) < 13 {
		return s, fmt.Errorf("short /proc/%d/stat", pid)
	}
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	s.cpu = time.Duration(utime+stime) * time.Second / clockTicks
	return s, nil
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's times: 100 on every Linux ABI Go
// supports.
const clockTicks = 100

// loadAvg is /proc/loadavg's first three fields.
func loadAvg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
