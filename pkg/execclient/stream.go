package execclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kubeclip/kubeclip/pkg/execproto"
	"github.com/kubeclip/kubeclip/pkg/execspec"
)

// inboxBuffer holds the messages of one exec's inbox: a replica keeps at most 8 MiB unacked,
// which is 128 chunks of 64 KiB, or many more small ones.
const inboxBuffer = 4096

// stream is one exec's conversation: its inbox, the requests that (re)start it, and what has
// arrived. It runs on the caller's goroutine; the stdin sender has its own.
type stream struct {
	c         *Client
	lease     Lease
	execID    string
	inbox     string
	start     *execproto.StartRequest // nil for an attach
	observer  bool                    // attached to another client's exec: no close
	stdin     *stdinSender
	resizer   *resizer  // nil without a terminal or its resizes
	deadline  time.Time // zero: none
	onStarted func(string)
	onNotice  func(execproto.Notice)

	started   bool // a `started` arrived (after it, resumes attach)
	ioSubj    string
	next      uint64 // the next seq needed
	acked     uint64
	unacked   int
	out       [2]*output
	live      [2]io.Writer
	pending   *execspec.Exit // an exit that arrived before chunks it covers
	lastHeard time.Time
	resumed   time.Time
	noResp    time.Time // since when no exec-worker received the requests
	res       Result
}

func (c *Client) newStream(l Lease, execID string, stdout, stderr io.Writer) (*stream, error) {
	if err := (execproto.AttachRequest{ExecID: execID, ProviderLeaseID: l.ProviderLeaseID, FromSeq: 1}).Validate(); err != nil {
		return nil, err
	}
	st := &stream{
		c: c, lease: l, execID: execID, inbox: c.opts.NATS.NewRespInbox(), next: 1,
		out:  [2]*output{{limit: c.opts.MaxOutputBytes}, {limit: c.opts.MaxOutputBytes}},
		live: [2]io.Writer{stdout, stderr},
		res:  Result{ExecID: execID},
	}
	return st, nil
}

// run sends the start (or attach) and handles the inbox until the exit.
func (st *stream) run(ctx context.Context) (Result, error) {
	ch := make(chan *nats.Msg, inboxBuffer)
	sub, err := st.c.opts.NATS.ChanSubscribe(st.inbox, ch)
	if err != nil {
		return st.res, fmt.Errorf("subscribing to the exec's inbox: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	_ = sub.SetPendingLimits(-1, 256<<20)
	if st.stdin != nil {
		st.stdin.start(ctx)
		defer st.stdin.stop()
	}
	if st.resizer != nil {
		st.resizer.start(ctx)
		defer st.resizer.stop()
	}
	st.acked = st.next - 1
	st.lastHeard = st.c.opts.Now()
	if err := st.request(); err != nil {
		return st.res, err
	}
	tick := time.NewTicker(st.c.opts.StallTimeout / 6)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			st.kill(ctx)
			return st.finish(), ctx.Err()
		case m := <-ch:
			exit, err := st.handle(m)
			if err != nil {
				return st.finish(), err
			}
			if exit != nil {
				st.res.ExitCode, st.res.Signal, st.res.TimedOut = exit.ExitCode, exit.Signal, exit.TimedOut
				st.res.LastSeq = exit.LastSeq
				st.res.Truncated = st.res.Truncated || exit.Truncated
				st.done()
				return st.finish(), nil
			}
		case <-tick.C:
			now := st.c.opts.Now()
			if !st.deadline.IsZero() && now.After(st.deadline) {
				st.kill(ctx)
				return st.finish(), ErrNoExit
			}
			if now.Sub(st.lastHeard) >= st.c.opts.StallTimeout {
				if err := st.resume(); err != nil {
					return st.finish(), err
				}
			}
		}
	}
}

