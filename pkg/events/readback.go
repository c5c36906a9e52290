package events

import (
	"context"
	"errors"
	"fmt"
	"strconv"

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
//
// Every read of the run stream goes through this file, as nats.go's jetstream/kv.go reads a key:
// one message get, its headers say what it is, its payload is decoded strictly (decode) and
// checked against its subject; a subject with no message is "none", not an error.

// maxForeignMsgs bounds how many messages without kubeclip's type a reader looks past on one
// subject before it gives up with an error: a subject that holds more is being flooded.
const maxForeignMsgs = 64

// MsgGetter is the part of a stream that reads messages by sequence and subject.
type MsgGetter interface {
	GetMsg(ctx context.Context, seq uint64, opts ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error)
}

var _ MsgGetter = (jetstream.Stream)(nil)

// LastMsgGetter is the part of a stream that reads a subject's last message.
type LastMsgGetter interface {
	GetLastMsgForSubject(ctx context.Context, subject string) (*jetstream.RawStreamMsg, error)
}

var _ LastMsgGetter = (jetstream.Stream)(nil)

// Stored is one message of a run subject as the run stream holds it.
type Stored[E Event] struct {
	// Seq is the message's stream sequence, whoever published it: what a publish fenced on the
	// subject's last sequence expects. 0: the subject holds no message.
	Seq uint64
	// Ours reports that the message is kubeclip's event of E's type; Event is its payload, the
	// zero E otherwise.
	Ours  bool
	Event E
}

// LastRunEvent reads the last message on ref's subject of E's kind. Stored.Seq is 0 when the
// subject holds none; Stored.Ours is false when the last message is not kubeclip's (see above).
// A message with kubeclip's type whose payload does not decode strictly is an error: kubeclip
// never publishes one.
func LastRunEvent[E Event](ctx context.Context, stream LastMsgGetter, subjects Subjects, ref RunRef) (Stored[E], error) {
	subj, err := runSubjectOf[E](subjects, ref)
	if err != nil {
		return Stored[E]{}, err
	}
	msg, err := stream.GetLastMsgForSubject(ctx, subj)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return Stored[E]{}, nil
	}
	if err != nil {
		return Stored[E]{}, fmt.Errorf("reading the last message on %s: %w", subj, err)
	}
	return storedOf[E](subjects, msg)
}

// RunEventAt reads the run stream's message at seq as E. Stored.Seq is 0 when the stream holds
// no message there (deleted or never written); Stored.Ours is false when it is not kubeclip's
// event of E's type.
func RunEventAt[E Event](ctx context.Context, stream MsgGetter, subjects Subjects, seq uint64) (Stored[E], error) {
	msg, err := stream.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return Stored[E]{}, nil
	}
	if err != nil {
		return Stored[E]{}, fmt.Errorf("reading the run stream's message %d: %w", seq, err)
	}
	return storedOf[E](subjects, msg)
}

func storedOf[E Event](subjects Subjects, msg *jetstream.RawStreamMsg) (Stored[E], error) {
	ev, ours, err := DecodeStored[E](subjects, msg.Subject, msg.Header, msg.Data)
	if err != nil {
		return Stored[E]{}, fmt.Errorf("decoding the run stream's message %d: %w", msg.Sequence, err)
	}
	return Stored[E]{Seq: msg.Sequence, Ours: ours, Event: ev}, nil
}

// DecodeStored decodes a message read back from the run stream (a message get, or a consumer's
// delivery) as kubeclip's event of type E. ours is false, with no error, when the message is
// not one: its subject is not a run subject of E's kind or its ce-type is not E's. A message
// that is kubeclip's by both but whose payload does not decode strictly, or names another run
// than its subject, is an error.
func DecodeStored[E Event](subjects Subjects, subject string, h nats.Header, data []byte) (ev E, ours bool, err error) {
	if !subjects.IsRunEvent(subject, h) || h.Get(HeaderType) != EncodeHeaderValue(ev.Type()) {
		return ev, false, nil
	}
	decoded, err := subjects.DecodeRunEvent(subject, data)
	if err != nil {
		return ev, false, err
	}
	typed, ok := decoded.(E)
	if !ok {
		return ev, false, fmt.Errorf("a %s message decoded as %T", subject, decoded)
	}
	return typed, true, nil
}

