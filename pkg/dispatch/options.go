package dispatch

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"
	"github.com/rs/zerolog"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execspec"
	"github.com/kubeclip/kubeclip/pkg/k8s"
	"github.com/kubeclip/kubeclip/pkg/policy"
	"github.com/kubeclip/kubeclip/pkg/workload"
)

// Defaults of Options.
const (
	// DefaultAgentBusyTimeout is how long an acquire for a busy agent waits in the queue before
	// it fails with agent_busy.
	DefaultAgentBusyTimeout = 5 * time.Minute
	// DefaultAgentBusyRetry is how often a waiting acquire looks again whether its agent is free.
	DefaultAgentBusyRetry = time.Second
	// DefaultReleaseTimeout bounds a release: deleting the workload and waiting for its pod.
	DefaultReleaseTimeout = 2 * time.Minute
	// DefaultSandboxdImage is the local cluster's sandboxd image (hack/cluster); deployments set
	// their own.
	DefaultSandboxdImage = "kubeclip.local/sandboxd:dev"
	// DefaultConcurrency is how many requests of each stream one dispatcher handles at once. An
	// acquire's handler is almost all API round trips (issue 16: its KV steps took 6 ms of the
	// 592 a handler took at 1,000 live leases; the rest was two POSTs and a PATCH, now the two
	// POSTs of k8s.StartPodRun), so a dispatcher acquires at most Concurrency ÷ 2 POSTs per
	// second: 16 was 27/s at 100/s offered with POSTs at 227 ms. Past what the API server
	// answers, more only queues in it: 64 on the 2-core test machine made a POST take 1.3 s and
	// acquired 30/s. 32 keeps up with 100/s at POSTs of 160 ms.
	DefaultConcurrency = 32
)

// Options configures a Dispatcher.
type Options struct {
	// Clientset creates Jobs, Secrets and pods; required.
	Clientset kubernetes.Interface
	// Dynamic creates Sandbox CRs and scoped egress policies; required.
	Dynamic dynamic.Interface
	// Metadata lists the workloads of the reconcile pass, their metadata only; required.
	Metadata metadata.Interface
	// Applier applies scoped egress policies; required.
	Applier *k8s.Applier
	// JetStream consumes the requests and publishes the events; required.
	JetStream jetstream.JetStream
	// Subjects carries the subject prefix.
	Subjects events.Subjects
	// Logger receives the dispatcher's records.
	Logger zerolog.Logger
	// Now is the clock; defaults to time.Now.
	Now func() time.Time
	// NewID mints workload ids; defaults to ulid.Make (monotonic, safe for concurrent use).
	NewID func() ulid.ULID
	// Random feeds bootstrap tokens; defaults to crypto/rand.
	Random io.Reader
	// LookupEnv finds adapter API keys in the dispatcher's environment (os.LookupEnv from main);
	// nil finds none.
	LookupEnv func(string) (string, bool)
	// AdapterSecret, when set, is a Secret whose keys are adapter API keys; they win over
	// LookupEnv. It is read with the dispatcher's own credentials, never taken from an event.
	AdapterSecret types.NamespacedName
	// BrokeredKeys are the environment keys the credential broker holds (issue 27; the
	// operator's --brokered-keys): a run's Secret carries the lease's placeholder for each,
	// minted by Minter, never its real value. None: off.
	BrokeredKeys []string
	// Minter mints the placeholders of BrokeredKeys (mintclient.Client); required with them.
	Minter Minter
	// AgentBusyTimeout bounds how long an acquire waits for its agent's previous run.
	AgentBusyTimeout time.Duration
	// AgentBusyRetry is how often a waiting acquire checks its agent again.
	AgentBusyRetry time.Duration
	// ReleaseTimeout bounds one release or destroy.
	ReleaseTimeout time.Duration
	// Concurrency is the number of requests handled at once per consumer (default
	// DefaultConcurrency).
	Concurrency int
	// DrainTimeout bounds shutdown.
	DrainTimeout time.Duration
	// OrphanPolicy says what to do with a workload that has no lease at all (default report).
	OrphanPolicy OrphanPolicy
	// ReconcileInterval is how often orphaned workloads are looked for (default
	// DefaultReconcileInterval).
	ReconcileInterval time.Duration
	// ReconcilePageSize is how many workloads one LIST of the reconcile pass returns (default
	// workload.DefaultListPageSize): the pass holds one page at a time.
	ReconcilePageSize int64
	// Observer is told about consumed and published messages (metrics); nil means none.
	Observer events.Observer
	// StreamReplicas is the replica count of the parking stream and the agent bucket (default 1).
	StreamReplicas int
	// StoreBytes is the JetStream store the parking stream and the agent and warm buckets take
	// their share of (0: the default).
	StoreBytes int64
	// Backoff is the retry schedule of failed messages (events.DefaultBackoff when nil).
	Backoff func(attempt uint64) time.Duration
	// SandboxKey is the installation's master key (execspec.ReadMasterKey): the run Secret of
	// an exec-capable lease carries the seed derived from it. Without it, exec-capable backends
	// are refused with backend_unavailable.
	SandboxKey []byte
	// SandboxdImage is the image of sandboxd's init container (default DefaultSandboxdImage).
	SandboxdImage string
	// Operator is the installation's policy for every company (allowed namespace prefixes,
	// reserved namespaces, adapter keys, the namespace cap, reusable leases' volumes); zero
	// fields take policy.DefaultOperator's.
	Operator policy.Operator
	// LeaseIdleWindow is how long a released reusable lease keeps its pod before it is
	// suspended (default DefaultLeaseIdleWindow); see reuse.go.
	LeaseIdleWindow time.Duration
	// LeaseMaxAge is how long a suspended reusable lease keeps its volume before it is
	// collected (default DefaultLeaseMaxAge).
	LeaseMaxAge time.Duration
	// LeaseSweepInterval is how often reusable leases are looked at (default
	// DefaultLeaseSweepInterval).
	LeaseSweepInterval time.Duration
	// Warm bounds the warm pools of backend pod (warm.go); off unless Warm.Max > 0, which
	// needs SandboxKey.
	Warm WarmOptions
	// WarmObserver is told about warm acquires and pools (metrics); nil means none.
	WarmObserver WarmObserver
	// RunObserver is told how long each lease took from its record to `created` (metrics);
	// nil means none.
	RunObserver RunObserver
	// Bind is sandboxd's bind call, which warm pools need.
	Bind Binder
}

