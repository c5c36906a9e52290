package pipelinetest

import (
	"bufio"
	"encoding/json"
	"os"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// LogRecord is the part of a worker's JSON log record the tests look at.
type LogRecord struct {
	Message string `json:"message"`
	Subject string `json:"subject"`
	RunID   string `json:"run_id"`
	Attempt uint64 `json:"attempt"`
	// The exec-worker's: the exec, the replica serving it, the request (start, attach,
	// signal), the command's base name and whether its output is recorded.
	ExecID  string `json:"exec_id"`
	Replica string `json:"replica"`
	Op      string `json:"op"`
	Command string `json:"command"`
	Record  bool   `json:"record"`
}

// Records returns the records of every process of kind the suite started (live or not) that
// match keep, per process id.
func (e *Env) Records(kind string, keep func(LogRecord) bool) (map[string][]LogRecord, error) {
	e.workers.mu.Lock()
	all := append([]*Worker(nil), e.workers.all...)
	e.workers.mu.Unlock()
	out := map[string][]LogRecord{}
	for _, w := range all {
		if w.Kind != kind {
			continue
		}
		f, err := os.Open(w.LogPath)
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var rec LogRecord
			if json.Unmarshal(sc.Bytes(), &rec) == nil && keep(rec) {
				out[w.ID] = append(out[w.ID], rec)
			}
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// DispatchesHandled returns how many deliveries of the run's dispatch message each dispatcher
// handled to the end (acked), from the dispatchers' debug logs.
func (e *Env) DispatchesHandled(companyID, runID string) (map[string]int, error) {
	subj, err := events.DispatchSubject(companyID, runID)
	if err != nil {
		return nil, err
	}
	recs, err := e.Records(Dispatcher, func(r LogRecord) bool { return r.Subject == subj && r.Message == "message handled" })
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for id, rs := range recs {
		out[id] = len(rs)
	}
	return out, nil
}
