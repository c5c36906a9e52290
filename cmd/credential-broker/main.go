// Command credential-broker keeps brokered API keys out of the sandbox (issue 27): it mints
// the placeholders pods carry instead of the real values (the mint service on NATS), swaps
// them back at the bound hosts only (a TLS proxy with leaves from the installation CA), meters
// every call from the upstream's own responses, and releases a lease's grants when the run
// stream says it ended.
package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"time"

	"github.com/kubeclip/kubeclip/internal/app"
	"github.com/kubeclip/kubeclip/internal/config"
	"github.com/kubeclip/kubeclip/internal/ops"
	"github.com/kubeclip/kubeclip/pkg/broker"
	"github.com/kubeclip/kubeclip/pkg/broker/brokersvc"
	"github.com/kubeclip/kubeclip/pkg/broker/ca"
	"github.com/kubeclip/kubeclip/pkg/broker/proxy"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/inbox"
)

const (
	component = "credential-broker"
	summary   = "credential-broker swaps the placeholders in brokered pods' model API calls for the real keys, at the bound hosts only, and meters what each call spent.\n`credential-broker ca --help`: making the installation CA it reads."
)

func main() { os.Exit(app.Main(component, run)) }

type settings struct {
	app.Common
	Streams          app.Streams
	Bindings         string
	CACert, CAKey    string
	SealingKey       string
	Listen           string
	UpstreamCA       string
	GrantsPerCompany int
	UsageFlush       time.Duration
	UsageRuns        int
	BindWait         time.Duration
	// The operator's per-company budgets (brokersvc.Budgets): 0 is none.
	CompanyRequestsPerSecond float64
	CompanyRequestBurst      int
	CompanyTokensPerDay      int
}

