// Command dispatcher creates each run's workload (a Job or an agent-sandbox Sandbox) and its
// per-run Secret, keeps one active run per agent, and carries out release and destroy requests.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kubeclip/kubeclip/internal/app"
	"github.com/kubeclip/kubeclip/internal/config"
	"github.com/kubeclip/kubeclip/pkg/broker"
	"github.com/kubeclip/kubeclip/pkg/broker/mintclient"
	"github.com/kubeclip/kubeclip/pkg/dispatch"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execspec"
	"github.com/kubeclip/kubeclip/pkg/sandboxd"
	"github.com/kubeclip/kubeclip/pkg/workload"
)

const summary = "dispatcher creates each run's Job (or Sandbox) and Secret, one run per agent at a time, and releases them."

func main() { os.Exit(app.Main("dispatcher", run)) }

type settings struct {
	app.Common
	Streams          app.Streams
	Tenancy          app.Tenancy
	AdapterSecret    string
	AgentBusyTimeout time.Duration
	ReleaseTimeout   time.Duration
	Concurrency      int
	OrphanPolicy     string
	Reconcile        time.Duration
	ReconcilePage    int
	SandboxKeyFile   string
	SandboxdImage    string
	LeaseIdleWindow  time.Duration
	LeaseMaxAge      time.Duration
	WarmPoolMax      int
	WarmPoolMin      string
	WarmPoolIdle     time.Duration
	BrokeredKeys     []string
}

