package execclient

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kubeclip/kubeclip/pkg/execproto"
	"github.com/kubeclip/kubeclip/pkg/execspec"
)

// resizeReplyTimeout bounds the wait for a resize message's answer (the replica gives
// sandboxd 5 s).
const resizeReplyTimeout = 10 * time.Second

// resizer sends a terminal's new sizes to the replica serving the exec: only the latest size
// matters, so one that got no answer is sent again (to the replica of the latest `started`)
// unless a newer one replaced it. sandboxd keeps the size, so a takeover needs no resend.
type resizer struct {
	nc      *nats.Conn
	sizes   <-chan execspec.TTY
	targets chan string // io subjects of `started` messages; the latest wins
	cancel  context.CancelFunc
	done    chan struct{}
}

func newResizer(nc *nats.Conn, sizes <-chan execspec.TTY) *resizer {
	return &resizer{nc: nc, sizes: sizes, targets: make(chan string, 1), done: make(chan struct{})}
}

func (r *resizer) start(ctx context.Context) {
	ctx, r.cancel = context.WithCancel(ctx)
	go r.run(ctx)
}

// resume points the resizer at the io subject a `started` named.
func (r *resizer) resume(subject string) {
	for {
		select {
		case r.targets <- subject:
			return
		default:
			select { // replace a subject not taken yet
			case <-r.targets:
			default:
			}
		}
	}
}

func (r *resizer) stop() {
	r.cancel()
	<-r.done
}

func (r *resizer) run(ctx context.Context) {
	defer close(r.done)
	var (
		subject string
		want    *execspec.TTY // the latest size not confirmed yet
		retry   <-chan time.Time
	)
	sizes := r.sizes
	for {
		if subject != "" && want != nil && retry == nil {
			reply, err := r.request(ctx, subject, *want)
			switch {
			case err != nil: // no answer: again in a second, or to the next replica
				retry = time.After(time.Second)
			case !reply.Resized && reply.Code == execproto.SignalExited:
				return // the command exited: nothing more to size
			default: // taken, or refused for good (no terminal): either way not again
				want = nil
			}
		}
		select {
		case sz, ok := <-sizes:
			if !ok {
				sizes = nil
				continue
			}
			want, retry = &sz, nil
		case subject = <-r.targets:
			retry = nil
		case <-retry:
			retry = nil
		case <-ctx.Done():
			return
		}
	}
}

func (r *resizer) request(ctx context.Context, subject string, sz execspec.TTY) (execproto.ResizeReply, error) {
	ctx, cancel := context.WithTimeout(ctx, resizeReplyTimeout)
	defer cancel()
	resp, err := r.nc.RequestMsgWithContext(ctx, execproto.NewResizeMsg(subject, sz))
	if err != nil {
		return execproto.ResizeReply{}, err
	}
	var reply execproto.ResizeReply
	if err := json.Unmarshal(resp.Data, &reply); err != nil {
		return execproto.ResizeReply{}, errors.Join(errProtocol, err)
	}
	return reply, nil
}
