package execclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kubeclip/kubeclip/pkg/execproto"
)

// stdinSender sends a command's stdin to the io subject of the replica serving it, one chunk at
// a time, each answered with how much sandboxd has. Only the chunk in flight is kept: sandboxd
// confirmed everything before it. When another replica takes the exec over, its `started`
// says where sandboxd is, and sending continues from there.
type stdinSender struct {
	nc      *nats.Conn
	r       io.Reader
	chunks  chan stdinChunk
	targets chan stdinTarget
	cancel  context.CancelFunc // set by start
	done    chan struct{}      // closed when send returns
}

type stdinChunk struct {
	data []byte
	eof  bool
}

// stdinTarget is a `started` message's view of stdin.
type stdinTarget struct {
	subject string
	offset  int64
	closed  bool
}

func newStdinSender(nc *nats.Conn, r io.Reader) *stdinSender {
	return &stdinSender{nc: nc, r: r, chunks: make(chan stdinChunk), targets: make(chan stdinTarget, 1), done: make(chan struct{})}
}

// start runs the sender until stop; it sends nothing before the first resume.
func (s *stdinSender) start(ctx context.Context) {
	ctx, s.cancel = context.WithCancel(ctx)
	go s.read(ctx)
	go s.send(ctx)
}

// resume points the sender at the replica a `started` named.
func (s *stdinSender) resume(subject string, offset int64, closed bool) {
	t := stdinTarget{subject: subject, offset: offset, closed: closed}
	for {
		select {
		case s.targets <- t:
			return
		default:
			select { // replace a target not taken yet
			case <-s.targets:
			default:
			}
		}
	}
}

// stop ends the sender and waits for it; a read blocked in the reader ends with the reader.
func (s *stdinSender) stop() {
	s.cancel()
	<-s.done
}

// read feeds the reader's data in chunks of at most execproto.MaxStdinChunk. Each chunk is a
// copy of what one read returned: a terminal's reads are a few bytes each.
func (s *stdinSender) read(ctx context.Context) {
	buf := make([]byte, execproto.MaxStdinChunk)
	for {
		n, err := s.r.Read(buf)
		c := stdinChunk{data: bytes.Clone(buf[:n]), eof: err != nil} // a read error ends stdin like EOF
		if n == 0 && !c.eof {
			continue
		}
		select {
		case s.chunks <- c:
		case <-ctx.Done():
			return
		}
		if c.eof {
			return
		}
	}
}

func (s *stdinSender) send(ctx context.Context) {
	defer close(s.done)
	var (
		t       stdinTarget
		pend    []byte // read, not confirmed by sandboxd, starting at pendOff
		pendOff int64
		eof     bool // the reader is done: pend is the end of stdin
	)
	select {
	case t = <-s.targets:
	case <-ctx.Done():
		return
	}
	for {
		if t.closed {
			return // sandboxd takes no more (the command exited, or eof went through)
		}
		// Drop what sandboxd has. It never has less than was confirmed before pend: if it did,
		// the bytes are gone, and the command gets no more stdin.
		if t.offset < pendOff {
			return
		}
		if k := t.offset - pendOff; k > 0 {
			if k >= int64(len(pend)) {
				if eof && k == int64(len(pend)) && len(pend) > 0 {
					return
				}
				pend, pendOff = nil, t.offset
			} else {
				pend, pendOff = pend[k:], t.offset
			}
		}
		if len(pend) == 0 && !eof {
			select {
			case c := <-s.chunks:
				pend, eof = c.data, c.eof
				continue
			case t = <-s.targets:
				continue
			case <-ctx.Done():
				return
			}
		}
		reply, err := s.request(ctx, t.subject, pendOff, pend, eof)
		switch {
		case err == nil && reply.Closed:
			return
		case err == nil:
			if eof && reply.Offset == pendOff+int64(len(pend)) {
				return // everything, eof included, went through
			}
			t.offset = reply.Offset
		default: // no answer: wait for a resume, or try the same replica again
			select {
			case t = <-s.targets:
			case <-time.After(time.Second):
			case <-ctx.Done():
				return
			}
		}
	}
}

func (s *stdinSender) request(ctx context.Context, subject string, offset int64, data []byte, eof bool) (execproto.StdinReply, error) {
	m := execproto.NewMsg(subject, execproto.KindStdin, data)
	m.Header.Set(execproto.HeaderOffset, strconv.FormatInt(offset, 10))
	if eof {
		m.Header.Set(execproto.HeaderEOF, "1")
	}
	ctx, cancel := context.WithTimeout(ctx, stdinReplyTimeout)
	defer cancel()
	resp, err := s.nc.RequestMsgWithContext(ctx, m)
	if err != nil {
		return execproto.StdinReply{}, err
	}
	var r execproto.StdinReply
	if err := json.Unmarshal(resp.Data, &r); err != nil {
		return execproto.StdinReply{}, errors.Join(errProtocol, err)
	}
	return r, nil
}
