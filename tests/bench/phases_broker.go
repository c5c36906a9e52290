package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// (p): the credential broker's cost to a model call, in the same run, on the same machine:
//
//	(p)   one Messages call (a small JSON POST) through the real broker  vs  straight to the same
//	      local TLS upstream with the real key; --broker-calls of each, interleaved, after
//	      --broker-warmup of each; HTTP/1.1 keep-alive connections both ways, as a CLI's
//	(p')  a streamed call's first byte (the upstream writes its first SSE event at once)
//	      through the broker                                              vs  direct, the same way
//	(p'') --broker-streams levels of concurrent open SSE streams through the one broker
//	      process: its RSS (from /proc) and heap in use (its /metrics) before and at each level,
//	      per stream; the streams then end and every one must have carried the whole stream.
//
// The broker is the credential-broker binary from --bin (make bench builds it), a process of
// its own, so its RSS is its own; NATS (its grant cache's KV bucket), the upstream and the
// clients are in the bench process. It needs no cluster: `--phases p` runs it alone, without
// the pipeline. Timings are reported against the goals (added p50 ≤ 2 ms, p99 ≤ 10 ms;
// first byte added ≤ 1 ms), never asserted; the phase fails only when a call or a stream does
// not do what it must (status, body, the upstream seeing the real key).
const (
	phaseBroker = "(p) credential broker"
	// brokerStreamTimeout bounds (p'') from its first stream's open to its last stream's end.
	brokerStreamTimeout = 2 * time.Minute
	// brokerSettle is the pause at each level before the memory is read: the connections'
	// buffers and the handshakes' garbage of the last streams opened are in by then.
	brokerSettle = 500 * time.Millisecond
)

// The goals of issue 27's acceptance, in milliseconds.
const (
	goalCallAddedP50      = 2.0
	goalCallAddedP99      = 10.0
	goalFirstByteAddedP50 = 1.0
)

