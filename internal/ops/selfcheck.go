package ops

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// Permission kinds, the "kind" label of kubeclip_permission_missing.
const (
	PermissionKubernetes = "kubernetes"
	PermissionNATS       = "nats"
)

// The self-check's metric names: a contract with the dashboard's alerts and `kubeclip status`.
const (
	MetricSelfCheckOK       = "kubeclip_self_check_ok"
	MetricPermissionMissing = "kubeclip_permission_missing"
)

// Self-check defaults.
const (
	// DefaultSelfCheckInterval is how long the self-check waits before asking again about what
	// is missing: short enough that a fixed RBAC rule shows within a probe period or two, long
	// enough that a worker left without a permission costs the API server nothing to speak of.
	DefaultSelfCheckInterval = 30 * time.Second
	// DefaultSelfCheckConcurrency bounds the probes in flight: the first round costs a few
	// round trips to the API server and NATS however many permissions a worker needs, without
	// a burst that client-go's rate limiter (--kube-burst) would hold back.
	DefaultSelfCheckConcurrency = 8
	// DefaultProbeTimeout bounds one probe; a probe that runs out could not tell, and is asked
	// again next round.
	DefaultProbeTimeout = 5 * time.Second
)

// permissionsCheck is the readiness check's name; logKeyPermission and logKeyPermissionKind are
// the log fields naming a permission (the same text as the metric's labels).
const (
	permissionsCheck     = "permissions"
	logKeyPermission     = "permission"
	logKeyPermissionKind = "kind"
)

// Permission is one thing a worker needs from Kubernetes or NATS, and how to find out whether it
// holds it.
type Permission struct {
	// Kind is PermissionKubernetes or PermissionNATS.
	Kind string
	// Name says what it is, such as "list jobs.batch in all namespaces" or "nats subscribe
	// paperclip.api.ping": the log line and the metric's permission label both carry it.
	Name string
	// Probe reports whether the worker holds the permission: (true, nil) it does, (false, nil)
	// it does not, an error when it could not tell (the API server or NATS did not answer).
	Probe func(ctx context.Context) (bool, error)
}

// SelfCheckOptions configures a SelfCheck.
type SelfCheckOptions struct {
	// Permissions are what the worker needs; each Name once.
	Permissions []Permission
	// Registerer receives kubeclip_self_check_ok and kubeclip_permission_missing; required.
	Registerer prometheus.Registerer
	Logger     zerolog.Logger
	// Interval is how long a round waits for the next while something is missing or could not
	// be checked (default DefaultSelfCheckInterval): an operator who fixes RBAC sees the worker
	// become ready without restarting it.
	Interval time.Duration
	// Concurrency bounds the probes in flight (default DefaultSelfCheckConcurrency).
	Concurrency int
	// ProbeTimeout bounds one probe (default DefaultProbeTimeout).
	ProbeTimeout time.Duration
}

// SelfCheck checks a worker's permissions at start and keeps checking those it lacks until it
// holds them all. It is a readiness Check ("permissions") and exports kubeclip_self_check_ok
// and kubeclip_permission_missing.
type SelfCheck struct {
	opts    SelfCheckOptions
	ok      prometheus.Gauge
	missing *prometheus.GaugeVec

	mu       sync.Mutex
	checked  bool                  // a round has ended
	state    map[string]probeState // by Permission.Name; absent: never probed
	exported map[string]bool       // names with a kubeclip_permission_missing series
}

type probeState struct {
	granted bool
	err     error // could not tell
}

