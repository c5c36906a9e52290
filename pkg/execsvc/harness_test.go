package execsvc_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execclient"
	"github.com/kubeclip/kubeclip/pkg/execproto"
	"github.com/kubeclip/kubeclip/pkg/execspec"
	"github.com/kubeclip/kubeclip/pkg/execsvc"
	"github.com/kubeclip/kubeclip/pkg/inbox"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// sandboxdBin is sandboxd, built as the images build it, in TestMain: the tests run it as the
// pods do, one process per lease.
var sandboxdBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "execsvc-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sandboxdBin = filepath.Join(dir, "sandboxd")
	build := exec.Command("go", "build", "-trimpath", "-o", sandboxdBin, "../../cmd/sandboxd")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building sandboxd: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// env is a NATS server with the contract's streams, exec-worker replicas (each with its own
// connection, so one can be cut off), fake pods that point at local sandboxd processes, and a
// client.
type env struct {
	t         *testing.T
	srv       natsServer
	js        jetstream.JetStream
	subjects  events.Subjects
	masterKey []byte
	pods      *fakePods
	records   lease.Records
	client    *execclient.Client
	clientNC  *nats.Conn
	// replicaOpts are the replicas' connection options (credentials).
	replicaOpts []nats.Option
	// replicaSrv is where replicas started from now on connect (nil: srv), e.g. a delayProxy.
	replicaSrv natsServer
	// record is the replicas' recording limits (zero: the defaults).
	record execsvc.RecordLimits
	// tune changes the replicas' service options, when set.
	tune func(*execsvc.Options)

	mu       sync.Mutex
	replicas []*replica
}

func newEnv(t *testing.T, replicas int) *env {
	t.Helper()
	return newEnvTuned(t, replicas, nil)
}

// newEnvTuned is newEnv with the replicas' service options changed by tune.
func newEnvTuned(t *testing.T, replicas int, tune func(*execsvc.Options)) *env {
	t.Helper()
	srv, _, _ := natstest.Start(t)
	return newEnvOn(t, srv, roles{tune: tune}, replicas)
}

// roles are the options of the test's NATS connections: the harness's own (streams, lease
// records), the replicas' and the client's. Empty: an open server.
type roles struct {
	harness, replica, client []nats.Option
	tune                     func(*execsvc.Options)
}

// newEnvOn sets the env up on srv.
func newEnvOn(t *testing.T, srv natsServer, r roles, replicas int) *env {
	t.Helper()
	_, js := connect(t, srv, r.harness...)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := events.EnsureStreams(ctx, js, events.Options{}); err != nil {
		t.Fatal(err)
	}
	if err := lease.EnsureBuckets(ctx, js, lease.BucketOptions{}); err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, lease.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	// Replicas answer only into the clients' inboxes: the client connects as the CLI does.
	cnc, _ := connect(t, srv, append([]nats.Option{nats.CustomInboxPrefix(inbox.CLIPrefix)}, r.client...)...)
	e := &env{t: t, srv: srv, js: js, masterKey: key, pods: newFakePods(), records: lease.Records{KV: kv}, clientNC: cnc, replicaOpts: r.replica, tune: r.tune}
	e.client, err = execclient.New(execclient.Options{NATS: cnc, Subjects: e.subjects})
	if err != nil {
		t.Fatal(err)
	}
	for range replicas {
		e.startReplica()
	}
	return e
}

// natsServer is where the test's connections go: an in-process *server.Server, or a
// nats-server process (natsURL).
type natsServer interface{ ClientURL() string }

var _ natsServer = (*server.Server)(nil)

// natsURL is a nats-server process's client URL.
type natsURL string

func (u natsURL) ClientURL() string { return string(u) }

// connect opens a connection to srv that the test's cleanup drains.
func connect(t *testing.T, srv natsServer, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	closed := make(chan struct{})
	nc, err := nats.Connect(srv.ClientURL(), append(opts, nats.Name(t.Name()), nats.ClosedHandler(func(*nats.Conn) { close(closed) }))...)
	if err != nil {
		t.Fatalf("connecting to %s: %v", srv.ClientURL(), err)
	}
	t.Cleanup(func() {
		if err := nc.Drain(); err != nil {
			nc.Close()
		}
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			nc.Close()
		}
	})
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// replica is one exec-worker.
type replica struct {
	name     string
	svc      *execsvc.Service
	nc       *nats.Conn
	cancel   context.CancelFunc
	done     chan error
	sessions atomic.Int64
	budgets  atomic.Int64 // budget refusals observed
	dropped  atomic.Int64
	crashed  atomic.Bool
	stopOnce sync.Once
}