func (o Options) withDefaults() (_ Options, err error) {
	switch {
	case o.Clientset == nil:
		return o, errors.New("dispatch: Options.Clientset is required")
	case o.Dynamic == nil:
		return o, errors.New("dispatch: Options.Dynamic is required")
	case o.Metadata == nil:
		return o, errors.New("dispatch: Options.Metadata is required")
	case o.Applier == nil:
		return o, errors.New("dispatch: Options.Applier is required")
	case o.JetStream == nil:
		return o, errors.New("dispatch: Options.JetStream is required")
	case o.AgentBusyTimeout < 0, o.AgentBusyRetry < 0, o.ReleaseTimeout < 0,
		o.LeaseIdleWindow < 0, o.LeaseMaxAge < 0, o.LeaseSweepInterval < 0:
		return o, errors.New("dispatch: Options durations must not be negative")
	}
	o.Operator = o.Operator.WithDefaults()
	if err := o.Operator.Validate(); err != nil {
		return o, fmt.Errorf("dispatch: Options.Operator: %w", err)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.NewID == nil {
		o.NewID = ulid.Make
	}
	if o.Random == nil {
		o.Random = rand.Reader
	}
	if o.LookupEnv == nil {
		o.LookupEnv = func(string) (string, bool) { return "", false }
	}
	if len(o.BrokeredKeys) > 0 && o.Minter == nil {
		return o, errors.New("dispatch: Options.BrokeredKeys need Options.Minter: a brokered key's Secret entry is its placeholder, minted by the credential broker")
	}
	if o.AgentBusyTimeout == 0 {
		o.AgentBusyTimeout = DefaultAgentBusyTimeout
	}
	if o.AgentBusyRetry == 0 {
		o.AgentBusyRetry = DefaultAgentBusyRetry
	}
	if o.ReleaseTimeout == 0 {
		o.ReleaseTimeout = DefaultReleaseTimeout
	}
	if o.SandboxdImage == "" {
		o.SandboxdImage = DefaultSandboxdImage
	}
	if o.SandboxKey != nil && len(o.SandboxKey) < execspec.MinMasterKeySize {
		return o, fmt.Errorf("dispatch: Options.SandboxKey must hold at least %d bytes", execspec.MinMasterKeySize)
	}
	if o.Warm, err = o.Warm.withDefaults(); err != nil {
		return o, err
	}
	if o.Warm.Enabled() && (o.SandboxKey == nil || o.Bind == nil) {
		return o, errors.New("dispatch: warm pools (Options.Warm.Max > 0) need Options.SandboxKey and Options.Bind: their pods serve backend pod")
	}
	if o.OrphanPolicy == "" {
		o.OrphanPolicy = OrphanReport
	}
	if !o.OrphanPolicy.Valid() {
		return o, fmt.Errorf("dispatch: unknown orphan policy %q (delete or report)", o.OrphanPolicy)
	}
	if o.ReconcileInterval <= 0 {
		o.ReconcileInterval = DefaultReconcileInterval
	}
	if o.Concurrency <= 0 {
		o.Concurrency = DefaultConcurrency
	}
	if o.ReconcilePageSize <= 0 {
		o.ReconcilePageSize = workload.DefaultListPageSize
	}
	if o.LeaseIdleWindow == 0 {
		o.LeaseIdleWindow = DefaultLeaseIdleWindow
	}
	if o.LeaseMaxAge == 0 {
		o.LeaseMaxAge = DefaultLeaseMaxAge
	}
	if o.LeaseSweepInterval == 0 {
		o.LeaseSweepInterval = DefaultLeaseSweepInterval
	}
	return o, nil
}