func (b *bench) brokerPhase(ctx context.Context, rep *report) (err error) {
	bin, tmp, err := b.brokerBinaryPath(ctx)
	if tmp != "" {
		defer os.RemoveAll(tmp)
	}
	if err != nil {
		return err
	}
	rig, err := startBrokerRig(ctx, bin)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, rig.close()) }()
	b.logf("(p): broker %s (pid %d) on %s, upstream %s", bin, rig.pid, rig.listen, rig.upstream.srv.Listener.Addr())

	viaBroker, direct := rig.client(true, 4), rig.client(false, 4)
	defer viaBroker.CloseIdleConnections()
	defer direct.CloseIdleConnections()
	b.logf("(p): %d calls each way (after %d each of warm-up), interleaved", b.s.brokerCalls, b.s.brokerWarmup)
	callB, callD := b.brokerPairs(ctx, viaBroker, direct, b.s.brokerCalls, func(c *http.Client, via bool) (time.Duration, error) {
		return rig.call(ctx, c, via)
	})
	b.logf("(p'): %d streamed first bytes each way", b.s.brokerFirstBytes)
	fbB, fbD := b.brokerPairs(ctx, viaBroker, direct, b.s.brokerFirstBytes, func(c *http.Client, via bool) (time.Duration, error) {
		return rig.firstByte(ctx, c, via)
	})
	levels, streamFailed, streamErr := b.brokerStreams(ctx, rig)
	calls, wrongKeys := rig.upstream.counts()

	fig := &brokerFigures{
		Binary: bin, UpstreamCalls: calls, WrongKeys: wrongKeys, StreamFailures: streamFailed, Memory: levels,
		Routes: []brokerRoute{
			routeOf("(p) call", "broker", callB), routeOf("(p) call", "direct", callD),
			routeOf("(p') first byte", "broker", fbB), routeOf("(p') first byte", "direct", fbD),
		},
		Added: []brokerAdded{
			addedOf("(p) call", callB, callD, goalCallAddedP50, goalCallAddedP99),
			addedOf("(p') first byte", fbB, fbD, goalFirstByteAddedP50, 0),
		},
	}
	rep.Broker = fig
	callRow := latencyRow("(p) model call (JSON POST /v1/messages) through the credential broker", callB, callD,
		"the same call straight to the same local TLS upstream with the real key; same run, interleaved, HTTP/1.1 keep-alive both ways",
		fmt.Sprintf("added p50 ≤ %g ms, p99 ≤ %g ms", goalCallAddedP50, goalCallAddedP99), nil)
	callRow.Met = fig.Added[0].met()
	fbRow := latencyRow("(p') streamed first byte (SSE) through the credential broker", fbB, fbD,
		"the same streamed call's first byte straight from the upstream (its first event written at once)",
		fmt.Sprintf("added p50 ≤ %g ms", goalFirstByteAddedP50), nil)
	fbRow.Met = fig.Added[1].met()
	rep.add(callRow, fbRow)
	if top := topLevel(levels); top != nil {
		rep.add(row{
			Metric: fmt.Sprintf("(p'') %d open SSE streams through one broker process: RSS per stream", top.Streams),
			N:      top.Streams, Unit: "KiB", P50: top.RSSPerStreamKiB,
			Raw: fmt.Sprintf("heap in use per stream %s, live heap (at the last collection) per stream %s; RSS %.1f → %.1f MiB (before → at %d streams); every level in the broker table",
				kib(top.HeapPerStreamKiB), kib(top.LivePerStreamKiB), levels[0].RSSMiB, top.RSSMiB, top.Streams),
			Target: "bounded: per stream, not growing with the count", Errors: streamFailed,
		})
	}
	rep.note("(p) the broker is the credential-broker binary as its own process (GOMAXPROCS = the machine's cores, shared with the bench); the upstream serves HTTP/2 and HTTP/1.1, the clients speak HTTP/1.1 as the Node CLIs do, so the broker reaches the upstream over HTTP/2 and the direct route over HTTP/1.1")

	var errs []error
	for _, s := range []struct {
		what string
		s    samples
	}{{"(p) calls through the broker", callB}, {"(p) direct calls", callD}, {"(p') first bytes through the broker", fbB}, {"(p') direct first bytes", fbD}} {
		if s.s.errs > 0 {
			errs = append(errs, fmt.Errorf("%d of the %s failed, the first: %w", s.s.errs, s.what, s.s.firstErr))
		}
	}
	if wrongKeys > 0 {
		errs = append(errs, fmt.Errorf("the upstream got %d of %d calls without the real key", wrongKeys, calls))
	}
	if streamErr != nil {
		errs = append(errs, fmt.Errorf("(p''): %d stream(s) failed, the first: %w", streamFailed, streamErr))
	}
	return errors.Join(errs...)
}

// brokerPairs measures n samples of each route, preceded by --broker-warmup of each (not kept):
// one of each in turn, the first of the pair alternating, so both routes see the same drift of
// the machine.
func (b *bench) brokerPairs(ctx context.Context, viaBroker, direct *http.Client, n int, measure func(*http.Client, bool) (time.Duration, error)) (br, dr samples) {
	for i := range b.s.brokerWarmup + n {
		if ctx.Err() != nil {
			br.add(0, context.Cause(ctx))
			return br, dr
		}
		order := []bool{true, false}
		if i%2 == 1 {
			order = []bool{false, true}
		}
		for _, via := range order {
			c, s := direct, &dr
			if via {
				c, s = viaBroker, &br
			}
			d, err := measure(c, via)
			if i >= b.s.brokerWarmup {
				s.add(d, err)
			} else if err != nil {
				s.add(0, fmt.Errorf("warm-up: %w", err))
			}
		}
	}
	return br, dr
}

