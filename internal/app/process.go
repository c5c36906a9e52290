package app

import (
	"context"
	"io"
	"os"
	"runtime/debug"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/pkg/api"
	"github.com/kubeclip/kubeclip/pkg/events"
)

// Process is what every worker binary sets up before its own component: the logger, the ops
// server, the Kubernetes clients, and the NATS connection with the streams in place.
type Process struct {
	Log      zerolog.Logger
	Ops      *Ops
	Kube     *Kube
	NATS     *nats.Conn
	JS       jetstream.JetStream
	Subjects events.Subjects

	component     string
	stopSelfCheck func()
}

// Start sets up the process of component. The ops server starts first so probes answer (not
// ready) while the connections come up; Serve turns it ready once the workers serve. Close
// undoes it.
func (c *Common) Start(ctx context.Context, component string, st Streams, stderr io.Writer) (p *Process, err error) {
	p = &Process{Log: NewLogger(stderr, c.LogLevel, component), component: component}
	defer func() {
		if err != nil {
			p.Close()
		}
	}()
	if p.Subjects, err = c.Subjects(); err != nil {
		return p, &UsageError{Err: err}
	}
	if p.Ops, err = c.StartOps(ctx, p.Log); err != nil {
		return p, err
	}
	if p.Kube, err = c.Kubernetes(component, p.Ops.Metrics.KubernetesTransport); err != nil {
		return p, err
	}
	if p.NATS, p.JS, err = c.JetStream(ctx, component, st, p.Log); err != nil {
		return p, err
	}
	p.Ops.watchJetStream(component, p.JS, p.Subjects)
	// Clients (the Paperclip plugin's probe) ask which workers are up.
	host, _ := os.Hostname()
	serve := api.ServeOptions{Subjects: p.Subjects, Replies: c.Replies(), Logger: p.Log, Observer: p.Ops.Metrics}
	if _, err = api.ServePing(p.NATS, serve, api.PingReply{Worker: component, Replica: host, Version: Version()}); err != nil {
		return p, err
	}
	return p, nil
}

// Version is the binary's module version, "dev" for a build from a checkout.
func Version() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

// Close drains the NATS connection, so events and acks in flight reach the server, then stops
// the ops server. Call it after the component returned.
func (p *Process) Close() {
	if p.stopSelfCheck != nil {
		p.stopSelfCheck()
	}
	if p.NATS != nil {
		Drain(p.NATS, p.Log)
	}
	if p.Ops != nil {
		p.Ops.Close(p.Log)
	}
}
