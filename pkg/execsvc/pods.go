package execsvc

import (
	"context"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
)

// Pod is the pod of an exec-capable lease as the service needs it.
type Pod struct {
	Namespace string
	Name      string
	// UID tells a pod from a later one of the same name.
	UID string
	// Addr is sandboxd's TLS address, <podIP>:7070 (the daemon route).
	Addr string
}

// Pods finds the pods of exec-capable leases. PodWatcher is the informer-backed one the
// exec-worker runs; tests point the service at local sandboxd processes with their own.
type Pods interface {
	// Ready returns the lease's pod once it is ready to run commands (Running, PodReady, with an
	// IP, not being deleted), waiting for it until ctx ends.
	Ready(ctx context.Context, ref events.RunRef, rec lease.Record) (Pod, error)
	// Current returns the lease's pod as last seen, whatever its readiness; ok is false when no
	// pod of the lease exists (or it is being deleted).
	Current(ref events.RunRef, rec lease.Record) (Pod, bool)
}