// call is one Messages call, request to the whole body read; the answer must be the upstream's.
func (r *brokerRig) call(ctx context.Context, c *http.Client, viaBroker bool) (time.Duration, error) {
	req := r.request(ctx, viaBroker, callBody)
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	body, err := io.ReadAll(resp.Body)
	d := time.Since(start)
	_ = resp.Body.Close()
	if err != nil {
		return 0, fmt.Errorf("reading the answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK || string(body) != upstreamJSON {
		return 0, fmt.Errorf("answered %d with %d bytes, want 200 and the upstream's %d", resp.StatusCode, len(body), len(upstreamJSON))
	}
	if resp.ProtoMajor != 1 {
		return 0, fmt.Errorf("answered over %s, want HTTP/1.1 as a CLI's keep-alive connection", resp.Proto)
	}
	return d, nil
}

// firstByte is one streamed call: request to the first byte of the body; the rest is then read
// and the whole must be the upstream's stream.
func (r *brokerRig) firstByte(ctx context.Context, c *http.Client, viaBroker bool) (time.Duration, error) {
	req := r.request(ctx, viaBroker, streamBody)
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	buf := make([]byte, 4096)
	n := 0
	for n == 0 && err == nil {
		n, err = resp.Body.Read(buf)
	}
	d := time.Since(start)
	if n == 0 {
		return 0, fmt.Errorf("answered %d with no body: %w", resp.StatusCode, err)
	}
	rest, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, fmt.Errorf("reading the stream: %w", err)
	}
	got := string(buf[:n]) + string(rest)
	if resp.StatusCode != http.StatusOK || got != upstreamStream || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		return 0, fmt.Errorf("answered %d (%s) with %d bytes, want 200, an event stream and the upstream's %d", resp.StatusCode, resp.Header.Get("Content-Type"), len(got), len(upstreamStream))
	}
	return d, nil
}

// brokerStreams is (p”): streams held open through the broker, level by level, the broker's
// memory read before and at each level; then the streams end and each must have carried the
// upstream's whole stream. It returns the readings, the streams that failed and the first
// failure.
func (b *bench) brokerStreams(ctx context.Context, rig *brokerRig) (levels []brokerLevel, failed int, firstErr error) {
	top := b.s.brokerStreamLevels[len(b.s.brokerStreamLevels)-1]
	c := rig.client(true, top+16)
	defer c.CloseIdleConnections()
	sctx, cancel := context.WithTimeout(ctx, brokerStreamTimeout)
	defer cancel()

	var mu sync.Mutex
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		failed++
		if firstErr == nil {
			firstErr = err
		}
	}
	read := func(what string, streams int, took time.Duration) bool {
		if err := sleep(ctx, brokerSettle); err != nil {
			fail(err)
			return false
		}
		m, err := rig.memory(ctx)
		if err != nil {
			fail(err)
			return false
		}
		levels = append(levels, newBrokerLevel(what, streams, took, m, levels))
		return true
	}
	if !read("before", 0, 0) {
		return levels, failed, firstErr
	}
	opening := make(chan struct{}, b.s.brokerOpeners)
	opened := make(chan error, top)
	var wg sync.WaitGroup
	open := func() {
		defer wg.Done()
		opening <- struct{}{}
		resp, err := c.Do(rig.request(sctx, true, holdBody))
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("answered %d", resp.StatusCode)
			_ = resp.Body.Close()
		}
		if err != nil {
			<-opening
			opened <- err
			return
		}
		defer resp.Body.Close()
		first := make([]byte, len(upstreamFirstEvent))
		_, err = io.ReadFull(resp.Body, first)
		<-opening
		if err == nil && string(first) != upstreamFirstEvent {
			err = errors.New("the stream's first event is not the upstream's")
		}
		opened <- err
		if err != nil {
			return
		}
		rest, err := io.ReadAll(resp.Body)
		if err == nil && string(rest) != upstreamRestEvents {
			err = fmt.Errorf("the stream went on with %d bytes, want the upstream's %d", len(rest), len(upstreamRestEvents))
		}
		if err != nil {
			fail(fmt.Errorf("after its first event: %w", err))
		}
	}
	open0 := 0
	for _, level := range b.s.brokerStreamLevels {
		start := time.Now()
		for range level - open0 {
			wg.Add(1)
			go open()
		}
		for range level - open0 {
			if err := <-opened; err != nil {
				fail(fmt.Errorf("opening: %w", err))
			}
		}
		took := time.Since(start)
		added := level - open0
		open0 = level
		if failed > 0 {
			break
		}
		b.logf("(p''): %d streams open (the last %d in %s)", level, added, took.Round(time.Millisecond))
		if !read(fmt.Sprintf("%d open", level), level, took) {
			break
		}
	}
	rig.upstream.releaseStreams()
	wg.Wait()
	// The clients hang up too, as the CLIs exit: what the broker holds then is what the streams
	// left behind (its goroutines back to "before"'s; its heap in use still counts the garbage
	// no collection has taken yet).
	c.CloseIdleConnections()
	read("after they ended", 0, 0)
	return levels, failed, firstErr
}