func run(ctx context.Context, args []string, lookupEnv config.LookupEnv, stdout, stderr io.Writer) error {
	var s settings
	fs := config.New("dispatcher", lookupEnv)
	s.Common.Bind(fs)
	s.Streams.Bind(fs)
	s.Tenancy.Bind(fs)
	fs.String(&s.AdapterSecret, "adapter-secret", "KUBECLIP_ADAPTER_SECRET", "", "namespace/name of an optional Secret holding adapter API keys (ANTHROPIC_API_KEY, ...); keys also come from this process's environment")
	fs.Duration(&s.AgentBusyTimeout, "agent-busy-timeout", "KUBECLIP_AGENT_BUSY_TIMEOUT", dispatch.DefaultAgentBusyTimeout, "how long an acquire waits for its agent's previous run before failing with agent_busy")
	fs.Duration(&s.ReleaseTimeout, "release-timeout", "KUBECLIP_RELEASE_TIMEOUT", dispatch.DefaultReleaseTimeout, "bound on deleting a run's workload and waiting for its pod to go")
	fs.Int(&s.Concurrency, "concurrency", "KUBECLIP_CONCURRENCY", dispatch.DefaultConcurrency, "requests handled at once per consumer (an acquire is mostly API round trips; --kube-qps bounds the API server's load)")
	fs.String(&s.OrphanPolicy, "orphan-policy", "KUBECLIP_ORPHAN_POLICY", string(dispatch.OrphanReport), "what to do with a managed workload (Job, Pod, Sandbox) that has no lease at all: report (log only) or delete; one whose lease was released is always deleted")
	fs.String(&s.SandboxKeyFile, "sandbox-key-file", "KUBECLIP_SANDBOX_KEY_FILE", "", "file holding the installation's sandbox master key (hex or raw, at least 32 bytes; shared with the exec-worker): exec-capable backends (pod, sandbox-cr) need it")
	fs.String(&s.SandboxdImage, "sandboxd-image", "KUBECLIP_SANDBOXD_IMAGE", dispatch.DefaultSandboxdImage, "image of kubeclip's sandboxd, copied into exec-capable pods by an init container")
	fs.Duration(&s.LeaseIdleWindow, "lease-idle-window", "KUBECLIP_LEASE_IDLE_WINDOW", dispatch.DefaultLeaseIdleWindow, "how long a released reusable lease keeps its pod (the agent's next run resumes it at once) before it is suspended: pod deleted, volume kept")
	fs.Duration(&s.LeaseMaxAge, "lease-max-age", "KUBECLIP_LEASE_MAX_AGE", dispatch.DefaultLeaseMaxAge, "how long a suspended reusable lease keeps its volume without a resume before it is collected (destroyed)")
	fs.Int(&s.WarmPoolMax, "warm-pool-max", "KUBECLIP_WARM_POOL_MAX", 0, "the most unbound warm pods (backend pod, started ahead of demand, bound at acquire) one company may have per pod shape; 0 turns warm pools off. Needs --sandbox-key-file; warm pods count against the tenant quota and are evicted before an acquire would fail for it")
	fs.String(&s.WarmPoolMin, "warm-pool-min", "KUBECLIP_WARM_POOL_MIN", "", "pinned minimum warm pods per company, company=N[,company=N] (at most --warm-pool-max), kept from the company's first acquire of a shape on, however idle it is")
	fs.Duration(&s.WarmPoolIdle, "warm-pool-idle", "KUBECLIP_WARM_POOL_IDLE", dispatch.DefaultWarmIdle, "how long after a company's last acquire of a shape its warm pool drains to its pinned minimum")
	fs.Strings(&s.BrokeredKeys, "brokered-keys", "", "KUBECLIP_BROKERED_KEYS", "environment keys the credential broker holds (ANTHROPIC_API_KEY,OPENAI_API_KEY; comma-separated or given many times, as the exec-worker's): a run's Secret carries the lease's placeholder for each, minted by the broker (its NATS user answers paperclip.broker.key and the mint subjects), never the real value; a broker that does not answer or refuses fails the dispatch, naming the key, before anything is created. None (the default): off")
	fs.Duration(&s.Reconcile, "reconcile-interval", "KUBECLIP_RECONCILE_INTERVAL", dispatch.DefaultReconcileInterval, "how often orphaned workloads are looked for (also at start)")
	fs.Int(&s.ReconcilePage, "reconcile-page-size", "KUBECLIP_RECONCILE_PAGE_SIZE", workload.DefaultListPageSize, "workloads per LIST page of the orphan reconcile pass (metadata only); the pass holds one page at a time")
	if err := fs.Parse(args); err != nil {
		fs.Usage(stdout, summary)
		return app.Usage(err)
	}
	secretRef, err := s.Validate(fs)
	if err != nil {
		return &app.UsageError{Err: err}
	}
	op, err := s.Tenancy.Operator(fs)
	if err != nil {
		return &app.UsageError{Err: err}
	}
	warm, err := s.warmOptions(fs)
	if err != nil {
		return &app.UsageError{Err: err}
	}
	brokered, err := broker.KeyNames(s.BrokeredKeys)
	if err != nil {
		return &app.UsageError{Err: fmt.Errorf("%s: %w", fs.Names("brokered-keys"), err)}
	}
	var sandboxKey []byte
	if s.SandboxKeyFile != "" {
		if sandboxKey, err = execspec.ReadMasterKey(s.SandboxKeyFile); err != nil {
			return &app.UsageError{Err: fmt.Errorf("%s: %w", fs.Names("sandbox-key-file"), err)}
		}
	}

	p, err := s.Start(ctx, "dispatcher", s.Streams, stderr)
	if err != nil {
		return err
	}
	defer p.Close()
	if err := s.CheckPermissions(ctx, p, op.RBACNameSuffix); err != nil {
		return err
	}

	var minter dispatch.Minter
	if len(brokered) > 0 {
		if minter, err = mintclient.New(mintclient.Options{NATS: p.NATS, Subjects: p.Subjects}); err != nil {
			return err
		}
	}
	d, err := dispatch.New(dispatch.Options{
		Clientset: p.Kube.Clientset, Dynamic: p.Kube.Dynamic, Metadata: p.Kube.Metadata, Applier: p.Kube.Applier,
		JetStream: p.JS, Subjects: p.Subjects, Logger: p.Log,
		LookupEnv: lookupEnv, AdapterSecret: secretRef, BrokeredKeys: brokered, Minter: minter,
		AgentBusyTimeout: s.AgentBusyTimeout, ReleaseTimeout: s.ReleaseTimeout,
		Concurrency: s.Concurrency, DrainTimeout: s.ShutdownTimeout,
		OrphanPolicy: dispatch.OrphanPolicy(s.OrphanPolicy), ReconcileInterval: s.Reconcile, ReconcilePageSize: int64(s.ReconcilePage),
		Observer: p.Ops.Metrics, Operator: op, StreamReplicas: s.Streams.Replicas, StoreBytes: int64(s.Streams.StoreBytes),
		SandboxKey: sandboxKey, SandboxdImage: s.SandboxdImage,
		LeaseIdleWindow: s.LeaseIdleWindow, LeaseMaxAge: s.LeaseMaxAge,
		Warm: warm, WarmObserver: p.Ops.Metrics, Bind: bindWarmPod, RunObserver: p.Ops.Metrics,
	})
	if err != nil {
		return err
	}
	// The lease records are counted by the dispatcher alone, which moves them most.
	if err := p.Ops.CountLeases(ctx, p.JS); err != nil {
		return err
	}
	if warm.Enabled() {
		p.Ops.CountWarmPools(p.JS)
	}
	return p.Serve(ctx, d)
}

