package execsvc_test

import (
	"io"
	"net"
	"net/url"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/execclient"
)

// TestRecordedExecRoundTrips counts the NATS round trips a recorded exec's client waits for in a
// row beyond those of an unrecorded one: the replica's connection goes through a proxy that
// holds every byte roundTripDelay/2 each way, so each round trip the replica waits for costs
// the client roundTripDelay, and the difference of the two medians, in round trips, is the
// count. On a 2-core machine another company's flood leaves without idle CPU, each of those
// round trips costs milliseconds (issue 26; docs/security.md, "Recorded execs beside a flood"), so the count is what a
// recorded exec beside a flood pays for.
//
// Four: the exec's entry (written while the command starts, which the local sandboxd here does
// faster than a round trip), the budget charge (the run's and the company's counters) and the
// entry's advance, all three at once, the output's event and the final event. Before: six,
// each of the first four in a row (6.3 measured here), and eight before the session took its
// entry from the start's write instead of reading it back, and the entry's purge followed the
// exit.
func TestRecordedExecRoundTrips(t *testing.T) {
	const (
		roundTripDelay = 50 * time.Millisecond
		samples        = 15
		want           = 4
	)
	srv, _, _ := natstest.Start(t)
	e := newEnvOn(t, srv, roles{}, 0)
	e.replicaSrv = startDelayProxy(t, srv.ClientURL(), roundTripDelay/2)
	e.startReplica()
	l := e.newLease(newID("co"))

	echo := func(record bool) time.Duration {
		began := time.Now()
		res := e.run(l, execclient.Exec{Command: "echo", Args: []string{"hello"}, Record: record})
		took := time.Since(began)
		if res.ExitCode == nil || *res.ExitCode != 0 || string(res.Stdout) != "hello\n" {
			t.Fatalf("echo (recorded %t): exit %v, stdout %q", record, res.ExitCode, res.Stdout)
		}
		return took
	}
	// The first recorded exec of a run reads its budget counters (cached from then on).
	echo(true)
	echo(false)
	var plain, recorded []time.Duration
	for range samples {
		plain = append(plain, echo(false))
		recorded = append(recorded, echo(true))
	}
	extra := float64(medianOf(recorded)-medianOf(plain)) / float64(roundTripDelay)
	t.Logf("round trip %s each way through the proxy; unrecorded echo: %v (median %s); recorded: %v (median %s); extra round trips in a row: %.2f",
		roundTripDelay/2, plain, medianOf(plain), recorded, medianOf(recorded), extra)
	// What else the client waits for (sandboxd's start, the processes' scheduling) adds a few
	// milliseconds, a tenth of a round trip here; the machine's load may add more, hence the
	// tolerance. One round trip more is 1.0.
	if extra > want+0.7 {
		t.Errorf("a recorded exec's client waited for %.2f NATS round trips in a row more than an unrecorded one's; want %d", extra, want)
	}
}

func medianOf(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// delayProxy forwards TCP connections to a target, holding every byte for its delay in each
// direction (bytes keep their order; nothing is throttled).
type delayProxy struct {
	ln    net.Listener
	delay time.Duration
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
}

// startDelayProxy listens on a local port until the test ends.
func startDelayProxy(t *testing.T, target string, delay time.Duration) *delayProxy {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	addr := u.Host
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &delayProxy{ln: ln, delay: delay}
	p.wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", addr)
			if err != nil {
				_ = in.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, in, out)
			p.mu.Unlock()
			p.wg.Go(func() { p.pipe(out, in) })
			p.wg.Go(func() { p.pipe(in, out) })
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *delayProxy) ClientURL() string { return "nats://" + p.ln.Addr().String() }

// pipe copies src to dst, each read delay after it was read.
func (p *delayProxy) pipe(dst io.WriteCloser, src io.ReadCloser) {
	type chunk struct {
		at   time.Time
		data []byte
	}
	chunks := make(chan chunk, 4096)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer func() { _ = dst.Close() }()
		for c := range chunks {
			time.Sleep(time.Until(c.at.Add(p.delay)))
			if _, err := dst.Write(c.data); err != nil {
				_ = src.Close()
				for range chunks { // drained, so the reader never blocks
				}
				return
			}
		}
	})
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			chunks <- chunk{at: time.Now(), data: append([]byte(nil), buf[:n]...)}
		}
		if err != nil {
			break
		}
	}
	close(chunks)
	wg.Wait()
}
