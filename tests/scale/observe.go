package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// runs records, per run, when the bench received its created and ready events, how many created
// events it got (more than one is a doubled lease), and any failed or result event (a live lease
// must have neither). One ordered consumer reads every run event, as a Paperclip consumer would.
type runs struct {
	mu      sync.Mutex
	byID    map[string]*runSeen
	changed chan struct{}
}

type runSeen struct {
	published time.Time
	created   time.Time
	ready     time.Time
	creates   int
	ended     string // the failed or result event's kind and detail
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
		if e.Phase == events.PhaseRunning && e.Reason == events.ReasonReady && s.ready.IsZero() {
			s.ready = at
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
	created, ready, doubled, ended int
	firstEnded                     string
	lastCreated                    time.Time
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
		if !s.ready.IsZero() {
			t.ready++
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

// waitFor waits until done holds for the tally of ids or timeout passes, and returns the last
// tally.
func (r *runs) waitFor(ctx context.Context, ids []string, timeout time.Duration, done func(tally) bool) (tally, error) {
	deadline := time.After(timeout)
	for {
		r.mu.Lock()
		ch := r.changed
		r.mu.Unlock()
		t := r.tally(ids)
		if done(t) {
			return t, nil
		}
		select {
		case <-ch:
		case <-deadline:
			return t, fmt.Errorf("timed out after %s (created %d, ready %d, ended %d of %d)", timeout, t.created, t.ready, t.ended, len(ids))
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
