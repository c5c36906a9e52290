package ops

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kubeclip/kubeclip/pkg/execproto"
)

// execMetrics are the exec-worker's: requests by op and answer, streams served, output relayed.
// Labels are ops and error codes only: nothing of a command.
type execMetrics struct {
	requests    *prometheus.CounterVec
	requestTime *prometheus.HistogramVec
	sessions    prometheus.Gauge
	outputBytes prometheus.Counter
	dropped     *prometheus.CounterVec
	envDropped  prometheus.Counter
}

// execBuckets span a bridge poll answered in milliseconds to a start that waited two minutes
// for its pod.
var execBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}

func newExecMetrics(reg prometheus.Registerer) (*execMetrics, error) {
	m := &execMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubeclip_exec_requests_total",
			Help: "Exec requests answered, by op (start, attach) and code (\"ok\" for started, else the error code).",
		}, []string{"op", "code"}),
		requestTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kubeclip_exec_request_duration_seconds",
			Help:    "Time from an exec request to its started (or error) answer, by op; a start's includes waiting for its pod.",
			Buckets: execBuckets,
		}, []string{"op"}),
		sessions: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kubeclip_exec_streams",
			Help: "Exec streams this replica serves.",
		}),
		outputBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kubeclip_exec_output_bytes_total",
			Help: "Command output bytes relayed to exec clients.",
		}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubeclip_exec_requests_dropped_total",
			Help: "Exec requests dropped without an answer, by reason (reply_not_inbox: the reply subject is not a client's inbox).",
		}, []string{"reason"}),
		envDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kubeclip_exec_env_keys_dropped_total",
			Help: "Environment keys of exec starts the env policy kept from tenant pods.",
		}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.requestTime, m.sessions, m.outputBytes, m.dropped, m.envDropped} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// ExecRequest implements execsvc.Observer (the exec-worker asserts it: importing execsvc here
// would link its Kubernetes exec client into every worker).
func (m *Metrics) ExecRequest(op execproto.Op, code execproto.Code, took time.Duration) {
	label := string(code)
	if label == "" {
		label = "ok"
	}
	m.exec.requests.WithLabelValues(string(op), label).Inc()
	m.exec.requestTime.WithLabelValues(string(op)).Observe(took.Seconds())
}

// ExecSessions implements execsvc.Observer.
func (m *Metrics) ExecSessions(delta int) { m.exec.sessions.Add(float64(delta)) }

// ExecOutput implements execsvc.Observer.
func (m *Metrics) ExecOutput(bytes int) { m.exec.outputBytes.Add(float64(bytes)) }

// ExecDropped implements execsvc.Observer.
func (m *Metrics) ExecDropped(reason string) { m.exec.dropped.WithLabelValues(reason).Inc() }

// ExecEnvDropped implements execsvc.Observer.
func (m *Metrics) ExecEnvDropped(keys int) { m.exec.envDropped.Add(float64(keys)) }
