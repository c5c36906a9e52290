package ops

import (
	"errors"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// Metrics records what a worker does. It implements events.Observer (the consume loop and the
// publisher) and runwatch.Observer (runs in flight). Subjects are reported as patterns with the
// ids replaced by "*" (SubjectPattern), so a label never grows with the number of runs.
type Metrics struct {
	consumed     *prometheus.CounterVec
	handlerTime  *prometheus.HistogramVec
	redelivered  *prometheus.CounterVec
	terminal     *prometheus.CounterVec
	published    *prometheus.CounterVec
	publishTime  *prometheus.HistogramVec
	runsInFlight prometheus.Gauge
	logBytes     prometheus.Counter
	logLines     prometheus.Counter
	// logGaps is kubeclip_log_gaps_total (LogGap).
	logGaps    prometheus.Counter
	exec       *execMetrics
	apiDropped *prometheus.CounterVec
	// budgetExceeded is kubeclip_budget_exceeded_total (budget.go).
	budgetExceeded *prometheus.CounterVec
	// storeWriteErrors is kubeclip_store_write_errors_total (budget.go).
	storeWriteErrors *prometheus.CounterVec
	// warm is the dispatcher's warm pools (warm.go).
	warm *warmMetrics
	// lifecycle times acquires and counts run takeovers (lifecycle.go).
	lifecycle *lifecycleMetrics
	// kubeRequests is kubeclip_kubernetes_requests_total (kubeapi.go).
	kubeRequests *prometheus.CounterVec
}

var _ events.Observer = (*Metrics)(nil)

// Publish outcomes, the "outcome" label of kubeclip_events_published_total.
const (
	outcomeStored    = "stored"
	outcomeDuplicate = "duplicate"
	// outcomeRejected: the stream refused the message (wrong stream, too large, fenced).
	outcomeRejected = "rejected"
	outcomeError    = "error"
)

// handlerBuckets span a quick ack (milliseconds) to a release that waits for a pod to stop
// (up to the 2-minute release timeout).
var handlerBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}

// NewMetrics creates the worker metrics and registers them on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		consumed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubeclip_messages_consumed_total",
			Help: "Messages settled by the consume loop, by consumer, subject pattern and fate (acked, retried, deferred, terminated, handed_back).",
		}, []string{"consumer", "subject", "fate"}),
		handlerTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kubeclip_handler_duration_seconds",
			Help:    "How long message handlers ran, by consumer, subject pattern and fate.",
			Buckets: handlerBuckets,
		}, []string{"consumer", "subject", "fate"}),
		redelivered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubeclip_message_redeliveries_total",
			Help: "Settled deliveries that were redeliveries (attempt > 1), by consumer and subject pattern.",
		}, []string{"consumer", "subject"}),
		terminal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubeclip_terminal_failures_total",
			Help: "Messages that failed for good (a failed event was published), by consumer, subject pattern and failure code.",
		}, []string{"consumer", "subject", "code"}),
		published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubeclip_events_published_total",
			Help: "Publish calls, by subject pattern and outcome (stored, duplicate, rejected, error).",
		}, []string{"subject", "outcome"}),
		publishTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kubeclip_publish_duration_seconds",
			Help:    "How long a publish took until the stream acknowledged it, by subject pattern.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14), // 0.5 ms .. 4 s
		}, []string{"subject"}),
		runsInFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kubeclip_runs_in_flight",
			Help: "Runs the run-watcher follows that have no result yet.",
		}),
		logBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kubeclip_log_bytes_total",
			Help: "Bytes of agent log lines published as log events (first stores only, not duplicates).",
		}),
		logLines: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kubeclip_log_lines_total",
			Help: "Agent log lines published as log events (first stores only, not duplicates).",
		}),
		logGaps: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kubeclip_log_gaps_total",
			Help: "Gaps the run-watcher found in container logs: the kubelet rotated lines away before they were read (raise the kubelet's containerLogMaxSize).",
		}),
	}
	for _, c := range []prometheus.Collector{m.consumed, m.handlerTime, m.redelivered, m.terminal, m.published, m.publishTime, m.runsInFlight, m.logBytes, m.logLines, m.logGaps} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	exec, err := newExecMetrics(reg)
	if err != nil {
		return nil, err
	}
	m.exec = exec
	if m.apiDropped, err = newAPIDropped(reg); err != nil {
		return nil, err
	}
	if m.budgetExceeded, err = newBudgetMetric(reg); err != nil {
		return nil, err
	}
	if m.storeWriteErrors, err = newStoreWriteErrors(reg); err != nil {
		return nil, err
	}
	if m.warm, err = newWarmMetrics(reg); err != nil {
		return nil, err
	}
	if m.lifecycle, err = newLifecycleMetrics(reg); err != nil {
		return nil, err
	}
	if m.kubeRequests, err = newKubeRequests(reg); err != nil {
		return nil, err
	}
	return m, nil
}

// MessageSettled implements events.ConsumeObserver.
func (m *Metrics) MessageSettled(s events.Settlement) {
	subject := SubjectPattern(s.Subject)
	fate := string(s.Fate)
	m.consumed.WithLabelValues(s.Consumer, subject, fate).Inc()
	if s.HandlerDuration > 0 {
		m.handlerTime.WithLabelValues(s.Consumer, subject, fate).Observe(s.HandlerDuration.Seconds())
	}
	if s.Attempt > 1 {
		m.redelivered.WithLabelValues(s.Consumer, subject).Inc()
	}
	if s.Fate == events.FateTerminated {
		m.terminal.WithLabelValues(s.Consumer, subject, string(s.Code)).Inc()
	}
}

// EventPublished implements events.PublishObserver.
func (m *Metrics) EventPublished(p events.Publication) {
	subject := SubjectPattern(p.Subject)
	var apiErr *jetstream.APIError
	outcome := outcomeStored
	switch {
	case errors.As(p.Err, &apiErr):
		outcome = outcomeRejected
	case p.Err != nil:
		outcome = outcomeError
	case p.Duplicate:
		outcome = outcomeDuplicate
	}
	m.published.WithLabelValues(subject, outcome).Inc()
	if p.Err != nil {
		return
	}
	m.publishTime.WithLabelValues(subject).Observe(p.Duration.Seconds())
	if ev, ok := p.Event.(events.RunLogEvent); ok && !p.Duplicate {
		for _, l := range ev.Lines {
			m.logBytes.Add(float64(len(l.Text)))
		}
		m.logLines.Add(float64(len(ev.Lines)))
	}
}

// RunsInFlight implements runwatch.Observer: delta is +1 when the watcher starts following a
// run, -1 when the run has its result or the watcher stops following it.
func (m *Metrics) RunsInFlight(delta int) { m.runsInFlight.Add(float64(delta)) }

// LogGap implements runwatch.LogGapObserver: a follower found a gap in a container's log.
func (m *Metrics) LogGap() { m.logGaps.Inc() }

// SubjectPattern replaces the ids in a kubeclip subject with "*": paperclip.lease.*.acquire,
// paperclip.run.*.*.log, kubeclip.dispatch.*.*. Anything else is "other" (and "" is "none"), so
// label values stay few whatever arrives.
func SubjectPattern(subject string) string {
	if subject == "" {
		return "none"
	}
	t := strings.Split(subject, ".")
	switch {
	case len(t) == 4 && t[1] == "lease":
		return t[0] + ".lease.*." + t[3]
	case len(t) == 5 && t[1] == "run":
		return t[0] + ".run.*.*." + t[4]
	case len(t) == 4 && t[1] == "dispatch":
		return t[0] + ".dispatch.*.*"
	}
	return "other"
}