// brokerFigures are (p)'s raw columns, printed as their own tables and kept in the JSON.
type brokerFigures struct {
	Binary         string        `json:"binary"`
	Routes         []brokerRoute `json:"routes"`
	Added          []brokerAdded `json:"added"`
	Memory         []brokerLevel `json:"memory"`
	UpstreamCalls  int           `json:"upstreamCalls"`
	WrongKeys      int           `json:"wrongKeys"`
	StreamFailures int           `json:"streamFailures"`
}

// brokerRoute is one route's samples of one measurement (ms).
type brokerRoute struct {
	What   string   `json:"what"`
	Route  string   `json:"route"`
	N      int      `json:"n"`
	Errors int      `json:"errors"`
	P50    *float64 `json:"p50"`
	P99    *float64 `json:"p99"`
	Max    *float64 `json:"max"`
}

func routeOf(what, route string, s samples) brokerRoute {
	return brokerRoute{What: what, Route: route, N: len(s.d), Errors: s.errs, P50: s.p50(), P99: s.p99(), Max: s.percentile(1)}
}

// brokerAdded is what the broker added to a measurement: its percentile minus the direct
// route's, each beside its goal (0: none) and its share of it.
type brokerAdded struct {
	What      string   `json:"what"`
	P50       *float64 `json:"addedP50"`
	P99       *float64 `json:"addedP99"`
	GoalP50   float64  `json:"goalP50,omitempty"`
	GoalP99   float64  `json:"goalP99,omitempty"`
	P50OfGoal *float64 `json:"p50OfGoal,omitempty"`
	P99OfGoal *float64 `json:"p99OfGoal,omitempty"`
}

func addedOf(what string, br, dr samples, goalP50, goalP99 float64) brokerAdded {
	a := brokerAdded{What: what, GoalP50: goalP50, GoalP99: goalP99}
	diff := func(x, y *float64) *float64 {
		if x == nil || y == nil {
			return nil
		}
		v := math.Round(1000*(*x-*y)) / 1000
		return &v
	}
	a.P50, a.P99 = diff(br.p50(), dr.p50()), diff(br.p99(), dr.p99())
	if a.P50 != nil && goalP50 > 0 {
		a.P50OfGoal = round2(*a.P50 / goalP50)
	}
	if a.P99 != nil && goalP99 > 0 {
		a.P99OfGoal = round2(*a.P99 / goalP99)
	}
	return a
}

// met says whether every goal held; nil without figures.
func (a brokerAdded) met() *bool {
	if a.P50 == nil || a.P99 == nil {
		return nil
	}
	ok := (a.GoalP50 == 0 || *a.P50 <= a.GoalP50) && (a.GoalP99 == 0 || *a.P99 <= a.GoalP99)
	return &ok
}

// brokerLevel is one reading of the broker's memory: before the streams, at a level, after.
type brokerLevel struct {
	At          string  `json:"at"`
	Streams     int     `json:"streams"`
	OpenSeconds float64 `json:"openSeconds,omitempty"`
	RSSMiB      float64 `json:"rssMiB"`
	HeapMiB     float64 `json:"heapInuseMiB"`
	// LiveMiB is the heap the broker's last collection left live (heap in use counts the
	// garbage not yet collected too); StacksMiB its goroutines' stacks, outside the heap.
	LiveMiB    float64 `json:"liveHeapMiB"`
	StacksMiB  float64 `json:"stacksMiB"`
	Goroutines int     `json:"goroutines"`
	// The per-stream figures are the growth since "before" over the open streams (nil before
	// and after).
	RSSPerStreamKiB  *float64 `json:"rssPerStreamKiB,omitempty"`
	HeapPerStreamKiB *float64 `json:"heapPerStreamKiB,omitempty"`
	LivePerStreamKiB *float64 `json:"liveHeapPerStreamKiB,omitempty"`
}

