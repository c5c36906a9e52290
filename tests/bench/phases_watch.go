package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// podSeenGrace bounds how long (c) waits for the bench's informer to report a container's end
// after the run's result arrived (it may trail the run-watcher's informer by a moment).
const podSeenGrace = 5 * time.Second

// logPhase is (d): --log-runs runs print --log-lines lines --log-interval apart; the bench
// follows each pod's log itself (GetLogs, Follow, Timestamps) and compares when it read each
// line with when the line's log event arrived.
func (b *bench) logPhase(ctx context.Context, rep *report) error {
	env := stubEnv(b.s.logLines, b.s.logInterval)
	ids := make([]string, b.s.logRuns)
	for i := range ids {
		runID, _, err := b.acquire(ctx, b.warmCompany, env)
		if err != nil {
			return err
		}
		ids[i] = runID
		b.logRuns = append(b.logRuns, runID)
	}
	raws := make([]map[logKey]time.Time, len(ids))
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() { raws[i], errs[i] = b.follow(ctx, id) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}

	var delta, pipeLat, rawLat samples
	for i, id := range ids {
		wctx, cancel := b.waitCtx(ctx)
		_, err := b.events.result(wctx, id) // every log event is published before the result
		cancel()
		if err != nil {
			return err
		}
		b.compareLines(id, raws[i], &delta, &pipeLat, &rawLat)
	}
	b.readFinalLogs(ctx, ids)
	rep.add(latencyRow("(d) log line → log event, after the raw follow stream", delta, samples{},
		"reference: the bench's own GetLogs follow stream on the same pod (delta = log event − raw stream)",
		"p99 ≤ 100 ms", func(_, p99, _ float64) bool { return p99 <= 100 }))
	rep.add(latencyRow("(d') log line → log event, after the kubelet's timestamp", pipeLat, rawLat,
		"raw follow stream: receive − the line's kubelet timestamp", "none (informational)", nil))
	rep.note("(d): %d runs × lines %d..%d of %d, %s apart (the first %d per run are skipped while both streams attach)",
		len(ids), b.s.logSkip+1, b.s.logLines, b.s.logLines, b.s.logInterval, b.s.logSkip)
	return nil
}

// compareLines adds, for each measured stub line the raw stream read, the log event's delay
// after the raw stream, and both sides' delays after the line's kubelet timestamp.
func (b *bench) compareLines(runID string, raw map[logKey]time.Time, delta, pipeLat, rawLat *samples) {
	pipe := b.events.lines(runID)
	for key, rawAt := range raw {
		if n, ok := stubLineNumber(key.text); !ok || n <= b.s.logSkip {
			continue
		}
		ts, err := time.Parse(time.RFC3339Nano, key.ts)
		if err != nil {
			rawLat.add(0, fmt.Errorf("run %s: line timestamp %q: %w", runID, key.ts, err))
			continue
		}
		rawLat.add(rawAt.Sub(ts), nil)
		pipeAt, ok := pipe[key]
		if !ok {
			delta.add(0, fmt.Errorf("run %s: no log event carried line %q", runID, key.text))
			continue
		}
		delta.add(pipeAt.Sub(rawAt), nil)
		pipeLat.add(pipeAt.Sub(ts), nil)
	}
}

// follow reads runID's agent log with the bench's own follow stream, from the moment its
// informer sees the container run until the stream ends, and returns when each line arrived.
func (b *bench) follow(ctx context.Context, runID string) (map[logKey]time.Time, error) {
	wctx, cancel := b.waitCtx(ctx)
	defer cancel()
	pod, err := b.pods.running(wctx, runID)
	if err != nil {
		return nil, err
	}
	req := b.raw.cs.CoreV1().Pods(pod.namespace).GetLogs(pod.name, &corev1.PodLogOptions{
		Container: policy.AgentContainerName, Follow: true, Timestamps: true,
	})
	stream, err := req.Stream(wctx)
	if err != nil {
		return nil, fmt.Errorf("following the log of %s/%s: %w", pod.namespace, pod.name, err)
	}
	defer stream.Close()
	lines, err := readLines(stream)
	if err != nil {
		return lines, fmt.Errorf("following the log of %s/%s: %w", pod.namespace, pod.name, err)
	}
	return lines, nil
}

