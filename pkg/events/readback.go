package events

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Reading the run stream back. A subject of the run stream can hold messages kubeclip did not
// publish: JetStream answers a publish or an API request on the reply subject its sender chose,
// from inside the account and without a permission check, so a client user that names
// <prefix>.run.<c>.<r>.result as its reply has the server's answer ({"stream":…,"seq":…}, an API
// response) stored there. kubeclip's own events always carry their CloudEvents type header;
// those answers carry no header at all. So a reader takes a message for kubeclip's event only
// when its ce-type is the event's, and looks past the others.

// maxForeignMsgs bounds how many messages without kubeclip's type a reader looks past on one
// subject before it gives up with an error: a subject that holds more is being flooded.
const maxForeignMsgs = 64

// MsgGetter is the part of a stream that reads messages by sequence and subject.
type MsgGetter interface {
	GetMsg(ctx context.Context, seq uint64, opts ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error)
}

var _ MsgGetter = (jetstream.Stream)(nil)

// Published reports whether the run stream holds kubeclip's event of type evType on subject:
// the first message there whose ce-type is evType, past any message kubeclip did not publish.
func Published(ctx context.Context, stream MsgGetter, subject, evType string) (bool, error) {
	want := EncodeHeaderValue(evType)
	seq := uint64(1)
	for range maxForeignMsgs {
		msg, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			return false, nil
		case err != nil:
			return false, fmt.Errorf("reading %s: %w", subject, err)
		}
		if msg.Header.Get(HeaderType) == want {
			return true, nil
		}
		seq = msg.Sequence + 1
	}
	return false, fmt.Errorf("reading %s: more than %d messages kubeclip did not publish", subject, maxForeignMsgs)
}

// ResultPublished reports whether kubeclip published ref's result.
func ResultPublished(ctx context.Context, stream MsgGetter, subjects Subjects, ref RunRef) (bool, error) {
	subj, err := subjects.Run(ref.CompanyID, ref.RunID, KindResult)
	if err != nil {
		return false, err
	}
	return Published(ctx, stream, subj, RunResultEvent{}.Type())
}

// IsRunEvent reports whether a message on a run subject is kubeclip's event: its ce-type is the
// type of the subject's kind. Readers skip anything else (see above).
func (s Subjects) IsRunEvent(subject string, h nats.Header) bool {
	_, _, kind, err := s.ParseRunSubject(subject)
	return err == nil && h.Get(HeaderType) == EncodeHeaderValue(runType(kind))
}
