package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"
)

// stepFigures is one step of the dispatcher's acquires (pkg/dispatch steps.go), in ms.
type stepFigures struct {
	MeanMs float64 `json:"meanMs"`
	P50Ms  float64 `json:"p50Ms"`
	P99Ms  float64 `json:"p99Ms"`
}

// dispatchSteps are the steps of an acquire in the dispatcher's "run created" records, in order;
// "handler" is their sum without "queued" (a message's time in a concurrency slot).
var dispatchSteps = []string{"queued", "check", "guard", "record", "create", "created", "publish", "adopt", "handler"}

// logRecord is what the bench reads of a worker's JSON log record.
type logRecord struct {
	Message   string             `json:"message"`
	RunID     string             `json:"run_id"`
	TookMs    map[string]float64 `json:"took_ms"`
	Workloads int                `json:"workloads"`
	Took      float64            `json:"took"` // zerolog's Dur: milliseconds
}

// readLog calls each with every JSON record of the log at path.
func readLog(path string, each func(logRecord)) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var r logRecord
		if json.Unmarshal(sc.Bytes(), &r) == nil {
			each(r)
		}
	}
	return sc.Err()
}

// acquireSteps is where the dispatcher's time went for the runs of ids: each step's mean, p50
// and p99 over the "run created" records of the dispatcher's log at path.
func acquireSteps(path string, ids []string) (map[string]stepFigures, error) {
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	samples := map[string][]float64{}
	err := readLog(path, func(r logRecord) {
		if r.Message != "run created" || !want[r.RunID] || r.TookMs == nil {
			return
		}
		handler := 0.0
		for step, ms := range r.TookMs {
			samples[step] = append(samples[step], ms)
			if step != "queued" {
				handler += ms
			}
		}
		samples["handler"] = append(samples["handler"], handler)
	})
	if err != nil {
		return nil, fmt.Errorf("reading the dispatcher's log: %w", err)
	}
	out := map[string]stepFigures{}
	for step, ms := range samples {
		sum := 0.0
		for _, v := range ms {
			sum += v
		}
		out[step] = stepFigures{MeanMs: round(sum / float64(len(ms))), P50Ms: percentile(ms, 50), P99Ms: percentile(ms, 99)}
	}
	return out, nil
}

// reconcilePass waits for the first "reconcile: pass done" record in the dispatcher's log at
// path and returns how many workloads it saw and how long it took.
func reconcilePass(ctx context.Context, path string, timeout time.Duration) (int, time.Duration, error) {
	deadline := time.Now().Add(timeout)
	for {
		var found *logRecord
		err := readLog(path, func(r logRecord) {
			if found == nil && strings.HasPrefix(r.Message, "reconcile: pass done") {
				found = &r
			}
		})
		if err != nil {
			return 0, 0, fmt.Errorf("reading the dispatcher's log: %w", err)
		}
		if found != nil {
			return found.Workloads, time.Duration(found.Took * float64(time.Millisecond)), nil
		}
		if time.Now().After(deadline) {
			return 0, 0, fmt.Errorf("the restarted dispatcher logged no finished reconcile pass in %s", timeout)
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return 0, 0, err
		}
	}
}

// stepMetrics are the table's rows of the dispatcher's steps (mean ms per acquire).
func stepMetrics() []metric {
	var ms []metric
	for _, step := range dispatchSteps {
		ms = append(ms, metric{"dispatcher " + step + " mean", "ms", "", func(r sizeResult) float64 { return r.DispatchSteps[step].MeanMs }})
	}
	return slices.Clip(ms)
}