// handle processes one inbox message; it returns the exit once every chunk it covers is in.
func (st *stream) handle(m *nats.Msg) (*execspec.Exit, error) {
	now := st.c.opts.Now()
	st.lastHeard = now
	if m.Header.Get("Status") == "503" { // no exec-worker received the request
		if st.noResp.IsZero() {
			st.noResp = now
		}
		if now.Sub(st.noResp) > st.c.opts.NoResponders {
			return nil, execproto.NewError(execproto.CodeUnavailable, "", "no exec-worker answers")
		}
		st.lastHeard = now.Add(-st.c.opts.StallTimeout + time.Second) // ask again in a second
		return nil, nil
	}
	st.noResp = time.Time{}
	switch execproto.KindOf(m) {
	case execproto.KindStarted:
		var s execproto.Started
		if err := json.Unmarshal(m.Data, &s); err != nil {
			return nil, fmt.Errorf("%w: started: %w", errProtocol, err)
		}
		st.started, st.ioSubj, st.res.Replica = true, s.IOSubject, s.Replica
		if st.onStarted != nil {
			st.onStarted(s.Replica)
		}
		if st.stdin != nil {
			st.stdin.resume(s.IOSubject, s.StdinOffset, s.StdinClosed)
		}
		if st.resizer != nil {
			st.resizer.resume(s.IOSubject)
		}
	case execproto.KindOut:
		seq, ok := execproto.Uint(m, execproto.HeaderSeq)
		i := streamIndex(m.Header.Get(execproto.HeaderStream))
		if !ok || i < 0 {
			return nil, fmt.Errorf("%w: out message without a seq or stream", errProtocol)
		}
		switch {
		case seq < st.next: // a duplicate after a resume
		case seq > st.next:
			st.gap()
		default:
			st.next++
			if w := st.live[i]; w != nil {
				if _, err := w.Write(m.Data); err != nil {
					return nil, fmt.Errorf("writing the exec's output: %w", err)
				}
			} else {
				st.out[i].add(m.Data)
			}
			st.unacked += len(m.Data)
			if st.unacked >= execproto.AckEvery/2 {
				st.ack()
			}
			if p := st.pending; p != nil && st.next > p.LastSeq {
				return p, nil
			}
		}
	case execproto.KindHeartbeat:
		if seq, ok := execproto.Uint(m, execproto.HeaderSeq); ok && seq >= st.next {
			st.gap() // the replica sent chunks this client does not have
		}
		if st.unacked > 0 {
			st.ack()
		}
	case execproto.KindExit:
		var e execspec.Exit
		if err := json.Unmarshal(m.Data, &e); err != nil {
			return nil, fmt.Errorf("%w: exit: %w", errProtocol, err)
		}
		if e.LastSeq >= st.next {
			st.pending = &e // chunks are missing: get them first
			st.gap()
			return nil, nil
		}
		return &e, nil
	case execproto.KindNotice:
		var n execproto.Notice
		if err := json.Unmarshal(m.Data, &n); err == nil && st.onNotice != nil {
			st.onNotice(n)
		}
	case execproto.KindError:
		var e execproto.Error
		if err := json.Unmarshal(m.Data, &e); err != nil {
			return nil, fmt.Errorf("%w: error: %w", errProtocol, err)
		}
		if e.Code == execproto.CodeUnavailable && (st.deadline.IsZero() || now.Before(st.deadline)) {
			st.lastHeard = now.Add(-st.c.opts.StallTimeout + time.Second) // try again in a second
			return nil, nil
		}
		return nil, &e
	}
	return nil, nil
}

var errProtocol = errors.New("execclient: malformed message")

// gap attaches from the first missing seq, at most once a second.
func (st *stream) gap() {
	if st.c.opts.Now().Sub(st.resumed) >= time.Second {
		_ = st.resume()
	}
}

// resume asks any replica to continue: the start again while nothing started (a repeated start
// is an attach from seq 1), else an attach from the next seq needed.
func (st *stream) resume() error {
	st.res.Attaches++
	st.lastHeard = st.c.opts.Now()
	return st.request()
}

func (st *stream) request() error {
	st.resumed = st.c.opts.Now()
	op, body := execproto.OpAttach, any(execproto.AttachRequest{ExecID: st.execID, ProviderLeaseID: st.lease.ProviderLeaseID, FromSeq: st.next})
	if st.start != nil && !st.started {
		op, body = execproto.OpStart, st.start
	}
	subj, err := st.c.subjects.Request(st.lease.CompanyID, st.lease.RunID, op)
	if err != nil {
		return err
	}
	data, err := json.Marshal(body)
	if err != nil {
		return err
	}
	if err := st.c.opts.NATS.PublishRequest(subj, st.inbox, data); err != nil {
		return fmt.Errorf("sending the exec's %s: %w", op, err)
	}
	return nil
}

func (st *stream) ack() {
	if st.ioSubj == "" || st.next-1 <= st.acked {
		return
	}
	st.acked, st.unacked = st.next-1, 0
	m := execproto.NewMsg(st.ioSubj, execproto.KindAck, nil)
	execproto.SetUint(m, execproto.HeaderSeq, st.acked)
	_ = st.c.opts.NATS.PublishMsg(m)
}

// done acknowledges everything and, for the exec's own client, closes it: the journal goes.
func (st *stream) done() {
	st.ack()
	if st.observer || st.ioSubj == "" {
		return
	}
	m := execproto.NewMsg(st.ioSubj, execproto.KindClose, nil)
	execproto.SetUint(m, execproto.HeaderSeq, st.next-1)
	_ = st.c.opts.NATS.PublishMsg(m)
}

// kill sends SIGKILL to an exec this client started, when it gives up on it.
func (st *stream) kill(ctx context.Context) {
	if st.observer {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	_, _ = st.c.Signal(ctx, st.lease, st.execID, "SIGKILL")
}

func (st *stream) finish() Result {
	st.res.Stdout, st.res.Stderr = st.out[0].data, st.out[1].data
	st.res.Truncated = st.res.Truncated || st.out[0].truncated || st.out[1].truncated
	return st.res
}

func streamIndex(s string) int {
	switch s {
	case execproto.StreamStdout:
		return 0
	case execproto.StreamStderr:
		return 1
	}
	return -1
}

// output keeps a stream's bytes up to limit.
type output struct {
	data      []byte
	limit     int
	truncated bool
}

// add keeps what fits of b.
func (o *output) add(b []byte) {
	room := o.limit - len(o.data)
	if len(b) > room {
		o.truncated = true
		b = b[:max(room, 0)]
	}
	o.data = append(o.data, b...)
}

// decodeReply decodes a reply of kind into v; an `error` reply is returned as *execproto.Error.
func decodeReply(m *nats.Msg, kind execproto.Kind, v any) error {
	switch execproto.KindOf(m) {
	case kind:
		return json.Unmarshal(m.Data, v)
	case execproto.KindError:
		var e execproto.Error
		if err := json.Unmarshal(m.Data, &e); err != nil {
			return fmt.Errorf("%w: error: %w", errProtocol, err)
		}
		return &e
	}
	return fmt.Errorf("%w: a %q reply, want %q", errProtocol, execproto.KindOf(m), kind)
}
