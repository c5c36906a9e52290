package runwatch

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"
	"github.com/rs/zerolog"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// Defaults of Options.
const (
	// DefaultContainer is the container the agent runs in (pkg/policy renders it so).
	DefaultContainer = "agent"
	// DefaultFlushInterval is how long a log line may wait for company before its chunk is
	// published. Lines that arrive together share a chunk; a lone line waits at most this long.
	DefaultFlushInterval = 5 * time.Millisecond
	// DefaultUnschedulableGrace lets a transient Unschedulable (capacity freed a moment later)
	// pass before the run fails.
	DefaultUnschedulableGrace = 5 * time.Second
	// DefaultStartErrorGrace lets start errors that clear by themselves pass: an image pull's
	// hiccup, a run's Secret created a moment after its pod started (`secret "…" not found`).
	// The kubelet's own "failed to sync secret cache" waits at least a minute
	// (verdict.cacheSyncGrace). An image that cannot be pulled still fails the run seconds after
	// the pod starts, not at its deadline.
	DefaultStartErrorGrace = 10 * time.Second
)

// Options configures a Watcher.
type Options struct {
	// Clientset reads the cluster; required.
	Clientset kubernetes.Interface
	// Dynamic reads Sandboxes: whether a run's Sandbox is still there when the informers hold
	// none of its pods (reconcile.go); required.
	Dynamic dynamic.Interface
	// JetStream publishes the events and reads back what was already published; required.
	JetStream jetstream.JetStream
	// Subjects carries the subject prefix.
	Subjects events.Subjects
	// Logger receives the watcher's records.
	Logger zerolog.Logger
	// Now is the clock; defaults to time.Now.
	Now func() time.Time
	// Container is the agent's container name; defaults to DefaultContainer.
	Container string
	// FlushInterval bounds how long a log line waits before it is published.
	FlushInterval time.Duration
	// UnschedulableGrace is how long a pod may stay unschedulable before its run fails.
	UnschedulableGrace time.Duration
	// StartErrorGrace is how long a pod may report a start error (image pull, container config)
	// before its run fails. Zero means DefaultStartErrorGrace; negative fails at once.
	StartErrorGrace time.Duration
	// ReplicaID names this replica in the ownership bucket; it must differ between replicas.
	// Defaults to the host name plus a random suffix.
	ReplicaID string
	// OwnershipTTL is how long a run stays owned by a replica that stopped renewing it, which
	// bounds takeover after a crash (default DefaultOwnershipTTL). Every replica must agree.
	OwnershipTTL time.Duration
	// StreamReplicas is the replica count of the ownership bucket (default 1).
	StreamReplicas int
	// StoreBytes is the JetStream store the ownership and budget buckets take their share of
	// (events.Options.StoreBytes; 0: the default).
	StoreBytes int64
	// ReconcileInterval is how often runs whose workload vanished unobserved get a result
	// (default DefaultReconcileInterval); the first pass runs at start.
	ReconcileInterval time.Duration
	// LogBudget bounds what one run's and one company's container logs may store in the run
	// stream (events.BudgetOptions, source "log"; defaults 256 MiB a run and, a company, its
	// share of the run stream: events.Options.CompanyBudget). Over it, the run's log stops with a `logStopped` event; the run gets its result.
	LogBudget LogBudget
	// Observer is told about published events and runs in flight (metrics); nil means none.
	Observer Observer
}

// LogBudget is Options.LogBudget; zero fields take events' defaults.
type LogBudget struct {
	RunBytes, CompanyBytes int64
	Window                 time.Duration
}

func (o Options) withDefaults() (Options, error) {
	if o.Clientset == nil {
		return o, errors.New("runwatch: Options.Clientset is required")
	}
	if o.Dynamic == nil {
		return o, errors.New("runwatch: Options.Dynamic is required")
	}
	if o.JetStream == nil {
		return o, errors.New("runwatch: Options.JetStream is required")
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Container == "" {
		o.Container = DefaultContainer
	}
	if o.FlushInterval <= 0 {
		o.FlushInterval = DefaultFlushInterval
	}
	if o.ReconcileInterval <= 0 {
		o.ReconcileInterval = DefaultReconcileInterval
	}
	if o.OwnershipTTL == 0 {
		o.OwnershipTTL = DefaultOwnershipTTL
	}
	if o.OwnershipTTL < time.Second {
		return o, errors.New("runwatch: Options.OwnershipTTL must be at least 1s")
	}
	if o.ReplicaID == "" {
		host, _ := os.Hostname()
		o.ReplicaID = fmt.Sprintf("%s-%s", host, strings.ToLower(ulid.Make().String()[20:]))
	}
	if o.UnschedulableGrace < 0 {
		return o, errors.New("runwatch: Options.UnschedulableGrace must not be negative")
	}
	switch {
	case o.StartErrorGrace == 0:
		o.StartErrorGrace = DefaultStartErrorGrace
	case o.StartErrorGrace < 0:
		o.StartErrorGrace = 0
	}
	return o, nil
}
