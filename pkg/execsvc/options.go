package execsvc

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"
	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execproto"
	"github.com/kubeclip/kubeclip/pkg/execspec"
	"github.com/kubeclip/kubeclip/pkg/inbox"
)

// Defaults of Options.
const (
	// DefaultMaxSessions bounds the exec streams one replica serves at once when nothing
	// smaller is set: the exec-worker sizes its own from its memory limit (SizeFor). A
	// Paperclip run keeps a handful in flight (four uploads, the agent command, bridge polls);
	// past the bound a replica answers unavailable and the client tries again, usually
	// reaching another replica.
	DefaultMaxSessions = 2048
	// DefaultReadyTimeout bounds how long a start waits for its pod to become ready when the
	// exec's own timeout is longer or unset: a pod that is not ready in two minutes is stuck
	// (image pull, scheduling), and the run-watcher reports why.
	DefaultReadyTimeout = 2 * time.Minute
	// DefaultHeartbeat is how often a quiet stream (or a start waiting for its pod) sends a
	// heartbeat; clients attach again after three seconds without a message.
	DefaultHeartbeat = time.Second
	// DefaultLinger is how long a stream waits, after its exit, for the client's close before
	// it stops; sandboxd drops the journal ten minutes after exit anyway.
	DefaultLinger = 30 * time.Second
	// DefaultAckPatience is how long a stream whose window is full waits for an ack before it
	// decides the client is gone. A client that only paused attaches again and continues.
	DefaultAckPatience = time.Minute
	// DefaultReconnect is how long a broken output stream is reopened while the pod lives
	// before the exec is answered unavailable.
	DefaultReconnect = 15 * time.Second
)

// Options configure a Service.
type Options struct {
	// NATS carries the requests and the streams; required.
	NATS *nats.Conn
	// JetStream reads lease records and stores recorded execs' events; required.
	JetStream jetstream.JetStream
	// Subjects carries the subject prefix.
	Subjects events.Subjects
	// Pods finds the lease pods; required.
	Pods Pods
	// Route reaches sandboxd in a pod; required.
	Route Route
	// MasterKey derives every lease's sandboxd seed (execspec.ReadMasterKey); required.
	MasterKey []byte
	// Replica names this replica in `started` and logs; defaults to the host name plus a
	// random suffix.
	Replica string
	Logger  zerolog.Logger
	// Now is the clock (default time.Now); NewID makes session ids (default a ULID).
	Now   func() time.Time
	NewID func() string
	// MaxSessions, ReadyTimeout, Heartbeat, Linger, AckPatience and Reconnect default to the
	// constants above. DrainTimeout is how long a stopping replica lets its streams finish
	// before it cuts them (their clients attach through another replica); it defaults to
	// events.DefaultDrainTimeout, as every worker's drain does.
	MaxSessions int
	// MaxSessionsPerCompany is a hard ceiling on one company's sessions; 0 (the default): none,
	// a company's share is max-min fair (limits.go, admits): all but a reserve when alone, an
	// equal part when companies compete.
	MaxSessionsPerCompany int
	ReadyTimeout          time.Duration
	Heartbeat             time.Duration
	Linger                time.Duration
	AckPatience           time.Duration
	Reconnect             time.Duration
	DrainTimeout          time.Duration
	// BufferBytes is the budget of every session's buffers together (frames read from pods,
	// stdin queued for them, the recorder's lines), taken as they grow, under the same fair rule
	// (default DefaultBufferBytes; the exec-worker sizes it from its memory limit, SizeFor).
	BufferBytes int64
	// StreamReplicas is the replica count of RecordedBucket (default 1).
	StreamReplicas int
	// StoreBytes is the JetStream store RecordedBucket and the budget bucket take their share
	// of (events.Options.StoreBytes; 0: the default).
	StoreBytes int64
	// Record bounds recorded execs: the parser's line, coalescing, and the exec, run and
	// company budgets (record.go).
	Record RecordLimits
	// Observer is told about requests and streams (metrics); nil means none.
	Observer Observer
	// Replies are the inboxes the service answers into (docs/security.md, "NATS
	// accounts, users, inboxes and replies"): a request whose reply subject is not one is dropped without a word, because a
	// reply is published with the exec-worker's permissions wherever the requester says. The
	// zero Rule allows nothing.
	Replies inbox.Rule
	// EnvPolicy drops the keys of a start's environment that may not reach a tenant pod (the
	// Paperclip host's own secrets), again after the plugin did: a request may come from any
	// client. The zero EnvPolicy defaults to execproto.DefaultEnvPolicy.
	EnvPolicy execproto.EnvPolicy
	// BrokeredKeys are the keys a start may carry only as the credential broker's placeholder
	// (brokered.go); the zero value brokers nothing.
	BrokeredKeys BrokeredKeys
}

func (o Options) withDefaults() (Options, error) {
	var errs []error
	if o.NATS == nil {
		errs = append(errs, errors.New("execsvc: Options.NATS is required"))
	}
	if o.JetStream == nil {
		errs = append(errs, errors.New("execsvc: Options.JetStream is required"))
	}
	if o.Pods == nil {
		errs = append(errs, errors.New("execsvc: Options.Pods is required"))
	}
	if o.Route == nil {
		errs = append(errs, errors.New("execsvc: Options.Route is required"))
	}
	if len(o.MasterKey) < execspec.MinMasterKeySize {
		errs = append(errs, fmt.Errorf("execsvc: Options.MasterKey must be at least %d bytes", execspec.MinMasterKeySize))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"ReadyTimeout", o.ReadyTimeout}, {"Heartbeat", o.Heartbeat}, {"Linger", o.Linger}, {"AckPatience", o.AckPatience}, {"Reconnect", o.Reconnect}, {"DrainTimeout", o.DrainTimeout}} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("execsvc: Options.%s must not be negative", d.name))
		}
	}
	if o.MaxSessions < 0 {
		errs = append(errs, errors.New("execsvc: Options.MaxSessions must not be negative"))
	}
	if o.MaxSessionsPerCompany < 0 {
		errs = append(errs, errors.New("execsvc: Options.MaxSessionsPerCompany must not be negative"))
	}
	if o.BufferBytes < 0 {
		errs = append(errs, errors.New("execsvc: Options.BufferBytes must not be negative"))
	}
	if err := errors.Join(errs...); err != nil {
		return o, err
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.NewID == nil {
		o.NewID = func() string { return ulid.Make().String() }
	}
	if o.Replica == "" {
		host, _ := os.Hostname()
		o.Replica = fmt.Sprintf("%s-%s", host, strings.ToLower(ulid.Make().String()[20:]))
	}
	if o.MaxSessions == 0 {
		o.MaxSessions = DefaultMaxSessions
	}
	if o.BufferBytes == 0 {
		o.BufferBytes = DefaultBufferBytes
	}
	defaults := []struct {
		p *time.Duration
		v time.Duration
	}{{&o.ReadyTimeout, DefaultReadyTimeout}, {&o.Heartbeat, DefaultHeartbeat}, {&o.Linger, DefaultLinger},
		{&o.AckPatience, DefaultAckPatience}, {&o.Reconnect, DefaultReconnect}, {&o.DrainTimeout, events.DefaultDrainTimeout}}
	for _, d := range defaults {
		if *d.p == 0 {
			*d.p = d.v
		}
	}
	if o.Observer == nil {
		o.Observer = nopObserver{}
	}
	if o.EnvPolicy.IsZero() {
		o.EnvPolicy = execproto.DefaultEnvPolicy()
	}
	return o, nil
}