// runSubjectOf is ref's subject of the kind E is the event of.
func runSubjectOf[E Event](subjects Subjects, ref RunRef) (string, error) {
	var zero E
	for _, kind := range RunKinds() {
		if runType(kind) == zero.Type() {
			return subjects.Run(ref.CompanyID, ref.RunID, kind)
		}
	}
	return "", fmt.Errorf("%T is not a run event", zero)
}

// Published reports whether the run stream holds kubeclip's event of type evType on subject:
// the first message there whose ce-type is evType and whose payload decodes as that event of
// the subject's company and run, past any message kubeclip did not publish. The type alone does
// not say it: JetStream's answer to a direct get of a stored event is a genuine typed copy,
// headers included, and under the single account of issue 15 a client could have it stored on
// another run's subject.
func Published(ctx context.Context, stream MsgGetter, subjects Subjects, subject, evType string) (bool, error) {
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
		if msg.Header.Get(HeaderType) == want && !copied(msg) {
			if ev, err := subjects.DecodeRunEvent(subject, msg.Data); err == nil && ev.Type() == evType {
				return true, nil
			}
		}
		seq = StoredSeq(msg) + 1
	}
	return false, fmt.Errorf("reading %s: more than %d messages kubeclip did not publish", subject, maxForeignMsgs)
}

// StoredSeq is msg's stream sequence. A stored answer to a direct get carries the copied
// message's Nats-Sequence and Nats-Subject headers, and a direct get of it adds the server's
// after them: nats.go reads the first, the copy's. The last is the message's own.
func StoredSeq(msg *jetstream.RawStreamMsg) uint64 {
	v := msg.Header.Values(jetstream.SequenceHeader)
	if len(v) < 2 {
		return msg.Sequence
	}
	seq, err := strconv.ParseUint(v[len(v)-1], 10, 64)
	if err != nil {
		return msg.Sequence
	}
	return seq
}

// copied reports whether msg is a stored answer to a direct get (see StoredSeq): whatever its
// headers say, kubeclip did not publish it. Read by a direct get it carries two Nats-Stream
// headers (the copy's and the server's); read by a message get only the copy's, whose
// Nats-Sequence is not its own.
func copied(msg *jetstream.RawStreamMsg) bool {
	if len(msg.Header.Values(jetstream.StreamHeader)) > 1 {
		return true
	}
	v := msg.Header.Values(jetstream.SequenceHeader)
	return len(v) == 1 && v[0] != strconv.FormatUint(msg.Sequence, 10)
}

// ResultPublished reports whether kubeclip published ref's result.
func ResultPublished(ctx context.Context, stream MsgGetter, subjects Subjects, ref RunRef) (bool, error) {
	subj, err := runSubjectOf[RunResultEvent](subjects, ref)
	if err != nil {
		return false, err
	}
	return Published(ctx, stream, subjects, subj, RunResultEvent{}.Type())
}

// IsRunEvent reports whether a message on a run subject is kubeclip's event: its ce-type is the
// type of the subject's kind. Readers skip anything else (see above).
func (s Subjects) IsRunEvent(subject string, h nats.Header) bool {
	_, _, kind, err := s.ParseRunSubject(subject)
	return err == nil && hasRunType(kind, h)
}

// hasRunType reports whether h's ce-type is the type of a run event of kind.
func hasRunType(kind RunKind, h nats.Header) bool {
	return h.Get(HeaderType) == EncodeHeaderValue(runType(kind))
}