func (s *settings) Validate(fs *config.Set) (types.NamespacedName, error) {
	if err := s.Common.Validate(fs); err != nil {
		return types.NamespacedName{}, err
	}
	if s.AgentBusyTimeout <= 0 {
		return types.NamespacedName{}, fmt.Errorf("%s must be > 0", fs.Names("agent-busy-timeout"))
	}
	if s.ReleaseTimeout <= 0 {
		return types.NamespacedName{}, fmt.Errorf("%s must be > 0", fs.Names("release-timeout"))
	}
	if s.Concurrency <= 0 {
		return types.NamespacedName{}, fmt.Errorf("%s must be > 0", fs.Names("concurrency"))
	}
	if !dispatch.OrphanPolicy(s.OrphanPolicy).Valid() {
		return types.NamespacedName{}, fmt.Errorf("%s must be delete or report, got %q", fs.Names("orphan-policy"), s.OrphanPolicy)
	}
	if s.Reconcile <= 0 {
		return types.NamespacedName{}, fmt.Errorf("%s must be > 0", fs.Names("reconcile-interval"))
	}
	if s.ReconcilePage <= 0 {
		return types.NamespacedName{}, fmt.Errorf("%s must be > 0", fs.Names("reconcile-page-size"))
	}
	if s.LeaseIdleWindow <= 0 {
		return types.NamespacedName{}, fmt.Errorf("%s must be > 0", fs.Names("lease-idle-window"))
	}
	if s.LeaseMaxAge <= 0 {
		return types.NamespacedName{}, fmt.Errorf("%s must be > 0", fs.Names("lease-max-age"))
	}
	if s.AdapterSecret == "" {
		return types.NamespacedName{}, nil
	}
	ns, name, ok := strings.Cut(s.AdapterSecret, "/")
	if !ok || ns == "" || name == "" {
		return types.NamespacedName{}, fmt.Errorf("%s must be namespace/name, got %q", fs.Names("adapter-secret"), s.AdapterSecret)
	}
	return types.NamespacedName{Namespace: ns, Name: name}, nil
}

// warmOptions reads the warm pool flags: the maximum, each pinned minimum (a company id and a
// count within the maximum) and the idle window; warm pools need the sandbox key.
func (s *settings) warmOptions(fs *config.Set) (dispatch.WarmOptions, error) {
	o := dispatch.WarmOptions{Max: s.WarmPoolMax, Idle: s.WarmPoolIdle}
	switch {
	case s.WarmPoolMax < 0:
		return o, fmt.Errorf("%s must be >= 0", fs.Names("warm-pool-max"))
	case s.WarmPoolIdle <= 0:
		return o, fmt.Errorf("%s must be > 0", fs.Names("warm-pool-idle"))
	case s.WarmPoolMax > 0 && s.SandboxKeyFile == "":
		return o, fmt.Errorf("%s needs %s: warm pods are exec pods", fs.Names("warm-pool-max"), fs.Names("sandbox-key-file"))
	}
	if s.WarmPoolMin == "" {
		return o, nil
	}
	o.Min = map[string]int{}
	for entry := range strings.SplitSeq(s.WarmPoolMin, ",") {
		company, count, ok := strings.Cut(strings.TrimSpace(entry), "=")
		n, err := strconv.Atoi(count)
		switch {
		case !ok || company == "" || strings.ContainsAny(company, "/ "):
			return o, fmt.Errorf("%s: %q is not company=N", fs.Names("warm-pool-min"), entry)
		case err != nil || n < 0 || n > s.WarmPoolMax:
			return o, fmt.Errorf("%s: the minimum of company %s must be a count from 0 to %s (%d), got %q", fs.Names("warm-pool-min"), company, fs.Names("warm-pool-max"), s.WarmPoolMax, count)
		}
		o.Min[company] = n
	}
	return o, nil
}

// bindWarmPod is the dispatcher's dispatch.Binder: sandboxd's bind call over TCP. A pod bound to
// another lease (or an address that is another pod's now) can never be this lease's: the
// acquire fails for good, and its cleanup deletes the pod.
func bindWarmPod(ctx context.Context, addr string, bindSeed, leaseSeed []byte, env map[string]string) error {
	err := sandboxd.Bind(ctx, sandboxd.DialTCP(addr), bindSeed, leaseSeed, env)
	if errors.Is(err, sandboxd.ErrBoundElsewhere) {
		return events.Terminalf(events.CodeInternal, "", "the warm pod at %s cannot be bound to the lease: %v", addr, err)
	}
	return err
}
