package app

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/transport"

	"github.com/kubeclip/kubeclip/internal/config"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/inbox"
	"github.com/kubeclip/kubeclip/pkg/k8s"
	"github.com/kubeclip/kubeclip/pkg/lease"
)

// Streams are the JetStream settings every worker applies on start (idempotently, so whichever
// starts first creates the streams).
type Streams struct {
	Replicas       int
	LeaseRetention time.Duration
	RunRetention   time.Duration
	StoreBytes     int
	// Companies is how many companies the store is sized for (events.Options.Companies).
	Companies int
}

// Bind registers the stream settings on s.
func (st *Streams) Bind(s *config.Set) {
	s.Int(&st.Replicas, "stream-replicas", "KUBECLIP_STREAM_REPLICAS", events.DefaultReplicas, "replicas of every stream and KV bucket (1 in development, 3 on a 3-node NATS cluster)")
	s.Duration(&st.LeaseRetention, "lease-retention", "KUBECLIP_LEASE_RETENTION", events.DefaultLeaseMaxAge, "how long lease requests are kept")
	s.Duration(&st.RunRetention, "run-retention", "KUBECLIP_RUN_RETENTION", events.DefaultRunMaxAge, "how long run events (logs included) are kept")
	s.Int(&st.StoreBytes, "store-bytes", "KUBECLIP_STORE_BYTES", events.DefaultStoreBytes, "the NATS server's JetStream max_file_store in bytes: every stream's and KV bucket's byte limit is its share of it (run events 60%, the table in docs/security.md, Budgets)")
	s.Int(&st.Companies, "store-companies", "KUBECLIP_STORE_COMPANIES", events.DefaultStoreCompanies, "how many companies the store is sized for: each company's daily budgets and lease-record quota are the stores' shares divided among them, so that many companies at their budgets evict nobody's history before --run-retention")
}

// Options returns the events.Options for prefix.
func (st Streams) Options(prefix string) events.Options {
	return events.Options{Prefix: prefix, Replicas: st.Replicas, LeaseMaxAge: st.LeaseRetention, RunMaxAge: st.RunRetention, StoreBytes: int64(st.StoreBytes), Companies: st.Companies}
}

// Buckets returns the options of the lease and tenant buckets, which every worker reads.
func (st Streams) Buckets() lease.BucketOptions {
	return lease.BucketOptions{Replicas: st.Replicas, LeaseMaxAge: st.LeaseRetention, StoreBytes: int64(st.StoreBytes)}
}

// Kube is a worker's Kubernetes clients.
type Kube struct {
	Config    *rest.Config
	Clientset kubernetes.Interface
	Dynamic   dynamic.Interface
	// Metadata lists objects' metadata only (the dispatcher's reconcile pass).
	Metadata metadata.Interface
	Applier  *k8s.Applier
}

// Kubernetes builds the clients of component from the common settings; wrap (when not nil)
// wraps their transport (the workers count their requests: ops.Metrics.KubernetesTransport).
func (c *Common) Kubernetes(component string, wrap transport.WrapperFunc) (*Kube, error) {
	cfg, err := k8s.RESTConfig(c.Kubeconfig, float32(c.KubeQPS), c.KubeBurst)
	if err != nil {
		return nil, err
	}
	cfg = k8s.ForComponent(cfg, component)
	if wrap != nil {
		cfg.Wrap(wrap)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("building Kubernetes clientset: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("building Kubernetes dynamic client: %w", err)
	}
	md, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("building Kubernetes metadata client: %w", err)
	}
	applier, err := k8s.NewApplier(k8s.ApplierOptions{Dynamic: dyn, Mapper: k8s.NewRESTMapper(cs.Discovery())})
	if err != nil {
		return nil, err
	}
	return &Kube{Config: cfg, Clientset: cs, Dynamic: dyn, Metadata: md, Applier: applier}, nil
}

// InboxPrefix is the inbox prefix of the workers that connect through Common, all of them user
// kubeclip but the exec-worker and the credential broker (nats-auth.conf lets each user
// subscribe to its own inboxes only).
func InboxPrefix(component string) string {
	switch component {
	case "exec-worker":
		return inbox.ExecWorkerPrefix
	case "credential-broker":
		return inbox.BrokerPrefix
	}
	return inbox.WorkersPrefix
}

// JetStream connects to NATS and makes sure the streams and the lease and tenant buckets exist
// (the other buckets are created by the worker that owns them). The caller drains
// the connection last.
func (c *Common) JetStream(ctx context.Context, component string, st Streams, log zerolog.Logger) (*nats.Conn, jetstream.JetStream, error) {
	nc, js, err := c.Connect(ctx, component, log)
	if err != nil {
		return nil, nil, err
	}
	if err := events.EnsureStreams(ctx, js, st.Options(c.SubjectPrefix)); err != nil {
		nc.Close()
		return nil, nil, err
	}
	if err := lease.EnsureBuckets(ctx, js, st.Buckets()); err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// Connect connects to NATS as component (its credentials and inbox prefix) and opens
// JetStream, creating nothing: the credential broker, whose user may not create kubeclip's
// streams, connects with it alone. The caller drains the connection last.
func (c *Common) Connect(ctx context.Context, component string, log zerolog.Logger) (*nats.Conn, jetstream.JetStream, error) {
	auth, err := c.NATS.Options()
	if err != nil {
		return nil, nil, err
	}
	// RetryOnFailedConnect lets a worker start before NATS; wait for the first connection here,
	// bounded by ctx.
	connected := make(chan struct{})
	var once sync.Once
	onConnect := nats.ConnectHandler(func(*nats.Conn) { once.Do(func() { close(connected) }) })
	opts := append(auth, onConnect, nats.CustomInboxPrefix(InboxPrefix(component)))
	nc, err := ConnectNATS(c.NATSURL, "kubeclip-"+component, log, opts...)
	if err != nil {
		return nil, nil, err
	}
	if !nc.IsConnected() {
		select {
		case <-ctx.Done():
			nc.Close()
			return nil, nil, ctx.Err()
		case <-connected:
		}
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("opening JetStream: %w", err)
	}
	return nc, js, nil
}

// Subjects returns the subjects of the configured prefix.
func (c *Common) Subjects() (events.Subjects, error) {
	return events.NewSubjects(c.SubjectPrefix)
}
