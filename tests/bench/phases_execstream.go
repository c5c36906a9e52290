package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/kubeclip/kubeclip/pkg/execclient"
	"github.com/kubeclip/kubeclip/pkg/execsvc"
)

// (l): bytes through an exec, each way: --stream-bytes of random data into `wc -c` (which
// checks the count) and as many bytes out of `head -c N /dev/zero` (the bench counts them),
// request to exit, through one exec-worker on each route and through raw client-go execs into
// the same pod. Random stdin: nothing on the way may compress it.
const (
	phaseExecStream = "(l) exec streams"
	// streamTimeout bounds one transfer: 64 MiB at 1 MB/s would still pass.
	streamTimeout = 2 * time.Minute
)

func (b *bench) execStreamPhase(ctx context.Context, rep *report, key []byte) (err error) {
	size := b.s.streamBytes
	data := make([]byte, size)
	if _, err := rand.Read(data); err != nil {
		return fmt.Errorf("making the stdin: %w", err)
	}
	leases, err := b.acquirePodLeases(ctx, 1)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, b.releasePodLeases(ctx, leases)) }()
	l := leases[0]
	count := []string{"wc", "-c"}
	produce := []string{"head", "-c", strconv.Itoa(size), "/dev/zero"}

	kube, err := newExecKube(b.s.kubeconfig)
	if err != nil {
		return err
	}
	rawIn, rawOut := b.streamRounds(ctx,
		func(ctx context.Context) (string, error) {
			var out bytes.Buffer
			err := kube.run(ctx, l, count, bytes.NewReader(data), &out)
			return out.String(), err
		},
		func(ctx context.Context) (int64, error) {
			var n byteCounter
			err := kube.run(ctx, l, produce, nil, &n)
			return int64(n), err
		})

	for _, route := range []string{execsvc.RouteDaemon, execsvc.RouteKubeExec} {
		stop, err := b.startExecWorkers(ctx, route, key, 1)
		if err != nil {
			return err
		}
		in, out, err := b.routeStreams(ctx, l.Lease, data, count, produce)
		if stopErr := stop(); stopErr != nil {
			err = errors.Join(err, stopErr)
		}
		if err != nil {
			return err
		}
		label := "(l)"
		if route == execsvc.RouteKubeExec {
			label = "(l')"
		}
		mib := size >> 20
		rep.add(
			throughputRow(fmt.Sprintf("%s stdin, %d MiB into `wc -c`, %s route", label, mib, route), size, in, rawIn,
				"client-go WebSocket exec of `wc -c` in the same pod, the same bytes on its stdin"),
			throughputRow(fmt.Sprintf("%s stdout, %d MiB out of `head -c`, %s route", label, mib, route), size, out, rawOut,
				"client-go WebSocket exec of the same `head -c` in the same pod, its stdout counted"),
		)
	}
	rep.note("(l) MB/s is 10^6 bytes per second, request to exit, the median of %d transfers; one exec-worker", b.s.streamRounds)
	return nil
}

// routeStreams measures both directions through the exec service, after one `true` to warm
// the lease's connections.
func (b *bench) routeStreams(ctx context.Context, l execclient.Lease, data []byte, count, produce []string) (in, out samples, err error) {
	c, err := b.execClient(ctx)
	if err != nil {
		return in, out, err
	}
	if _, err := b.execTrue(ctx, c, l); err != nil {
		return in, out, fmt.Errorf("warming exec up: %w", err)
	}
	in, out = b.streamRounds(ctx,
		func(ctx context.Context) (string, error) {
			res, err := c.Run(ctx, execclient.Exec{
				Lease: l, Command: count[0], Args: count[1:], Timeout: streamTimeout,
				Stdin: bytes.NewReader(data), StdinBytes: int64(len(data)),
			})
			return string(res.Stdout), exitErr("wc -c", res, err)
		},
		func(ctx context.Context) (int64, error) {
			var n byteCounter
			res, err := c.Run(ctx, execclient.Exec{Lease: l, Command: produce[0], Args: produce[1:], Timeout: streamTimeout, Stdout: &n})
			return int64(n), exitErr("head -c", res, err)
		})
	return in, out, nil
}

// streamRounds runs --stream-rounds of each direction: stdin returns what `wc -c` printed,
// stdout the bytes it received; both are checked against --stream-bytes.
func (b *bench) streamRounds(ctx context.Context, stdin func(context.Context) (string, error), stdout func(context.Context) (int64, error)) (in, out samples) {
	size := b.s.streamBytes
	for range b.s.streamRounds {
		tctx, cancel := context.WithTimeout(ctx, streamTimeout+time.Minute)
		start := time.Now()
		printed, err := stdin(tctx)
		d := time.Since(start)
		if got := strings.TrimSpace(printed); err == nil && got != strconv.Itoa(size) {
			err = fmt.Errorf("wc -c counted %q bytes of stdin, want %d", got, size)
		}
		in.add(d, err)

		start = time.Now()
		n, err := stdout(tctx)
		d = time.Since(start)
		if err == nil && n != int64(size) {
			err = fmt.Errorf("received %d bytes of stdout, want %d", n, size)
		}
		out.add(d, err)
		cancel()
	}
	for _, s := range []samples{in, out} {
		if s.firstErr != nil {
			b.logf("(l) a transfer failed: %v", s.firstErr)
		}
	}
	return in, out
}

// throughputRow turns transfer times of size bytes into MB/s (10^6 B/s) at the median time.
func throughputRow(metric string, size int, s, raw samples, rawWhat string) row {
	r := row{Metric: metric, N: len(s.d), Unit: "MB/s", RawN: len(raw.d), Raw: rawWhat, Errors: s.errs + raw.errs, dist: distOf(s, raw)}
	rate := func(s samples) *float64 {
		p50 := s.p50()
		if p50 == nil || *p50 <= 0 {
			return nil
		}
		v := float64(int(10*float64(size)/1e6/(*p50/1000))) / 10
		return &v
	}
	r.P50, r.RawP50 = rate(s), rate(raw)
	if r.P50 != nil && r.RawP50 != nil {
		r.Ratio = ratio(*r.P50, *r.RawP50)
	}
	return r
}

// byteCounter is an io.Writer that counts what it is written.
type byteCounter int64

func (c *byteCounter) Write(p []byte) (int, error) {
	*c += byteCounter(len(p))
	return len(p), nil
}