// readLines reads "<timestamp> <text>\n" lines until EOF and records when each arrived.
func readLines(r io.Reader) (map[logKey]time.Time, error) {
	br := bufio.NewReader(r)
	out := map[logKey]time.Time{}
	for {
		line, err := br.ReadString('\n')
		at := time.Now()
		if text, ok := strings.CutSuffix(line, "\n"); ok {
			if ts, text, ok := strings.Cut(text, " "); ok {
				if _, seen := out[logKey{ts, text}]; !seen {
					out[logKey{ts, text}] = at
				}
			}
		}
		switch {
		case errors.Is(err, io.EOF):
			return out, nil
		case err != nil:
			return out, fmt.Errorf("reading the log stream: %w", err)
		}
	}
}

// stubLineNumber returns N for the stub's assistant line "stub line N".
func stubLineNumber(text string) (int, bool) {
	var msg struct {
		Type    string `json:"type"`
		Message struct {
			Content []struct {
				Text string `json:"text"`
			} `json:"content"`
		} `json:"message"`
	}
	if json.Unmarshal([]byte(text), &msg) != nil || msg.Type != "assistant" || len(msg.Message.Content) == 0 {
		return 0, false
	}
	var n int
	if _, err := fmt.Sscanf(msg.Message.Content[0].Text, "stub line %d", &n); err != nil {
		return 0, false
	}
	return n, true
}

// resultPhase is (c): for every run of (a), (b) and (d) that succeeded, the delay between the
// bench's pod informer seeing the agent container terminated and the result event arriving.
func (b *bench) resultPhase(ctx context.Context, rep *report) error {
	wctx, cancel := b.waitCtx(ctx)
	defer cancel()
	var delta samples
	measured := map[string]podTimes{}
	var notSucceeded, missing int
	runs := slices.Concat(b.warmRuns, b.coldRuns, b.logRuns)
	for _, id := range runs {
		ev, err := b.events.result(wctx, id)
		if err != nil {
			missing++
			continue
		}
		if ev.outcome != events.OutcomeSucceeded {
			notSucceeded++
			continue
		}
		pctx, pcancel := context.WithTimeout(ctx, podSeenGrace)
		pod, err := b.pods.terminated(pctx, id)
		pcancel()
		if err != nil {
			delta.add(0, err)
			continue
		}
		delta.add(ev.result.Sub(pod.terminated), nil)
		measured[id] = pod
	}
	stages, slowest := b.resultStages(phaseResults, measured)
	rep.Breakdown = append(rep.Breakdown, stages...)
	rep.note("(c): the 3 slowest runs, total = terminated → status + status → result publish + result publish + delivery (ms): %s", slowest)
	rep.add(latencyRow("(c') the final log read's primitive: a non-follow GetLogs of the same containers", b.finalLogReads, samples{}, "", "", nil))
	rep.note("(c'): the bench reads each run's agent log once (Timestamps, no Follow) as the run-watcher's final read does, one at a time at the end of the run's phase ((a), (b), (d); their pods are gone by (c)): the node is quieter then than during the runs, so this is a floor")
	rep.add(latencyRow("(c) container terminated → result, after the raw pod watch", delta, samples{},
		"reference: the bench's own pod informer seeing the agent container terminated (delta = result − raw watch)",
		"p99 ≤ 50 ms", func(_, p99, _ float64) bool { return p99 <= 50 }))
	rep.note("(c): the runs of (a), (b) and (d); %d not measured because they did not succeed (e.g. unschedulable), %d without a result in time",
		notSucceeded, missing)
	return nil
}