func run(ctx context.Context, args []string, lookupEnv config.LookupEnv, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "ca" {
		return runCA(args[1:], lookupEnv, stdout, stderr)
	}
	var s settings
	fs := config.New(component, lookupEnv)
	s.Common.Bind(fs)
	s.Streams.Bind(fs)
	fs.String(&s.Bindings, "bindings", "KUBECLIP_BROKER_BINDINGS", "", "JSON file of the brokered keys: {\"KEY\": {\"hosts\": [...], \"headers\": [...], \"errors\": \"anthropic|openai|google\", \"upstreams\": {\"host\": \"host:port\"}}}; it replaces the defaults (ANTHROPIC_API_KEY, OPENAI_API_KEY, GEMINI_API_KEY, GOOGLE_API_KEY at their APIs' hosts)")
	fs.String(&s.CACert, "ca-cert", "KUBECLIP_BROKER_CA_CERT", "", "PEM file of the installation CA's certificate, name-constrained to the bound hosts; required")
	fs.String(&s.CAKey, "ca-key", "KUBECLIP_BROKER_CA_KEY", "", "PEM (PKCS #8) file of the installation CA's key; required")
	fs.String(&s.SealingKey, "sealing-key", "KUBECLIP_BROKER_SEALING_KEY", "", "file of the 32-byte key the grants' values are sealed with (the same on every replica); required")
	fs.String(&s.Listen, "listen", "KUBECLIP_BROKER_LISTEN", ":8443", "TLS listen address of the proxy the bound hosts resolve to in brokered pods")
	fs.String(&s.UpstreamCA, "upstream-ca", "KUBECLIP_BROKER_UPSTREAM_CA", "", "PEM file of CA certificates trusted for the upstreams besides the system's (a private endpoint; tests)")
	fs.Int(&s.GrantsPerCompany, "grants-per-company", "KUBECLIP_BROKER_GRANTS_PER_COMPANY", 0, "grants one company may hold at once; 0: the grants bucket's share of --store-bytes divided among --store-companies at a grant's largest size, the most that fits (and the most allowed)")
	fs.Duration(&s.UsageFlush, "usage-flush", "KUBECLIP_BROKER_USAGE_FLUSH", brokersvc.DefaultUsageFlush, "how often a run's usage event is published at most (and at once when its grant is released); the events carry deltas, so their sum is the upstreams' totals")
	fs.Duration(&s.BindWait, "bind-wait", "KUBECLIP_BROKER_BIND_WAIT", proxy.DefaultBindWait, "how long a call whose placeholder is not bound to its pod yet waits for the run-watcher to report the pod's address before it is refused (503 unbound); an unbound placeholder resolves from no address")
	fs.Int(&s.UsageRuns, "usage-runs", "KUBECLIP_BROKER_USAGE_RUNS", brokersvc.DefaultUsageRuns, "runs whose usage one replica holds in memory until published; a call of one more run is refused (503)")
	fs.Float(&s.CompanyRequestsPerSecond, "company-requests-per-second", "KUBECLIP_BROKER_COMPANY_REQUESTS_PER_SECOND", 0, "most model API calls one company may start per second ON EACH broker replica (counted per replica: a shared rate would put a NATS round trip before every call), so set the company's rate divided by the replicas; past it a call gets 429 in the API's shape; 0: no limit")
	fs.Int(&s.CompanyRequestBurst, "company-request-burst", "KUBECLIP_BROKER_COMPANY_REQUEST_BURST", 0, "calls one company may start at once on a replica within --company-requests-per-second; 0: the rate rounded up")
	fs.Int(&s.CompanyTokensPerDay, "company-tokens-per-day", "KUBECLIP_BROKER_COMPANY_TOKENS_PER_DAY", 0, "most tokens (input plus output, as the model APIs stated them) one company may spend per UTC day, across all replicas (KUBECLIP_BUDGETS); once reached its calls get 429 until midnight UTC (the calls in flight finish); 0: no limit")
	if err := fs.Parse(args); err != nil {
		fs.Usage(stdout, summary)
		return app.Usage(err)
	}
	cfg, err := s.load(fs)
	if err != nil {
		return &app.UsageError{Err: err}
	}

	log := app.NewLogger(stderr, s.LogLevel, component)
	subjects, err := s.Subjects()
	if err != nil {
		return &app.UsageError{Err: err}
	}
	opsSrv, err := s.StartOps(ctx, log)
	if err != nil {
		return err
	}
	defer opsSrv.Close(log)
	nc, js, err := s.Connect(ctx, component, log)
	if err != nil {
		return err
	}
	defer app.Drain(nc, log)
	opsSrv.WatchJetStream(component, js, subjects)
	// The start-up self-check (docs/monitoring.md, Start-up self-check), NATS only: the broker has no Kubernetes
	// client. /readyz fails naming what its user lacks until it holds everything.
	stopSelfCheck, err := s.CheckNATSPermissions(ctx, opsSrv, log, component, subjects)
	if err != nil {
		return err
	}
	defer stopSelfCheck()

	kv, err := events.EnsureBucket(ctx, js, cfg.bucket.Config())
	if err != nil {
		return fmt.Errorf("opening KV bucket %s: %w", broker.Bucket, err)
	}
	store, err := broker.NewStore(broker.StoreOptions{KV: kv, Sealer: cfg.sealer, GrantsPerCompany: cfg.quota})
	if err != nil {
		return err
	}
	publisher, err := events.NewPublisher(events.PublisherOptions{JS: js, Subjects: subjects})
	if err != nil {
		return err
	}
	counters, err := events.EnsureBucket(ctx, js, events.BudgetBucketConfig(s.Streams.Replicas, 0, int64(s.Streams.StoreBytes)))
	if err != nil {
		return fmt.Errorf("opening KV bucket %s: %w", events.BudgetBucket, err)
	}
	budgets, err := brokersvc.NewBudgets(brokersvc.BudgetOptions{
		KV: counters, RequestsPerSecond: s.CompanyRequestsPerSecond, RequestBurst: s.CompanyRequestBurst, TokensPerDay: int64(s.CompanyTokensPerDay),
		RequestsBudget: fs.Names("company-requests-per-second"), TokensBudget: fs.Names("company-tokens-per-day"),
		StoreFailures: events.NewStoreFailures(log, events.BudgetBucket, opsSrv.Metrics.StoreWriteFailed),
		Registerer:    opsSrv.Registry, Log: log,
	})
	if err != nil {
		return err
	}
	usage, err := brokersvc.NewUsage(brokersvc.UsageOptions{
		Publisher: publisher, Budgets: budgets, Registerer: opsSrv.Registry, Log: log, FlushInterval: s.UsageFlush, MaxRuns: s.UsageRuns,
	})
	if err != nil {
		return err
	}
	cache, err := broker.NewCache(broker.CacheOptions{KV: kv, Sealer: cfg.sealer, Log: log, Released: usage.Released})
	if err != nil {
		return err
	}
	px, err := proxy.New(proxy.Options{Routes: cfg.bindings.routes, Resolver: cache, BindWait: s.BindWait, Observer: usage, RootCAs: cfg.upstreamRoots, Registerer: opsSrv.Registry, Log: log})
	if err != nil {
		return err
	}
	releaser, err := brokersvc.NewReleaser(brokersvc.ReleaserOptions{JetStream: js, Subjects: subjects, Store: store, Log: log})
	if err != nil {
		return err
	}
	// The plugin's inbox (--client-inbox-prefixes) and the dispatcher's mint inbox: the two
	// requesters of mints (the CLI is refused the subject by its NATS user).
	replies, err := inbox.NewRule(append(s.ClientPrefixes(), inbox.WorkersMintPrefix))
	if err != nil {
		return &app.UsageError{Err: fmt.Errorf("%s: %w", fs.Names("client-inbox-prefixes"), err)}
	}
	mint, err := brokersvc.NewMint(brokersvc.MintOptions{
		NATS: nc, Subjects: subjects, Store: store, Bindings: cfg.bindings.keys, Key: cfg.sealer.MintKey(), Replies: replies,
		Registerer: opsSrv.Registry, Log: log,
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", s.Listen)
	if err != nil {
		return fmt.Errorf("%s: %w", fs.Names("listen"), err)
	}
	log.Info().Str("addr", ln.Addr().String()).Strs("hosts", cfg.bindings.hosts()).Int("grants_per_company", cfg.quota).Msg("serving the bound hosts")
	// The cache is in before anything is served, so a placeholder minted before this replica
	// started resolves on its first request; the releaser's consumer exists before the first
	// mint, so no end of a lease minted here is missed. Shutdown runs the other way: the proxy
	// drains its calls while the cache still resolves, and then usage publishes what they spent.
	ready := func() { opsSrv.Ready(nc, nil, ops.Check{Name: "grants", Func: cacheLive(cache)}) }
	return app.Serve(ctx, ready, cache, budgets, usage, releaser, mint, &proxyServer{proxy: px, ln: ln, certs: cfg.issuer})
}

// cacheLive is /readyz's check of the grant cache: it fails once the cache's watch ended.
func cacheLive(c *broker.Cache) func(context.Context) error {
	return func(context.Context) error {
		select {
		case <-c.Ready():
			return nil
		default:
			return errors.New("the grant cache is not loaded")
		}
	}
}

// proxyServer is the proxy as a worker: its listener is bound before it starts.
type proxyServer struct {
	proxy *proxy.Proxy
	ln    net.Listener
	certs proxy.Certificates
}

var readyNow = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (p *proxyServer) Ready() <-chan struct{}        { return readyNow }
func (p *proxyServer) Run(ctx context.Context) error { return p.proxy.Serve(ctx, p.ln, p.certs) }

// loaded are the settings read from their files and checked against each other.
type loaded struct {
	bindings      bindings
	issuer        *ca.Issuer
	sealer        *broker.Sealer
	bucket        broker.BucketOptions
	quota         int
	upstreamRoots *x509.CertPool
}

// load checks the settings and reads their files. Errors name the flag and its environment
// variable, and never quote a key.
func (s *settings) load(fs *config.Set) (loaded, error) {
	var l loaded
	var errs []error
	if err := s.Common.Validate(fs); err != nil {
		errs = append(errs, err)
	}
	for _, f := range []struct{ value, flag, why string }{
		{s.CACert, "ca-cert", "the proxy's leaves are minted from it"},
		{s.CAKey, "ca-key", "the proxy's leaves are signed with it"},
		{s.SealingKey, "sealing-key", "the grants' values are sealed with it"},
	} {
		if f.value == "" {
			errs = append(errs, fmt.Errorf("%s is required: %s", fs.Names(f.flag), f.why))
		}
	}
	if s.Listen == "" {
		errs = append(errs, fmt.Errorf("%s must not be empty", fs.Names("listen")))
	}
	if s.UsageFlush <= 0 {
		errs = append(errs, fmt.Errorf("%s must be > 0", fs.Names("usage-flush")))
	}
	if s.BindWait <= 0 {
		errs = append(errs, fmt.Errorf("%s must be > 0", fs.Names("bind-wait")))
	}
	if s.UsageRuns <= 0 {
		errs = append(errs, fmt.Errorf("%s must be > 0", fs.Names("usage-runs")))
	}
	if s.CompanyRequestsPerSecond < 0 || math.IsNaN(s.CompanyRequestsPerSecond) || math.IsInf(s.CompanyRequestsPerSecond, 0) {
		errs = append(errs, fmt.Errorf("%s must be a number ≥ 0 (0: no limit)", fs.Names("company-requests-per-second")))
	}
	if s.CompanyRequestBurst < 0 {
		errs = append(errs, fmt.Errorf("%s must be ≥ 0 (0: the rate rounded up)", fs.Names("company-request-burst")))
	}
	if s.CompanyRequestBurst > 0 && s.CompanyRequestsPerSecond == 0 {
		errs = append(errs, fmt.Errorf("%s needs %s", fs.Names("company-request-burst"), fs.Names("company-requests-per-second")))
	}
	if s.CompanyTokensPerDay < 0 {
		errs = append(errs, fmt.Errorf("%s must be ≥ 0 (0: no limit)", fs.Names("company-tokens-per-day")))
	}
	if err := errors.Join(errs...); err != nil {
		return l, err
	}
	var err error
	if l.bindings, err = loadBindings(s.Bindings); err != nil {
		return l, fmt.Errorf("%s: %w", fs.Names("bindings"), err)
	}
	certPEM, err := os.ReadFile(s.CACert)
	if err != nil {
		return l, fmt.Errorf("%s: %w", fs.Names("ca-cert"), err)
	}
	keyPEM, err := os.ReadFile(s.CAKey)
	if err != nil {
		return l, fmt.Errorf("%s: %w", fs.Names("ca-key"), err)
	}
	authority, err := ca.Parse(certPEM, keyPEM)
	clear(keyPEM)
	if err != nil {
		return l, fmt.Errorf("%s, %s: %w", fs.Names("ca-cert"), fs.Names("ca-key"), err)
	}
	for _, h := range l.bindings.hosts() {
		if !authority.Permits(h) {
			return l, fmt.Errorf("%s: the installation CA's name constraints %v do not cover %s, a host of %s: regenerate the CA with every bound host", fs.Names("ca-cert"), authority.Hosts(), h, fs.Names("bindings"))
		}
	}
	if l.issuer, err = ca.NewIssuer(ca.IssuerOptions{CA: authority, Hosts: l.bindings.hosts()}); err != nil {
		return l, fmt.Errorf("%s: %w", fs.Names("ca-cert"), err)
	}
	if l.sealer, err = broker.LoadSealingKey(s.SealingKey); err != nil {
		return l, fmt.Errorf("%s: %w", fs.Names("sealing-key"), err)
	}
	if s.UpstreamCA != "" {
		pem, err := os.ReadFile(s.UpstreamCA)
		if err != nil {
			return l, fmt.Errorf("%s: %w", fs.Names("upstream-ca"), err)
		}
		if l.upstreamRoots, err = x509.SystemCertPool(); err != nil {
			l.upstreamRoots = x509.NewCertPool()
		}
		if !l.upstreamRoots.AppendCertsFromPEM(pem) {
			return l, fmt.Errorf("%s: %s holds no PEM certificate", fs.Names("upstream-ca"), s.UpstreamCA)
		}
	}
	l.bucket = broker.BucketOptions{StoreBytes: int64(s.Streams.StoreBytes), Companies: s.Streams.Companies, Replicas: s.Streams.Replicas, GrantTTL: s.Streams.LeaseRetention}
	if l.quota = s.GrantsPerCompany; l.quota == 0 {
		l.quota = l.bucket.GrantQuota()
	} else if err := l.bucket.CheckGrantQuota(fs.Names("grants-per-company"), l.quota); err != nil {
		return l, err
	}
	if l.quota <= 0 {
		return l, fmt.Errorf("%s, %s: the grants bucket's share of the store holds no grant per company; raise the store bytes or lower the companies", fs.Names("store-bytes"), fs.Names("store-companies"))
	}
	return l, nil
}
