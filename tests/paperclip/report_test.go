package paperclip

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// ReportEnv names a file the suite also writes its figures to: `go test ./...` shows a passing
// package's output only with -v, so `make test` prints this file instead.
const ReportEnv = "KUBECLIP_PAPERCLIP_REPORT"

// runStats are one run's figures.
type runStats struct {
	name   string
	status string
	// wall is Paperclip's run from start to finish; agent the stub's first line to its last.
	wall, agent time.Duration
	// firstLine is the stub's first line from its print to Paperclip's run log; maxLine the
	// slowest line.
	firstLine, maxLine time.Duration
	// executes and their latencies at the plugin's hook (what Paperclip waited for each).
	executes       int
	p50, p99, pmax time.Duration
	// acquire and release are those hooks' durations.
	acquire, release time.Duration
	hooks            map[string]any
	// syncExecs and syncBytes are native sync's execs (no execute call) and the bytes it moved.
	syncExecs int
	syncBytes int64
	// streamEvents and streamBytes are the run's events in kubeclip's run stream and their
	// payloads' size: uploads and bridge polls are not recorded, so they stay small.
	streamEvents, streamBytes int
	// resultPrinted is when the stub printed its result line.
	resultPrinted time.Time
}

type report struct {
	mu   sync.Mutex
	runs []runStats
	// pluginPeakRSS is the plugin worker's peak RSS under Paperclip over every run (bytes).
	pluginPeakRSS int64
	// largeRun is LargeOutputRun's.
	largeRun largeRunStats
	// acquires are the acquire times of TestPaperclipWarmPool's runs.
	acquires []acquireStats
	// notes are lines a test adds below the table.
	notes []string
}

// acquireStats are one run's acquire on a tenant with warm pods.
type acquireStats struct {
	name string
	// warm is the created event's: the lease bound a warm pod.
	warm bool
	// toCreated is the plugin's acquire hook until kubeclip's created event; toReady adds the
	// run stream's created → status Running/Ready (store times), nothing when ready came first.
	toCreated, toReady time.Duration
}

// largeRunStats are the figures of one agent run with a large output through Paperclip.
type largeRunStats struct {
	bytes   int64
	peakRSS int64 // the plugin worker's, over this run alone
	wall    time.Duration
}

// bigExec is the 64 MiB execute of TestExecClientAgainstExecWorkers: the plugin's execute
// hook against the real exec-workers, what it returned and the peak RSS of its process.
var bigExec struct {
	mu                         sync.Mutex
	outputBytes, held, peakRSS int64
	baselineRSS                int64
}

// nativeSync is TestExecClientAgainstExecWorkers' line on native sync through the plugin's hooks
// (set before TestPaperclip prints its report: the suite runs its tests in file order).
var nativeSync string

func (r *report) add(s runStats) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.runs = append(r.runs, s)
}

func (r *report) addAcquire(a acquireStats) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.acquires = append(r.acquires, a)
}

func (r *report) print(t *testing.T) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "kubeclip under the real Paperclip server (%s):\n", time.Now().UTC().Format(time.RFC3339))
	fmt.Fprintf(&b, "%-22s %-9s %7s %7s %9s %9s %9s %9s %9s %8s %8s %7s %8s  %s\n",
		"run", "status", "wall", "agent", "1st line", "max line", "executes", "exec p50", "exec p99", "acquire", "release", "events", "bytes", "hooks")
	for _, s := range r.runs {
		fmt.Fprintf(&b, "%-22s %-9s %7s %7s %9s %9s %9s %9s %9s %8s %8s %7s %8s  %s\n", s.name, s.status,
			round(s.wall), round(s.agent), msOf(s.firstLine), msOf(s.maxLine), countOf(s.executes), msOf(s.p50), msOf(s.p99),
			msOf(s.acquire), msOf(s.release), countOf(s.streamEvents), countOf(s.streamBytes), hooks(s.hooks))
	}
	b.WriteString("wall: Paperclip's run record (start to finish); agent: the stub's first line to its result; " +
		"1st/max line: a stub line's print to Paperclip's run log; exec p50/p99: execute calls at the plugin's hook; " +
		"events/bytes: the run's events in kubeclip's run stream and their JSON payloads.\n")
	if len(r.acquires) > 0 {
		fmt.Fprintf(&b, "acquire on a tenant with warm pods (dispatcher --warm-pool-max %d): the plugin's acquire hook → created, and → status Running/Ready:\n", warmPoolMax)
		fmt.Fprintf(&b, "%-22s %-5s %10s %10s\n", "run", "pod", "→ created", "→ ready")
		for _, a := range r.acquires {
			pod := "cold"
			if a.warm {
				pod = "warm"
			}
			fmt.Fprintf(&b, "%-22s %-5s %10s %10s\n", a.name, pod, msOf(a.toCreated), msOf(a.toReady))
		}
	}
	if r.pluginPeakRSS > 0 {
		fmt.Fprintf(&b, "plugin worker under Paperclip: peak RSS %d MiB over these runs (VmHWM of its process)\n", r.pluginPeakRSS>>20)
	}
	if r.largeRun.peakRSS > 0 {
		fmt.Fprintf(&b, "one agent run printing %.1f MiB through Paperclip: succeeded in %s, the plugin worker's peak RSS over it %d MiB (VmHWM reset before it)\n",
			float64(r.largeRun.bytes)/(1<<20), round(r.largeRun.wall), r.largeRun.peakRSS>>20)
	}
	bigExec.mu.Lock()
	if bigExec.peakRSS > 0 {
		fmt.Fprintf(&b, "one execute of %d MiB of output (plugin execute hook, real exec-workers): %d bytes held and returned per stream; process peak RSS %d MiB (%d MiB before it)\n",
			bigExec.outputBytes>>20, bigExec.held, bigExec.peakRSS>>20, bigExec.baselineRSS>>20)
	}
	bigExec.mu.Unlock()
	if nativeSync != "" {
		b.WriteString(nativeSync + "\n")
	}
	for _, n := range r.notes {
		b.WriteString(n + "\n")
	}
	t.Log("\n" + b.String())
	// Appended: each test function of the suite prints its own report into the one file.
	if path := os.Getenv(ReportEnv); path != "" {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err == nil {
			_, err = f.WriteString(b.String())
			err = errors.Join(err, f.Close())
		}
		if err != nil {
			t.Errorf("writing the report: %v", err)
		}
	}
}

func round(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return d.Round(100 * time.Millisecond).String()
}

func msOf(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return fmt.Sprintf("%dms", d.Milliseconds())
}

func countOf(n int) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprint(n)
}

func hooks(h map[string]any) string {
	var keys []string
	for k := range h {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var out []string
	for _, k := range keys {
		out = append(out, fmt.Sprintf("%s=%v", k, h[k]))
	}
	return strings.Join(out, " ")
}
