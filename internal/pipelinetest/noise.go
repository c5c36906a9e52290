package pipelinetest

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kubeclip/kubeclip/pkg/execclient"
)

// ExecFlood is a noisy company's agent commands: one exec run over and over in its lease, a
// fixed number at a time, until Stop. The noisy-neighbour tests run it beside another company's
// execs and measure what the other company still gets.
type ExecFlood struct {
	begun time.Time
	stop  chan struct{}
	wg    sync.WaitGroup
	ended atomic.Int64
	once  sync.Once

	mu    sync.Mutex
	tally FloodTally
}

// FloodTally is how a flood's execs ended.
type FloodTally struct {
	// Exited counts the execs that exited 0.
	Exited int
	// Failed counts the others by what ended them: the client's error, or the exit status.
	Failed map[string]int
	// Took is from the flood's start to the end of its last exec.
	Took time.Duration
}

// Ended is the number of execs that ended.
func (t FloodTally) Ended() int {
	n := t.Exited
	for _, c := range t.Failed {
		n += c
	}
	return n
}

// FloodExecs starts running x with c, concurrency copies at a time, until Stop: x.Lease names
// the lease, and each copy gets a fresh exec id. ctx bounds every copy: once it ends, the copies
// in flight are killed (execclient.Client.Run) and counted failed, and no more start. x.Stdout and
// x.Stderr, if set, are shared by every copy (so must be safe for concurrent use); left nil, each
// copy's output is kept in its Result and dropped.
func FloodExecs(ctx context.Context, c *execclient.Client, x execclient.Exec, concurrency int) *ExecFlood {
	f := &ExecFlood{begun: time.Now(), stop: make(chan struct{}), tally: FloodTally{Failed: map[string]int{}}}
	x.ID = ""
	for range max(1, concurrency) {
		f.wg.Go(func() {
			for ctx.Err() == nil {
				select {
				case <-f.stop:
					return
				default:
				}
				res, err := c.Run(ctx, x)
				f.count(res, err)
			}
		})
	}
	return f
}

func (f *ExecFlood) count(res execclient.Result, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case err != nil:
		f.tally.Failed[err.Error()]++
	case res.ExitCode == nil || *res.ExitCode != 0:
		f.tally.Failed[exitStatus(res)]++
	default:
		f.tally.Exited++
	}
	f.ended.Add(1)
}

// exitStatus says how an exec that did not exit 0 ended.
func exitStatus(res execclient.Result) string {
	switch {
	case res.ExitCode != nil:
		return fmt.Sprintf("exit code %d", *res.ExitCode)
	case res.Signal != nil:
		return "signal " + *res.Signal
	default:
		return "no exit status"
	}
}

// Ended is how many execs ended so far.
func (f *ExecFlood) Ended() int { return int(f.ended.Load()) }

// Stop starts no more execs, waits for those in flight and returns how they all ended. Calling
// it again returns the same tally.
func (f *ExecFlood) Stop() FloodTally {
	f.once.Do(func() {
		close(f.stop)
		f.wg.Wait()
		f.mu.Lock()
		f.tally.Took = time.Since(f.begun)
		f.mu.Unlock()
	})
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.tally
	t.Failed = maps.Clone(f.tally.Failed)
	return t
}
