package execsvc

import (
	"github.com/kubeclip/kubeclip/pkg/sandboxd"
)

// Route is how the service reaches the sandboxd of a pod.
type Route interface {
	// Name is the route's --exec-route value, for logs.
	Name() string
	// Client returns a client of pod's sandboxd; seed is the pod's lease seed.
	Client(pod Pod, seed []byte) (*sandboxd.Client, error)
}

// Route names, the values of the exec-worker's --exec-route.
const (
	RouteDaemon   = "daemon"
	RouteKubeExec = "kube-exec"
)

// connsPerLease is how many kept-alive connections a lease's client holds: Paperclip runs up
// to four execs at once plus bridge polls and log tails on one lease; every running exec holds
// one connection for its output stream, and more are opened past this when needed.
const connsPerLease = 16

// DaemonRoute dials sandboxd's TLS port on the pod's IP directly, pinning the lease's server key
// and presenting its client token (docs/exec.md, "The per-lease key"). It needs the pod network
// to admit kubeclip's namespace on port 7070 (the tenant NetworkPolicy does).
type DaemonRoute struct{}

var _ Route = DaemonRoute{}

// Name implements Route.
func (DaemonRoute) Name() string { return RouteDaemon }

// Client implements Route.
func (DaemonRoute) Client(pod Pod, seed []byte) (*sandboxd.Client, error) {
	return sandboxd.NewClient(sandboxd.ClientOptions{
		Dial:         sandboxd.DialTCP(pod.Addr),
		TLS:          sandboxd.ClientTLSConfig(seed),
		Token:        sandboxd.ClientToken(seed),
		MaxIdleConns: connsPerLease,
	})
}
