package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"

	"github.com/kubeclip/kubeclip/internal/app"
	"github.com/kubeclip/kubeclip/internal/config"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/inbox"
)

// client are the settings every command that talks to NATS has.
type client struct {
	NATSURL string
	Prefix  string
	NATS    app.NATSAuth
}

func (c *client) bind(fs *config.Set) {
	fs.String(&c.NATSURL, "nats-url", "KUBECLIP_NATS_URL", nats.DefaultURL, "NATS server URL")
	fs.String(&c.Prefix, "subject-prefix", "KUBECLIP_SUBJECT_PREFIX", events.DefaultPrefix, "first token of the lease and run subjects")
	c.NATS.Bind(fs)
}

func (c *client) connect() (*nats.Conn, jetstream.JetStream, events.Subjects, error) {
	s, err := events.NewSubjects(c.Prefix)
	if err != nil {
		return nil, nil, events.Subjects{}, &app.UsageError{Err: err}
	}
	auth, err := c.NATS.Options()
	if err != nil {
		return nil, nil, events.Subjects{}, &app.UsageError{Err: err}
	}
	nc, err := nats.Connect(c.NATSURL, append(auth, nats.Name("kubeclip-cli"), nats.CustomInboxPrefix(c.inboxPrefix()))...)
	if err != nil {
		return nil, nil, events.Subjects{}, fmt.Errorf("connecting to NATS at %s: %w", c.NATSURL, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, events.Subjects{}, err
	}
	return nc, js, s, nil
}

// statusUser is the read-only operator user nats-auth.conf gives `kubeclip status`.
const statusUser = "status"

// inboxPrefix is where the CLI receives: each of its users (nats-auth.conf) may subscribe to its
// own inboxes only, the status user to _INBOX_status, the cli user (and any other) to _INBOX_cli.
func (c *client) inboxPrefix() string {
	if c.NATS.User == statusUser {
		return inbox.StatusPrefix
	}
	return inbox.CLIPrefix
}

// parse parses a command's flags, printing its usage for --help or a bad flag.
func parse(fs *config.Set, args []string, stdout io.Writer, summary string) error {
	if err := fs.Parse(args); err != nil {
		fs.Usage(stdout, summary)
		return app.Usage(err)
	}
	return nil
}

func runAcquire(ctx context.Context, args []string, lookupEnv config.LookupEnv, stdout io.Writer) error {
	var c client
	var req events.AcquireRequest
	var configPath string
	var follow bool
	fs := config.New("kubeclip acquire", lookupEnv)
	c.bind(fs)
	fs.String(&req.CompanyID, "company", "KUBECLIP_COMPANY", "", "company id (required)")
	fs.String(&req.AgentID, "agent", "KUBECLIP_AGENT", "", "agent id (required)")
	fs.String(&req.RunID, "run", "KUBECLIP_RUN", "", "run id; empty generates one")
	fs.String(&req.EnvironmentID, "environment", "KUBECLIP_ENVIRONMENT", "local", "Paperclip environment id")
	fs.String(&req.AdapterType, "adapter-type", "KUBECLIP_ADAPTER_TYPE", "", "per-run adapter type; empty uses the config's")
	fs.String(&req.IssueID, "issue", "KUBECLIP_ISSUE", "", "issue id")
	fs.String(&configPath, "config", "KUBECLIP_PROVIDER_CONFIG", "", `provider config JSON file ("-" for stdin); empty means {"backend":"job"}`)
	fs.Bool(&req.ReuseLease, "reuse-lease", "KUBECLIP_REUSE_LEASE", false, "a reusable lease (backend pod): a release keeps its pod, then its volume, for a resume (kubeclip lease)")
	fs.Bool(&follow, "follow", "KUBECLIP_FOLLOW", false, "follow the run's events until its result")
	if err := parse(fs, args, stdout, "acquire publishes a lease request for a run."); err != nil {
		return err
	}
	if err := required(fs, flagValue{"company", req.CompanyID}, flagValue{"agent", req.AgentID}); err != nil {
		return err
	}
	if req.RunID == "" {
		req.RunID = strings.ToLower(ulid.Make().String())
	}
	raw, err := readConfig(configPath)
	if err != nil {
		return &app.UsageError{Err: err}
	}
	req.Config = raw

	nc, js, s, err := c.connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	if err := publishAcquire(ctx, js, s, req); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "acquire published: company %s, run %s\n", req.CompanyID, req.RunID)
	if !follow {
		return nil
	}
	return followUntilResult(ctx, js, s, req.CompanyID, req.RunID, printer{w: stdout})
}

func publishAcquire(ctx context.Context, js jetstream.JetStream, s events.Subjects, req events.AcquireRequest) error {
	pub, err := events.NewPublisher(events.PublisherOptions{JS: js, Subjects: s})
	if err != nil {
		return err
	}
	if _, err := pub.Publish(ctx, req); err != nil {
		return fmt.Errorf("publishing acquire: %w", err)
	}
	return nil
}

func readConfig(path string) (json.RawMessage, error) {
	var data []byte
	var err error
	switch path {
	case "":
		return json.RawMessage(`{"backend":"job"}`), nil
	case "-":
		data, err = io.ReadAll(os.Stdin)
	default:
		data, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, fmt.Errorf("reading provider config: %w", err)
	}
	if !json.Valid(data) {
		return nil, fmt.Errorf("provider config %s is not valid JSON", path)
	}
	return data, nil
}

// runRelease is `kubeclip release`, the code path of `kubeclip lease destroy` (releaseLease).
func runRelease(ctx context.Context, args []string, lookupEnv config.LookupEnv, stdout io.Writer) error {
	return releaseLease(ctx, "kubeclip release", args, lookupEnv, stdout, false)
}
