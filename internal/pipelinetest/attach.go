package pipelinetest

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/inbox"
)

// Attach returns an Env for worker processes that the caller starts one by one (StartWorker)
// against a JetStream server it runs itself, such as the bench's: no worker is started here.
// Close stops those processes and the Env's connection but leaves n running. bin is the
// directory of the worker binaries (empty: Binaries()); kubeconfig is the cluster's.
func Attach(opts Options, n *NATS, bin, kubeconfig string) (*Env, error) {
	e, err := AttachURL(opts, n.URL(), bin, kubeconfig)
	if e != nil {
		e.NATS = n
	}
	return e, err
}

// AttachURL is Attach to the NATS servers at url (comma-separated for a cluster, as
// --nats-url takes it), which the caller runs, such as internal/natstest's cluster.
func AttachURL(opts Options, url, bin, kubeconfig string) (*Env, error) {
	if opts.Name == "" {
		opts.Name = "pipeline"
	}
	if bin == "" {
		var err error
		if bin, err = Binaries(); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp("", "kubeclip-"+opts.Name+"-")
	if err != nil {
		return nil, err
	}
	e := &Env{opts: opts, Bin: bin, Dir: dir, LogDir: filepath.Join(dir, "logs"), Kubeconfig: kubeconfig, natsURL: url, attached: true}
	if err := os.MkdirAll(e.LogDir, 0o755); err != nil {
		return e, err
	}
	e.Subjects, _ = events.NewSubjects("")
	// Its inbox is the CLI's: exec-workers answer only into a client's inbox. It retries its
	// first connection: a cluster's nodes may still be starting.
	e.NC, err = nats.Connect(url, nats.Name("kubeclip-"+opts.Name), nats.CustomInboxPrefix(inbox.CLIPrefix), nats.MaxReconnects(-1),
		nats.ReconnectWait(100*time.Millisecond), nats.RetryOnFailedConnect(true))
	if err != nil {
		return e, fmt.Errorf("connecting to %s: %w", url, err)
	}
	e.JS, err = jetstream.New(e.NC)
	return e, err
}
