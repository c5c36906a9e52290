package execsvc

import (
	"sync"
	"time"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execspec"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/sandboxd"
)

// clientIdle is how long a lease's client is kept without use. Paperclip polls a live lease
// about nine times a second, so an idle client is a lease that ended or went quiet.
const clientIdle = 5 * time.Minute

// leaseClients holds one sandboxd client per lease, for the lease's current pod: its kept-alive
// connections serve every exec of the lease. A client goes when its pod does (sweep), when the
// lease gets another pod, or after clientIdle.
type leaseClients struct {
	route     Route
	masterKey []byte

	mu sync.Mutex
	m  map[events.RunRef]*leaseClient
}

type leaseClient struct {
	rec    lease.Record
	pod    Pod
	client *sandboxd.Client
	used   time.Time
}

func newLeaseClients(route Route, masterKey []byte) *leaseClients {
	return &leaseClients{route: route, masterKey: masterKey, m: map[events.RunRef]*leaseClient{}}
}

// get returns the client of pod, the pod of ref's lease rec, making one when the lease has none
// or had another pod.
func (c *leaseClients) get(ref events.RunRef, rec lease.Record, pod Pod, now time.Time) (*sandboxd.Client, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if lc, ok := c.m[ref]; ok {
		if lc.pod == pod {
			lc.used = now
			return lc.client, nil
		}
		lc.client.Close()
		delete(c.m, ref)
	}
	seed := execspec.DeriveSeed(c.masterKey, rec.Namespace, rec.WorkloadName)
	client, err := c.route.Client(pod, seed)
	if err != nil {
		return nil, err
	}
	c.m[ref] = &leaseClient{rec: rec, pod: pod, client: client, used: now}
	return client, nil
}

// sweep closes the clients whose pod is gone or changed, or that were not used for clientIdle.
// Output streams in progress keep their connection; only idle ones are closed.
func (c *leaseClients) sweep(pods Pods, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for ref, lc := range c.m {
		cur, ok := pods.Current(ref, lc.rec)
		if !ok || cur.UID != lc.pod.UID || now.Sub(lc.used) > clientIdle {
			lc.client.Close()
			delete(c.m, ref)
		}
	}
}

// closeAll closes every client.
func (c *leaseClients) closeAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for ref, lc := range c.m {
		lc.client.Close()
		delete(c.m, ref)
	}
}