// NewSelfCheck validates opts and registers the metrics: kubeclip_self_check_ok starts at 0,
// as the worker holds nothing it has not checked.
func NewSelfCheck(opts SelfCheckOptions) (*SelfCheck, error) {
	if opts.Registerer == nil {
		return nil, errors.New("ops: SelfCheckOptions.Registerer is required")
	}
	seen := map[string]bool{}
	for _, p := range opts.Permissions {
		switch {
		case p.Kind != PermissionKubernetes && p.Kind != PermissionNATS:
			return nil, fmt.Errorf("ops: permission %q: kind %q is neither %s nor %s", p.Name, p.Kind, PermissionKubernetes, PermissionNATS)
		case p.Name == "" || p.Probe == nil:
			return nil, fmt.Errorf("ops: a %s permission has no name or no probe", p.Kind)
		case seen[p.Name]:
			return nil, fmt.Errorf("ops: permission %q is listed twice", p.Name)
		}
		seen[p.Name] = true
	}
	if opts.Interval <= 0 {
		opts.Interval = DefaultSelfCheckInterval
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = DefaultSelfCheckConcurrency
	}
	if opts.ProbeTimeout <= 0 {
		opts.ProbeTimeout = DefaultProbeTimeout
	}
	s := &SelfCheck{
		opts: opts,
		ok: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: MetricSelfCheckOK,
			Help: "1 once the start-up self-check found every permission the worker needs (Kubernetes and NATS), 0 while one is missing or could not be checked.",
		}),
		missing: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: MetricPermissionMissing,
			Help: "1 for each permission the self-check found missing, by kind (kubernetes, nats) and permission (as the worker's log names it); the series goes when it is granted.",
		}, []string{"kind", "permission"}),
		state:    map[string]probeState{},
		exported: map[string]bool{},
	}
	for _, c := range []prometheus.Collector{s.ok, s.missing} {
		if err := opts.Registerer.Register(c); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Run checks every permission, then, while one is missing or could not be checked, checks those
// again every Interval. It returns once all are held, or when ctx ends.
func (s *SelfCheck) Run(ctx context.Context) {
	start := time.Now()
	for {
		if s.round(ctx) {
			s.opts.Logger.Info().Int("permissions", len(s.opts.Permissions)).Int64("took_ms", time.Since(start).Milliseconds()).
				Msg("self-check: every permission is held")
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(s.opts.Interval):
		}
	}
}

// round probes every permission not yet held, at most Concurrency at once, records what it
// found and reports whether all are held.
func (s *SelfCheck) round(ctx context.Context) bool {
	var pending []Permission
	s.mu.Lock()
	for _, p := range s.opts.Permissions {
		if !s.state[p.Name].granted {
			pending = append(pending, p)
		}
	}
	s.mu.Unlock()
	results := make([]probeState, len(pending))
	sem := make(chan struct{}, s.opts.Concurrency)
	var wg sync.WaitGroup
	for i, p := range pending {
		wg.Go(func() {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				results[i] = probeState{err: ctx.Err()}
				return
			}
			defer func() { <-sem }()
			pctx, cancel := context.WithTimeout(ctx, s.opts.ProbeTimeout)
			defer cancel()
			granted, err := p.Probe(pctx)
			results[i] = probeState{granted: granted && err == nil, err: err}
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return false // shutting down: what the probes saw says nothing
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, p := range pending {
		s.record(p, s.state[p.Name], results[i])
		s.state[p.Name] = results[i]
	}
	s.checked = true
	all := true
	for _, p := range s.opts.Permissions {
		all = all && s.state[p.Name].granted
	}
	if all {
		s.ok.Set(1)
	}
	return all
}

// record logs and exports a permission's change from was to now: one error line when it is
// found missing, one line when it is granted after all, a warning when it could not be checked
// (its series, if any, stays until it is seen granted). Called with mu held.
func (s *SelfCheck) record(p Permission, was, now probeState) {
	switch {
	case now.err != nil:
		if was.err == nil || was.err.Error() != now.err.Error() {
			s.opts.Logger.Warn().Err(now.err).Str(logKeyPermissionKind, p.Kind).Str(logKeyPermission, p.Name).
				Msg("self-check: could not check a permission; checking again later")
		}
	case now.granted:
		if s.exported[p.Name] {
			delete(s.exported, p.Name)
			s.missing.DeleteLabelValues(p.Kind, p.Name)
			s.opts.Logger.Info().Str(logKeyPermissionKind, p.Kind).Str(logKeyPermission, p.Name).Msg("self-check: permission granted")
		}
	case !s.exported[p.Name]:
		s.exported[p.Name] = true
		s.missing.WithLabelValues(p.Kind, p.Name).Set(1)
		s.opts.Logger.Error().Str(logKeyPermissionKind, p.Kind).Str(logKeyPermission, p.Name).
			Msg("self-check: missing permission")
	}
}

// Check is the readiness check "permissions": it fails until the first round ended, and while a
// permission is missing (naming each) or could not be checked.
func (s *SelfCheck) Check() Check {
	return Check{Name: permissionsCheck, Func: func(context.Context) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		if !s.checked {
			return errors.New("checking the worker's permissions")
		}
		var missing, unknown []string
		for _, p := range s.opts.Permissions {
			st := s.state[p.Name]
			switch {
			case st.granted:
			case st.err != nil:
				unknown = append(unknown, p.Name)
			default:
				missing = append(missing, p.Kind+": "+p.Name)
			}
		}
		var parts []string
		if len(missing) > 0 {
			parts = append(parts, "missing "+strings.Join(missing, "; "))
		}
		if len(unknown) > 0 {
			parts = append(parts, "could not check "+strings.Join(unknown, "; "))
		}
		if len(parts) > 0 {
			return errors.New(strings.Join(parts, "; "))
		}
		return nil
	}}
}
