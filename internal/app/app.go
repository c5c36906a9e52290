// Package app holds the process wiring the kubeclip binaries share: common settings, the
// logger, the NATS connection and the mapping of errors to exit codes.
package app

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/internal/cli"
	"github.com/kubeclip/kubeclip/internal/config"
	"github.com/kubeclip/kubeclip/internal/ops"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/inbox"
	"github.com/kubeclip/kubeclip/pkg/k8s"
)

// Common are the settings every worker has.
type Common struct {
	NATSURL         string
	SubjectPrefix   string
	Kubeconfig      string
	KubeQPS         float64
	KubeBurst       int
	LogLevel        string
	ShutdownTimeout time.Duration
	// NATS holds the NATS authentication and TLS settings.
	NATS NATSAuth
	// OpsAddr is where /healthz, /readyz and /metrics are served; empty turns them off.
	OpsAddr string
	// Pprof serves Go's runtime profiles on the ops server too (/debug/pprof/).
	Pprof bool
	// DefaultLogLevel, when set before Bind, replaces "info" as --log-level's default.
	DefaultLogLevel string
	// ClientInboxPrefixes are the inbox prefixes of the client users (Paperclip's plugin, the
	// CLI), comma-separated: the only subjects a worker's responders answer into (pkg/inbox).
	ClientInboxPrefixes string
	// SelfCheckInterval is how often the start-up self-check asks again about what is missing.
	SelfCheckInterval time.Duration
}

// Bind registers the common settings on s.
func (c *Common) Bind(s *config.Set) {
	s.String(&c.NATSURL, "nats-url", "KUBECLIP_NATS_URL", nats.DefaultURL, "NATS server URL (comma-separated for a cluster)")
	s.String(&c.SubjectPrefix, "subject-prefix", "KUBECLIP_SUBJECT_PREFIX", "paperclip", "first token of the lease and run subjects")
	s.String(&c.Kubeconfig, "kubeconfig", "KUBECLIP_KUBECONFIG", "", "kubeconfig file; empty uses the in-cluster config, then $KUBECONFIG")
	// The defaults and their reason are pkg/k8s's (DefaultQPS).
	s.Float(&c.KubeQPS, "kube-qps", "KUBECLIP_KUBE_QPS", float64(k8s.DefaultQPS), "client-side rate limit for Kubernetes API requests per second")
	s.Int(&c.KubeBurst, "kube-burst", "KUBECLIP_KUBE_BURST", k8s.DefaultBurst, "client-side burst for Kubernetes API requests")
	level := c.DefaultLogLevel
	if level == "" {
		level = "info"
	}
	s.String(&c.LogLevel, "log-level", "KUBECLIP_LOG_LEVEL", level, "log level: debug, info, warn or error")
	// The default and its reason are pkg/events's (DefaultDrainTimeout).
	s.Duration(&c.ShutdownTimeout, "shutdown-timeout", "KUBECLIP_SHUTDOWN_TIMEOUT", events.DefaultDrainTimeout, "how long in-flight work may take to finish after SIGTERM")
	c.NATS.Bind(s)
	s.String(&c.ClientInboxPrefixes, "client-inbox-prefixes", "KUBECLIP_CLIENT_INBOX_PREFIXES", strings.Join(inbox.DefaultClientPrefixes(), ","),
		"comma-separated inbox prefixes of the client users (nats-auth.conf): the only subjects the workers answer requests into")
	s.Duration(&c.SelfCheckInterval, "self-check-interval", "KUBECLIP_SELF_CHECK_INTERVAL", ops.DefaultSelfCheckInterval,
		"how often a worker asks again about the Kubernetes and NATS permissions its start-up self-check found missing (or could not check), until it holds them all; /readyz fails until then")
	// Off by default: several workers (or replicas in tests) on one host would fight over one
	// port. The manifests and the compose file set it.
	s.String(&c.OpsAddr, "ops-addr", "KUBECLIP_OPS_ADDR", "", "listen address of /healthz, /readyz and /metrics, such as :8080; empty: not served")
	s.Bool(&c.Pprof, "pprof", "KUBECLIP_PPROF", false, "also serve Go's runtime profiles (heap, goroutines, CPU) under /debug/pprof/ on --ops-addr")
}

