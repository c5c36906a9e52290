package app

import (
	"context"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/internal/ops"
	"github.com/kubeclip/kubeclip/pkg/events"
)

// CheckPermissions starts the worker's start-up self-check (docs/monitoring.md, Start-up self-check): it asks
// the API server about each cluster-wide access of KubernetesAccesses, and NATS about each
// subject of natsNeeds, all at once (bounded), then every --self-check-interval (30 s) about
// what is missing, until the worker holds everything. Until then /readyz fails its "permissions" check naming what is
// missing, the log has one error line per missing permission, and kubeclip_self_check_ok and
// kubeclip_permission_missing say so. rbacNameSuffix is the operator's --rbac-name-suffix (the
// tenant-worker binds the suffixed tenant ClusterRoles; other workers pass what they have, or
// ""). Call it after Start, before Serve; p.Close stops it.
func (c *Common) CheckPermissions(ctx context.Context, p *Process, rbacNameSuffix string) error {
	probes := c.NATSProbes(p.component)
	reviews := p.Kube.Clientset.AuthorizationV1().SelfSubjectAccessReviews()
	stop, err := c.startSelfCheck(ctx, p.Ops, p.Log, probes, c.permissions(p.component, rbacNameSuffix, p.Subjects, reviews, probes))
	if err != nil {
		return err
	}
	p.stopSelfCheck = stop
	return nil
}

// CheckNATSPermissions is CheckPermissions for a worker with no Kubernetes client (the
// credential broker), which connects without Start: it asks NATS only. Call the returned stop
// before o.Close.
func (c *Common) CheckNATSPermissions(ctx context.Context, o *Ops, log zerolog.Logger, component string, s events.Subjects) (stop func(), err error) {
	probes := c.NATSProbes(component)
	return c.startSelfCheck(ctx, o, log, probes, c.NATSPermissions(component, s, probes))
}

func (c *Common) startSelfCheck(ctx context.Context, o *Ops, log zerolog.Logger, probes *ops.NATSProbes, perms []ops.Permission) (func(), error) {
	sc, err := ops.NewSelfCheck(ops.SelfCheckOptions{
		Permissions: perms,
		Registerer:  o.Registry,
		Logger:      log,
		Interval:    c.SelfCheckInterval,
	})
	if err != nil {
		probes.Close()
		return nil, err
	}
	o.selfCheck = sc
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer probes.Close()
		sc.Run(ctx)
	}()
	return func() { cancel(); <-done }, nil
}

// NATSProbes are the self-check's NATS probes of component: they connect as component does (its
// credentials and inbox prefix) on a connection of their own, so the permission violations they
// provoke reach their error handler alone. The connection does not retry: a probe that cannot
// connect is tried again next round. Close them when done.
func (c *Common) NATSProbes(component string) *ops.NATSProbes {
	return ops.NewNATSProbes(func(extra ...nats.Option) (*nats.Conn, error) {
		auth, err := c.NATS.Options()
		if err != nil {
			return nil, err
		}
		opts := append(auth, nats.Name("kubeclip-"+component+"-self-check"), nats.CustomInboxPrefix(InboxPrefix(component)))
		return nats.Connect(c.NATSURL, append(opts, extra...)...)
	})
}