func newBrokerLevel(at string, streams int, took time.Duration, m brokerMemory, earlier []brokerLevel) brokerLevel {
	l := brokerLevel{
		At: at, Streams: streams, OpenSeconds: math.Round(10*took.Seconds()) / 10,
		RSSMiB: inMiB(m.rss), HeapMiB: inMiB(m.heapInuse), LiveMiB: inMiB(m.liveHeap), StacksMiB: inMiB(m.stacks),
		Goroutines: m.goroutines,
	}
	if streams > 0 && len(earlier) > 0 {
		before := earlier[0]
		per := func(now, then float64) *float64 { return round1((now - then) * 1024 / float64(streams)) }
		l.RSSPerStreamKiB = per(l.RSSMiB, before.RSSMiB)
		l.HeapPerStreamKiB = per(l.HeapMiB, before.HeapMiB)
		l.LivePerStreamKiB = per(l.LiveMiB, before.LiveMiB)
	}
	return l
}

func inMiB(b int64) float64 { return math.Round(100*float64(b)/(1<<20)) / 100 }

// topLevel is the reading at the most streams, nil without one.
func topLevel(levels []brokerLevel) *brokerLevel {
	var top *brokerLevel
	for i := range levels {
		if levels[i].Streams > 0 && (top == nil || levels[i].Streams > top.Streams) {
			top = &levels[i]
		}
	}
	return top
}

func kib(v *float64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.1f KiB", *v)
}

// print prints (p)'s raw columns: each route's samples, what the broker added against
// the goals, and its memory at each level.
func (f *brokerFigures) print(w io.Writer) error {
	fmt.Fprintf(w, "\ncredential broker (p): %s as its own process; upstream calls %d, without the real key %d; streams failed %d\n", f.Binary, f.UpstreamCalls, f.WrongKeys, f.StreamFailures)
	tables := []func(io.Writer){
		func(tw io.Writer) {
			fmt.Fprintln(tw, "measurement\troute\tn\tp50\tp99\tmax\terrors\t")
			for _, r := range f.Routes {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%d\t\n", r.What, r.Route, r.N, num(r.P50, "ms"), num(r.P99, "ms"), num(r.Max, "ms"), r.Errors)
			}
		},
		func(tw io.Writer) {
			fmt.Fprintln(tw, "added by the broker\tp50\tgoal\tof goal\tp99\tgoal\tof goal\t")
			for _, a := range f.Added {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", a.What, num(a.P50, "ms"), goal(a.GoalP50), num(a.P50OfGoal, "×"), num(a.P99, "ms"), goal(a.GoalP99), num(a.P99OfGoal, "×"))
			}
		},
		func(tw io.Writer) {
			fmt.Fprintln(tw, "broker memory\tstreams\topened in s\tRSS MiB\theap in use MiB\tlive heap MiB\tstacks MiB\tgoroutines\tRSS/stream\theap in use/stream\tlive heap/stream\t")
			for _, l := range f.Memory {
				opened := "-"
				if l.Streams > 0 {
					opened = fmt.Sprintf("%.1f", l.OpenSeconds)
				}
				fmt.Fprintf(tw, "%s\t%d\t%s\t%.1f\t%.1f\t%.1f\t%.1f\t%d\t%s\t%s\t%s\t\n", l.At, l.Streams, opened, l.RSSMiB, l.HeapMiB, l.LiveMiB, l.StacksMiB,
					l.Goroutines, kib(l.RSSPerStreamKiB), kib(l.HeapPerStreamKiB), kib(l.LivePerStreamKiB))
			}
		},
	}
	for i, table := range tables {
		if i > 0 {
			fmt.Fprintln(w)
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight|tabwriter.Debug)
		table(tw)
		if err := tw.Flush(); err != nil {
			return fmt.Errorf("printing the broker's figures: %w", err)
		}
	}
	return nil
}

func goal(v float64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf("≤ %g ms", v)
}
