package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"

	"github.com/kubeclip/kubeclip/internal/app"
	"github.com/kubeclip/kubeclip/internal/config"
	"github.com/kubeclip/kubeclip/internal/embeddednats"
	"github.com/kubeclip/kubeclip/pkg/dispatch"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/policy"
	"github.com/kubeclip/kubeclip/pkg/runwatch"
	"github.com/kubeclip/kubeclip/pkg/tenant"
)

const demoSummary = `demo runs the whole pipeline in one process: an embedded JetStream server, the tenant-worker,
the dispatcher and the run-watcher; it submits a lease for the agent stub and prints its live
logs and result, then releases it.`

// demoConfig is the provider config of the demo's lease: the Job backend and an adapter whose
// runtime is the locally built agent stub, told by its env to print a line every 300 ms.
const demoConfig = `{
  "backend": "job",
  "podActivityDeadlineSec": 300,
  "adapters": [{
    "adapterType": "claude_local",
    "runtimeImage": "kubeclip.local/agent-stub:dev",
    "envKeys": ["ANTHROPIC_API_KEY"],
    "allowFqdns": ["api.anthropic.com"],
    "defaultEnv": {"STUB_LINES": "12", "STUB_INTERVAL": "300ms", "STUB_STDERR": "stub: a line on stderr"}
  }],
  "defaultResources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"cpu": "500m", "memory": "256Mi"}}
}`

func runDemo(ctx context.Context, args []string, lookupEnv config.LookupEnv, stdout, stderr io.Writer) error {
	// The workers' records would drown the run's output: the demo logs warnings only.
	common := app.Common{DefaultLogLevel: "warn"}
	var natsURL, configPath string
	fs := config.New("kubeclip demo", lookupEnv)
	common.Bind(fs)
	// The demo's NATS defaults to an embedded server; --nats-url points it at a real one.
	fs.String(&natsURL, "demo-nats-url", "KUBECLIP_DEMO_NATS_URL", "", "NATS server to use instead of the embedded one")
	fs.String(&configPath, "config", "KUBECLIP_PROVIDER_CONFIG", "", "provider config JSON file; empty uses the agent stub")
	if err := parse(fs, args, stdout, demoSummary); err != nil {
		return err
	}
	if err := common.Validate(fs); err != nil {
		return &app.UsageError{Err: err}
	}
	cfg := json.RawMessage(demoConfig)
	if configPath != "" {
		raw, err := readConfig(configPath)
		if err != nil {
			return &app.UsageError{Err: err}
		}
		cfg = raw
	}
	log := app.NewLogger(stderr, common.LogLevel, "demo")

	if natsURL == "" {
		dir, err := os.MkdirTemp("", "kubeclip-demo-nats-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		srv, err := embeddednats.Start(embeddednats.Options{StoreDir: dir, Port: -1})
		if err != nil {
			return err
		}
		defer embeddednats.Shutdown(srv)
		natsURL = srv.ClientURL()
		fmt.Fprintf(stdout, "embedded JetStream at %s\n", natsURL)
	}
	common.NATSURL = natsURL

	kube, err := common.Kubernetes("demo", nil)
	if err != nil {
		return err
	}
	subjects, err := common.Subjects()
	if err != nil {
		return err
	}
	nc, js, err := common.JetStream(ctx, "demo", app.Streams{}, log)
	if err != nil {
		return err
	}
	defer app.Drain(nc, log)

	// The workers' default: the local cluster's images are preloaded (pulled IfNotPresent), as the
	// nodes have no registry to pull the agent stub from.
	operator := policy.Operator{PreloadedImages: policy.DefaultPreloadedImages}
	tw, err := tenant.New(tenant.Options{Clientset: kube.Clientset, Applier: kube.Applier, JetStream: js, Subjects: subjects, Logger: log, Replies: common.Replies(), Operator: operator})
	if err != nil {
		return err
	}
	d, err := dispatch.New(dispatch.Options{
		Clientset: kube.Clientset, Dynamic: kube.Dynamic, Metadata: kube.Metadata, Applier: kube.Applier,
		JetStream: js, Subjects: subjects, Logger: log, LookupEnv: lookupEnv, Operator: operator,
	})
	if err != nil {
		return err
	}
	rw, err := runwatch.New(runwatch.Options{Clientset: kube.Clientset, Dynamic: kube.Dynamic, JetStream: js, Subjects: subjects, Logger: log})
	if err != nil {
		return err
	}
	workers, stopWorkers := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- app.Serve(workers, nil, tw, d, rw) }()
	defer func() {
		stopWorkers()
		if err := <-served; err != nil && !errors.Is(err, context.Canceled) {
			log.Warn().Err(err).Msg("a worker stopped with an error")
		}
	}()

	req := events.AcquireRequest{
		RunID: strings.ToLower(ulid.Make().String()), CompanyID: "demo-company", EnvironmentID: "local",
		AgentID: "demo-agent", Config: cfg,
	}
	if err := publishAcquire(ctx, js, subjects, req); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "acquire published: company %s, agent %s, run %s\n", req.CompanyID, req.AgentID, req.RunID)

	var lease string
	var outcome events.Outcome
	p := printer{w: stdout}
	err = events.Follow(ctx, js, subjects, req.CompanyID, req.RunID, events.FollowOptions{}, func(r events.Received) error {
		p.print(r)
		switch ev := r.Event.(type) {
		case events.RunCreatedEvent:
			lease = ev.ProviderLeaseID
		case events.RunResultEvent:
			outcome = ev.Outcome
			return events.ErrStopFollowing
		case events.RunFailedEvent:
			return fmt.Errorf("the lease was not granted: %s", ev.Message)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if lease != "" {
		if err := releaseAndWait(ctx, js, subjects, req, lease, p); err != nil {
			return err
		}
	}
	if outcome != events.OutcomeSucceeded {
		return fmt.Errorf("the demo run ended %s", outcome)
	}
	return nil
}

// releaseAndWait releases the demo's lease and prints the released event.
func releaseAndWait(ctx context.Context, js jetstream.JetStream, s events.Subjects, acq events.AcquireRequest, lease string, p printer) error {
	pub, err := events.NewPublisher(events.PublisherOptions{JS: js, Subjects: s})
	if err != nil {
		return err
	}
	rel := events.ReleaseRequest{RunID: acq.RunID, CompanyID: acq.CompanyID, ProviderLeaseID: lease}
	if _, err := pub.Publish(ctx, rel); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return events.Follow(wctx, js, s, acq.CompanyID, acq.RunID, events.FollowOptions{}, func(r events.Received) error {
		if _, ok := r.Event.(events.RunReleasedEvent); ok {
			p.print(r)
			return events.ErrStopFollowing
		}
		return nil
	})
}