// Validate checks the common settings; errors name the flag and its environment variable.
func (c *Common) Validate(s *config.Set) error {
	var errs []error
	if strings.TrimSpace(c.NATSURL) == "" {
		errs = append(errs, fmt.Errorf("%s must not be empty", s.Names("nats-url")))
	}
	if c.KubeQPS <= 0 {
		errs = append(errs, fmt.Errorf("%s must be > 0", s.Names("kube-qps")))
	}
	if c.KubeBurst <= 0 {
		errs = append(errs, fmt.Errorf("%s must be > 0", s.Names("kube-burst")))
	}
	if _, err := zerolog.ParseLevel(c.LogLevel); err != nil || c.LogLevel == "" {
		errs = append(errs, fmt.Errorf("%s: unknown level %q", s.Names("log-level"), c.LogLevel))
	}
	if c.SelfCheckInterval <= 0 {
		errs = append(errs, fmt.Errorf("%s must be > 0", s.Names("self-check-interval")))
	}
	if c.ShutdownTimeout <= 0 {
		errs = append(errs, fmt.Errorf("%s must be > 0", s.Names("shutdown-timeout")))
	}
	if c.Pprof && c.OpsAddr == "" {
		errs = append(errs, fmt.Errorf("%s needs %s: the profiles are served there", s.Names("pprof"), s.Names("ops-addr")))
	}
	if err := c.NATS.Validate(s); err != nil {
		errs = append(errs, err)
	}
	if _, err := c.replies(); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", s.Names("client-inbox-prefixes"), err))
	}
	return errors.Join(errs...)
}

// Replies is the rule of --client-inbox-prefixes: where the worker's responders answer. Call it
// after Validate.
func (c *Common) Replies() inbox.Rule {
	r, _ := c.replies()
	return r
}

func (c *Common) replies() (inbox.Rule, error) {
	return inbox.NewRule(c.clientInboxPrefixes())
}

// ClientPrefixes are the prefixes of --client-inbox-prefixes (for a responder that answers
// one more inbox, the credential broker).
func (c *Common) ClientPrefixes() []string { return c.clientInboxPrefixes() }

// clientInboxPrefixes are the prefixes of --client-inbox-prefixes.
func (c *Common) clientInboxPrefixes() []string {
	var prefixes []string
	for _, p := range strings.Split(c.ClientInboxPrefixes, ",") {
		if p = strings.TrimSpace(p); p != "" {
			prefixes = append(prefixes, p)
		}
	}
	return prefixes
}

// NewLogger returns a JSON logger for component writing to w (see cli.NewLogger).
func NewLogger(w io.Writer, level, component string) zerolog.Logger {
	return cli.NewLogger(w, level, component)
}

// ConnectNATS connects to url and keeps reconnecting for the life of the process, so a NATS
// restart pauses the worker instead of killing it.
func ConnectNATS(url, name string, log zerolog.Logger, extra ...nats.Option) (*nats.Conn, error) {
	opts := []nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.RetryOnFailedConnect(true),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil { // nil: we closed it ourselves
				log.Warn().Err(err).Msg("disconnected from NATS")
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info().Str("url", nc.ConnectedUrlRedacted()).Msg("reconnected to NATS")
		}),
	}
	nc, err := nats.Connect(url, append(opts, extra...)...)
	if err != nil {
		return nil, fmt.Errorf("connecting to NATS: %w", err)
	}
	return nc, nil
}

// UsageError marks a configuration error: the process exits 2 (see internal/cli).
type UsageError = cli.UsageError

// ExitStatus propagates the exit status of a command run on someone's behalf (see cli.ExitStatus).
type ExitStatus = cli.ExitStatus

// ExitCode maps the error returned by a binary's run function to its exit status (see cli.ExitCode).
func ExitCode(err error) int { return cli.ExitCode(err) }

// Usage maps a flag parse error: --help is not an error, anything else is a UsageError.
func Usage(err error) error { return cli.Usage(err) }

// natsDrainTimeout bounds the NATS connection's drain at the end of a worker's shutdown, after
// the workers' own drain (events.DefaultDrainTimeout): the manifests' terminationGracePeriodSeconds
// (40 s) covers both.
const natsDrainTimeout = 10 * time.Second

// Drain drains the NATS connection last, after the workers stopped, so published events and
// acks in flight reach the server.
func Drain(nc *nats.Conn, log zerolog.Logger) {
	closed := make(chan struct{})
	nc.SetClosedHandler(func(*nats.Conn) { close(closed) })
	if err := nc.Drain(); err != nil {
		log.Warn().Err(err).Msg("draining the NATS connection failed")
		nc.Close()
		return
	}
	select {
	case <-closed:
	case <-time.After(natsDrainTimeout):
		log.Warn().Dur("timeout", natsDrainTimeout).Msg("NATS connection did not drain; closing it")
		nc.Close()
	}
}

// RunFunc is a binary's run function: everything main does, with the process's parts passed in.
type RunFunc = cli.RunFunc

// Main runs run with a context cancelled by SIGINT or SIGTERM, reports its error on stderr, and
// returns the exit code for main to exit with.
func Main(name string, run RunFunc) int { return cli.Main(name, run) }
