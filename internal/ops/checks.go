package ops

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"k8s.io/client-go/rest"
)

// NATSCheck passes while the connection is up. A connection that is reconnecting fails it, so
// the worker shows unready during a NATS outage instead of being restarted.
func NATSCheck(nc *nats.Conn) Check {
	return Check{Name: "nats", Func: func(context.Context) error {
		if st := nc.Status(); st != nats.CONNECTED {
			return fmt.Errorf("connection is %s", st)
		}
		return nil
	}}
}

// KubernetesCheck passes while the API server answers its own /readyz with the worker's
// credentials. Every authenticated client may read /readyz (ClusterRole
// system:public-info-viewer), so it needs no RBAC rule of its own.
func KubernetesCheck(c rest.Interface) Check {
	return Check{Name: "kubernetes", Func: func(ctx context.Context) error {
		if err := c.Get().AbsPath("/readyz").Do(ctx).Error(); err != nil {
			return fmt.Errorf("API server /readyz: %w", err)
		}
		return nil
	}}
}
