package paperclip

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// fakeNATS is a TCP listener that plays a NATS server's first line (INFO, auth required), so
// that a client which connected would send its CONNECT with credentials. It records every
// connection and every byte received.
type fakeNATS struct {
	ln net.Listener

	mu          sync.Mutex
	connections int
	received    bytes.Buffer
	wg          sync.WaitGroup
}

func startFakeNATS(t *testing.T) *fakeNATS {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeNATS{ln: ln}
	f.wg.Add(1)
	go f.serve()
	t.Cleanup(func() {
		_ = ln.Close()
		f.wg.Wait()
	})
	return f
}

func (f *fakeNATS) serve() {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		f.connections++
		f.mu.Unlock()
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer c.Close()
			_, _ = c.Write([]byte(`INFO {"server_id":"FAKE","version":"2.10.0","proto":1,"max_payload":1048576,"auth_required":true}` + "\r\n"))
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			buf := make([]byte, 4096)
			for {
				n, err := c.Read(buf)
				f.mu.Lock()
				f.received.Write(buf[:n])
				f.mu.Unlock()
				if err != nil {
					return
				}
			}
		}()
	}
}

func (f *fakeNATS) URL() string { return "nats://" + f.ln.Addr().String() }

func (f *fakeNATS) seen() (int, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.connections, f.received.String()
}

// wire records every message on kubeclip's NATS server (the suite's, no permissions) while a
// test runs: what the plugin sent to kubeclip, exec requests and their env included.
type wire struct {
	sub  *nats.Subscription
	mu   sync.Mutex
	msgs []*nats.Msg
}

func watchWire(t *testing.T) *wire {
	t.Helper()
	w := &wire{}
	sub, err := env.NC.Subscribe(">", func(m *nats.Msg) {
		w.mu.Lock()
		w.msgs = append(w.msgs, m)
		w.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		t.Fatal(err)
	}
	if err := env.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	w.sub = sub
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return w
}

func (w *wire) messages() []*nats.Msg {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]*nats.Msg(nil), w.msgs...)
}

// pluginWorkerPeakRSS is the peak resident set (VmHWM, bytes) of the plugin's worker process
// under Paperclip: the node process whose command line runs this plugin's dist/worker.js.
func pluginWorkerPeakRSS(t *testing.T) (int, int64) {
	t.Helper()
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		cmdline, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil || !bytes.Contains(cmdline, []byte("kubeclip-paperclip-plugin")) || !bytes.Contains(cmdline, []byte("worker.js")) {
			continue
		}
		status, err := os.ReadFile(filepath.Join(d, "status"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(status), "\n") {
			if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
				kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				if err != nil {
					t.Fatalf("%s/status: %q: %v", d, line, err)
				}
				pid, _ := strconv.Atoi(filepath.Base(d))
				return pid, kb << 10
			}
		}
	}
	return 0, 0
}

// resetPeakRSS resets process pid's peak resident set (VmHWM) to its current one.
func resetPeakRSS(t *testing.T, pid int) {
	t.Helper()
	if err := os.WriteFile(filepath.Join("/proc", strconv.Itoa(pid), "clear_refs"), []byte("5"), 0); err != nil {
		t.Fatalf("resetting the peak RSS of pid %d: %v", pid, err)
	}
}
