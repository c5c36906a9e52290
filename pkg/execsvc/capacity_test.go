package execsvc_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/execclient"
	"github.com/kubeclip/kubeclip/pkg/execproto"
	"github.com/kubeclip/kubeclip/pkg/execsvc"
	"github.com/kubeclip/kubeclip/pkg/inbox"
)

// productionReplicas and productionMemory are the production overlay's exec-worker: three
// replicas with the base's 256 Mi memory limit (deploy/kustomize).
const (
	productionReplicas = 3
	productionMemory   = 256 << 20
)

// productionSizing configures a replica as the exec-worker does from its memory limit
// (--max-execs 0, --max-execs-per-company 0).
func productionSizing(o *execsvc.Options) {
	sz := execsvc.SizeFor(productionMemory)
	o.MaxSessions, o.BufferBytes = sz.Sessions, sz.BufferBytes
}

// answers collects the first `started` or `error` on each inbox under one prefix, with when it
// came.
type answers struct {
	mu    sync.Mutex
	first map[string]answer
}

type answer struct {
	kind execproto.Kind
	at   time.Time
	msg  string
}

func collectAnswers(t *testing.T, nc *nats.Conn, prefix string) *answers {
	t.Helper()
	a := &answers{first: map[string]answer{}}
	sub, err := nc.Subscribe(prefix+".>", func(m *nats.Msg) {
		k := execproto.KindOf(m)
		if k != execproto.KindStarted && k != execproto.KindError {
			return
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		if _, ok := a.first[m.Subject]; !ok {
			a.first[m.Subject] = answer{kind: k, at: time.Now(), msg: string(m.Data)}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return a
}

func (a *answers) count(kind execproto.Kind) (n, all int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, x := range a.first {
		if x.kind == kind {
			n++
		}
	}
	return n, len(a.first)
}

func (a *answers) get(inbox string) (answer, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	x, ok := a.first[inbox]
	return x, ok
}

// startRaw publishes a start of l's as a client would, answered into reply; the test reads the
// answers itself (no acks: the commands print nothing).
func (e *env) startRaw(l *testLease, reply string, req execproto.StartRequest) {
	e.t.Helper()
	subj, err := execproto.NewSubjects(e.subjects).Request(l.CompanyID, l.RunID, execproto.OpStart)
	if err != nil {
		e.t.Fatal(err)
	}
	req.ExecID, req.ProviderLeaseID = newID("x"), l.ProviderLeaseID
	data, _ := json.Marshal(req)
	if err := e.clientNC.PublishRequest(subj, reply, data); err != nil {
		e.t.Fatal(err)
	}
}

// TestProductionSettingsHoldTwoHundredAgents is the acceptance on the production
// overlay's exec-worker settings (three replicas sized from 256 Mi, as cmd/exec-worker sizes
// them): company A alone holds 200 concurrent long-running recorded agent commands (on 10 leases,
// 20 each), then company B's first command is started. Before, each replica served 40 sessions
// and a quarter of them per company: A got 30 and the rest `unavailable`.
func TestProductionSettingsHoldTwoHundredAgents(t *testing.T) {
	holdAgents(t, productionReplicas, 200)
}

// TestOneReplicaHoldsFiveHundredAgents: one replica sized from 256 Mi serves 500 live agent
// commands of one company (the bound: at least 500), and another company's first
// command after them.
func TestOneReplicaHoldsFiveHundredAgents(t *testing.T) {
	holdAgents(t, 1, 500)
}

// holdAgents has company A start agents long-running recorded commands (`sleep 600`, on 10
// leases) through replicas replicas sized from productionMemory and hold them, then company B
// start its first. Every one must start. It logs B's latency to `started` and the heap and RSS
// the live sessions added to the test process: the replicas and the test's client (one
// subscription), the nats-server being a process of its own.
func holdAgents(t *testing.T, replicas, agents int) {
	const leases = 10
	e := newEnvOn(t, startNATSProcess(t), roles{tune: productionSizing}, replicas)
	companyA := newID("co-a")
	var as []*testLease
	for range leases {
		as = append(as, e.newLease(companyA))
	}
	b := e.newLease(newID("co-b"))
	held := collectAnswers(t, e.clientNC, inbox.CLIPrefix+".hold")

	before := memNow()
	for i := range agents {
		l := as[i%leases]
		e.startRaw(l, fmt.Sprintf("%s.hold.%d", inbox.CLIPrefix, i), execproto.StartRequest{Command: "sleep", Args: []string{"600"}, Record: true})
	}
	eventually(t, "every agent command of company A is answered", func() bool {
		_, all := held.count(execproto.KindStarted)
		return all == agents
	})
	if started, _ := held.count(execproto.KindStarted); started != agents {
		for i := range agents {
			if x, _ := held.get(fmt.Sprintf("%s.hold.%d", inbox.CLIPrefix, i)); x.kind == execproto.KindError {
				t.Errorf("company A's command %d refused: %s", i, x.msg)
				break
			}
		}
		t.Fatalf("company A alone: %d of %d agent commands started", started, agents)
	}
	eventually(t, "the replicas serve every session", func() bool { return e.liveSessions() == int64(agents) })
	after := memNow()
	perHeap := float64(after.heap-before.heap) / float64(agents)
	perRSS := float64(after.rss-before.rss) / float64(agents)
	t.Logf("%d live agent sessions on %d replicas: heap in use %d -> %d bytes (%.0f KiB per session), RSS %d -> %d bytes (%.0f KiB per session), goroutines %d -> %d",
		agents, replicas, before.heap, after.heap, perHeap/1024, before.rss, after.rss, perRSS/1024, before.goroutines, after.goroutines)

	// Company B arrives. The bound: B's first command is admitted at once, not queued
	// behind A's sessions. Its start is a process spawned through sandboxd, tens of milliseconds
	// on this machine; a second is the bound the issue sets, far above that and far below a
	// queue's wait. A first command over it is measured once more, with a third company: a
	// moment of the machine's load (CI runs other packages' tests beside this one) passes, a
	// queue behind A's sessions does not.
	took := e.firstCommand(t, b, "B", agents)
	if took <= time.Second {
		return
	}
	t.Logf("company B's first command took %v, over the second: measuring a third company's", took)
	c := e.newLease(newID("co-c"))
	if again := e.firstCommand(t, c, "C", agents); again > time.Second {
		t.Errorf("the first commands of companies B and C started %v and %v after they were sent while A held %d; want within a second", took, again, agents)
	}
}

// firstCommand starts a new company's first command on lease l (a long-running recorded
// one, as an agent's) and returns how long it took to be started, logged as name's.
func (e *env) firstCommand(t *testing.T, l *testLease, name string, held int) time.Duration {
	t.Helper()
	prefix := inbox.CLIPrefix + "." + strings.ToLower(name)
	reply := prefix + ".1"
	first := collectAnswers(t, e.clientNC, prefix)
	sent := time.Now()
	e.startRaw(l, reply, execproto.StartRequest{Command: "sleep", Args: []string{"600"}, Record: true})
	eventually(t, "company "+name+"'s first command is answered", func() bool { _, ok := first.get(reply); return ok })
	x, _ := first.get(reply)
	if x.kind != execproto.KindStarted {
		t.Fatalf("company %s's first command while A holds %d: %s %s", name, held, x.kind, x.msg)
	}
	took := x.at.Sub(sent)
	t.Logf("company %s's first command started %v after its start was sent (A holding %d)", name, took, held)
	return took
}

// liveSessions is how many sessions the replicas serve now.
func (e *env) liveSessions() int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	var n int64
	for _, r := range e.replicas {
		n += r.sessions.Load()
	}
	return n
}

// mem is the process's memory at one time, after a collection.
type mem struct {
	heap, rss  int64 // heap and stacks in use; resident set
	goroutines int
}

func memNow() mem {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return mem{heap: int64(ms.HeapInuse + ms.StackInuse), rss: vmRSS(), goroutines: runtime.NumGoroutine()}
}

// vmRSS is the process's resident set from /proc/self/status, in bytes (0 where there is none).
func vmRSS() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// TestBuffersWithinBudget: sessions' buffers are taken from the replica's byte budget as they
// grow, and a session that finds none waits (its reader, and so sandboxd, with it) rather than
// growing. Two companies' six recorded commands print 2 MiB each and a seventh echoes 2 MiB of
// stdin through a replica whose buffers may hold 1 MiB in all (768 KiB of frames and stdin, a
// recorded 64 KiB frame charged 256 KiB): every byte arrives, the budget never held more than it
// has, and all of it is given back when the sessions end.
func TestBuffersWithinBudget(t *testing.T) {
	const budget, size = 1 << 20, 2 << 20
	e := newEnvTuned(t, 1, func(o *execsvc.Options) { o.BufferBytes = budget })
	companies := []*testLease{e.newLease(newID("co-a")), e.newLease(newID("co-b"))}
	var wg sync.WaitGroup
	for i := range 7 {
		l := companies[i%2]
		x := execclient.Exec{Command: "sh", Args: []string{"-c", fmt.Sprintf(`i=0; while [ $i -lt %d ]; do head -c 65535 /dev/zero | tr '\0' x; echo; i=$((i+1)); done`, size>>16)}, Record: true}
		if i == 6 {
			x = execclient.Exec{Command: "cat", Stdin: bytes.NewReader(bytes.Repeat([]byte("y"), size)), StdinBytes: size}
		}
		wg.Go(func() {
			res, err := e.try(l, x)
			if err != nil {
				t.Errorf("exec %d: %v", i, err)
				return
			}
			if len(res.Stdout) != size {
				t.Errorf("exec %d: %d bytes of stdout, want %d", i, len(res.Stdout), size)
			}
		})
	}
	wg.Wait()
	r := e.replicas[0]
	io, _ := execsvc.SplitBuffers(budget)
	eventually(t, "the sessions give their buffers back", func() bool {
		used, _, lines, _ := execsvc.BufferUse(r.svc)
		return used == 0 && lines == 0
	})
	_, peak, _, linesPeak := execsvc.BufferUse(r.svc)
	t.Logf("buffer budget %d bytes (frames and stdin %d): held at most %d, lines at most %d", budget, io, peak, linesPeak)
	if peak > io || peak == 0 {
		t.Errorf("frames and stdin held at most %d bytes, want some and at most %d", peak, io)
	}
}

// startNATSProcess runs the pinned nats-server as a process of its own with JetStream, so the
// test process's memory is the exec-worker's; Cleanup kills it.
func startNATSProcess(t *testing.T) natsURL {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	dir := t.TempDir()
	conf := filepath.Join(dir, "nats.conf")
	// The streams' default sizes (events.Options: an 8 GiB store) must fit the file store.
	text := fmt.Sprintf("listen: \"127.0.0.1:%d\"\njetstream { store_dir: %q, max_file_store: 16GB, max_memory_store: 1GB }\n", port, filepath.Join(dir, "js"))
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(natstest.ServerBinary(t), "-c", conf)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	eventually(t, "nats-server accepts connections", func() bool {
		nc, err := nats.Connect(url)
		if err != nil {
			return false
		}
		nc.Close()
		return true
	})
	return natsURL(url)
}