func (e *env) startReplica() *replica {
	t := e.t
	t.Helper()
	e.mu.Lock()
	name := fmt.Sprintf("replica-%d", len(e.replicas)+1)
	e.mu.Unlock()
	srv := e.srv
	if e.replicaSrv != nil {
		srv = e.replicaSrv
	}
	nc, err := nats.Connect(srv.ClientURL(), append(e.replicaOpts, nats.Name(name))...)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	r := &replica{name: name, nc: nc, done: make(chan error, 1)}
	opts := execsvc.Options{
		NATS: nc, JetStream: js, Subjects: e.subjects, Pods: e.pods, Route: execsvc.DaemonRoute{},
		MasterKey: e.masterKey, Replica: name, Observer: &countingObserver{r: r},
		Logger:       zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel),
		DrainTimeout: 2 * time.Second, Linger: 2 * time.Second, Record: e.record, Replies: inbox.MustRule(inbox.DefaultClientPrefixes()...),
	}
	if e.tune != nil {
		e.tune(&opts)
	}
	svc, err := execsvc.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	r.svc = svc
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	r.cancel = cancel
	go func() { r.done <- svc.Run(ctx) }()
	t.Cleanup(r.stop)
	select {
	case <-svc.Ready():
	case err := <-r.done:
		r.done <- err
		t.Fatalf("%s stopped: %v", name, err)
	case <-time.After(30 * time.Second):
		t.Fatalf("%s not ready within 30s", name)
	}
	e.mu.Lock()
	e.replicas = append(e.replicas, r)
	e.mu.Unlock()
	return r
}

// stop stops the replica as SIGTERM would and waits for it.
func (r *replica) stop() {
	r.stopOnce.Do(func() {
		r.cancel()
		select {
		case err := <-r.done:
			_ = err // a crashed replica's Run may report its closed connection
		case <-time.After(30 * time.Second):
		}
		r.nc.Close()
	})
}

// crash cuts the replica off as a dying process would: its connection closes without a drain,
// so nothing it had not sent yet reaches anyone.
func (r *replica) crash() {
	r.crashed.Store(true)
	r.nc.Close()
	r.stop()
}

type countingObserver struct{ r *replica }

func (o *countingObserver) ExecRequest(execproto.Op, execproto.Code, time.Duration) {}
func (o *countingObserver) ExecSessions(d int)                                      { o.r.sessions.Add(int64(d)) }
func (o *countingObserver) ExecOutput(int)                                          {}
func (o *countingObserver) BudgetExceeded(source string, kind events.BudgetKind) {
	o.r.budgets.Add(1)
}
func (o *countingObserver) ExecDropped(string) { o.r.dropped.Add(1) }
func (o *countingObserver) ExecEnvDropped(int) {}

// serving returns the replica serving a stream now, waiting for one.
func (e *env) serving() *replica {
	var found *replica
	eventually(e.t, "a replica serves the exec", func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		for _, r := range e.replicas {
			if !r.crashed.Load() && r.sessions.Load() > 0 {
				found = r
				return true
			}
		}
		return false
	})
	return found
}

// testLease is an exec-capable lease whose pod is a local sandboxd process.
type testLease struct {
	execclient.Lease
	ref    events.RunRef
	rec    lease.Record
	daemon *daemon
}

// newLease writes a created lease record for company (backend pod), starts its sandboxd with the
// lease's seed and makes it the lease's ready pod.
func (e *env) newLease(company string) *testLease {
	t := e.t
	t.Helper()
	runID := newID("run")
	workload := "pc-" + strings.ToLower(ulid.Make().String())
	rec := lease.Record{
		RunID: runID, CompanyID: company, State: lease.StateCreated, Namespace: "paperclip-" + company,
		WorkloadName: workload, SecretName: workload + "-env", Backend: string(policy.BackendPod), CreatedAt: time.Now().UTC(),
	}
	if _, _, err := e.records.Create(t.Context(), rec); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, execspec.DeriveSeed(e.masterKey, rec.Namespace, rec.WorkloadName))
	l := &testLease{Lease: execclient.Lease{CompanyID: company, RunID: runID, ProviderLeaseID: workload}, ref: rec.Ref(), rec: rec, daemon: d}
	e.pods.set(l.ref, execsvc.Pod{Namespace: rec.Namespace, Name: workload, UID: newID("uid"), Addr: d.addr}, true)
	return l
}

// setState moves the lease record to state.
func (e *env) setState(l *testLease, state lease.State) {
	e.t.Helper()
	if _, err := e.records.Modify(e.t.Context(), l.ref, func(r *lease.Record) (bool, error) { r.State = state; return true, nil }); err != nil {
		e.t.Fatal(err)
	}
}

// run runs x on l and fails the test on an error.
func (e *env) run(l *testLease, x execclient.Exec) execclient.Result {
	e.t.Helper()
	res, err := e.try(l, x)
	if err != nil {
		e.t.Fatalf("exec %s: %v", x.Command, err)
	}
	return res
}

func (e *env) try(l *testLease, x execclient.Exec) (execclient.Result, error) {
	ctx, cancel := context.WithTimeout(e.t.Context(), 2*time.Minute)
	defer cancel()
	x.Lease = l.Lease
	return e.client.Run(ctx, x)
}

func newID(prefix string) string { return prefix + "-" + strings.ToLower(ulid.Make().String()) }

// eventually polls cond every 20 ms until it holds or 30 s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// lines is an io.Writer that keeps what it is written and counts its newlines, for tests that
// act mid-stream.
type lines struct {
	mu  sync.Mutex
	n   int
	buf bytes.Buffer
}

func (l *lines) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n += bytes.Count(b, []byte("\n"))
	return l.buf.Write(b)
}

func (l *lines) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

func (l *lines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}
