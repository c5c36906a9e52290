package runwatch

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/runwatch/verdict"
)

// publisher is the part of events.Publisher the run-watcher needs: publishing a contract event
// with publish expectations (the fences below).
type publisher interface {
	Publish(ctx context.Context, ev events.Event, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error)
}

var _ publisher = (*events.Publisher)(nil)

// runStream is the part of the run stream the run-watcher reads back: a run's last status, log
// chunk and result, a stored chunk, and a run's whole published log.
type runStream interface {
	events.LastMsgGetter
	events.MsgGetter
	OrderedConsumer(ctx context.Context, cfg jetstream.OrderedConsumerConfig) (jetstream.Consumer, error)
}

var _ runStream = (jetstream.Stream)(nil)

// errFenced: the stream refused a status or log chunk because another replica wrote the run's
// events after the ones this replica knows.
var errFenced = errors.New("another replica wrote this run's log")

// isWrongLastSequence reports the stream refusing a publish whose expected last sequence did
// not match (codes 10071, and 10164 on replicated streams).
func isWrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
}

// statusLine is a run's published status as this replica knows it: the phase and reason of its
// last status event and that event's stream sequence, which the next status publish expects.
type statusLine struct {
	phase  events.Phase
	reason string
	// podIP is the pod IP the last status event carried ("" none).
	podIP string
	// seq is the stream sequence of the run's last status event (0: none yet).
	seq uint64
}

// newStatusLine is a run with no status event yet: its created event already says Pending, so
// a status event starts with the first change.
func newStatusLine() statusLine { return statusLine{phase: events.PhasePending} }

// load reads the run's last published status. The fence expects the subject's last message
// whoever stored it (events.Stored.Seq); a last message that is not kubeclip's says no status.
func (s *statusLine) load(ctx context.Context, stream runStream, subjects events.Subjects, ref events.RunRef) error {
	last, err := events.LastRunEvent[events.RunStatusEvent](ctx, stream, subjects, ref)
	if err != nil {
		return fmt.Errorf("reading the last published status: %w", err)
	}
	if last.Ours {
		s.phase, s.reason, s.podIP = last.Event.Phase, last.Event.Reason, last.Event.PodIP
	}
	s.seq = last.Seq
	return nil
}

// publish publishes the run's status unless it says what the last one said. It is fenced like
// the log: the publish expects the run's last status to be the one this replica knows, so a
// replica that lost the run without noticing (paused, cut off) cannot append a stale status
// after the new owner's (errFenced).
//
// The pod's IP counts as something said: a status is published again, same phase and reason,
// when podIP first becomes known or changes (a Job reported Running before the informer saw
// its pod's IP; a suspended lease's next pod), because the credential broker binds the run's
// grants to the address the stream names (pkg/broker/brokersvc.Releaser). An IP that goes away
// (the pod is gone) is not news: the grants stay bound to the last one.
func (s *statusLine) publish(ctx context.Context, pub publisher, ref events.RunRef, phase events.Phase, reason, message, podName, podIP string) error {
	if podIP == "" {
		podIP = s.podIP
	}
	if phase == s.phase && reason == s.reason && podIP == s.podIP {
		return nil
	}
	ev := events.RunStatusEvent{RunID: ref.RunID, CompanyID: ref.CompanyID, Phase: phase, Reason: reason, Message: message, PodName: podName, PodIP: podIP}
	ack, err := pub.Publish(ctx, ev, jetstream.WithExpectLastSequencePerSubject(s.seq))
	if isWrongLastSequence(err) {
		return fmt.Errorf("publishing status %s: %w", phase, errFenced)
	}
	if err != nil {
		return err
	}
	s.seq, s.phase, s.reason, s.podIP = ack.Sequence, phase, reason, podIP
	return nil
}

// publishResult publishes a run's one result: how it ended and what the agent's transcript says
// about it. The stream enforces "one": the publish expects no earlier message on the result
// subject, so a second result (another replica's, or this one's after the duplicate window) is
// refused. That refusal means the run is done only when what is there is kubeclip's result of
// this run (events.ResultPublished): a message anything else stored there (an installation's
// run stream from before the clients had their own NATS account, where JetStream stored a
// client's answers on the subject it named: docs/security.md, NATS accounts, users, inboxes and replies) never suppresses the
// result, which is then published fenced on that message.
func publishResult(ctx context.Context, pub publisher, stream runStream, subjects events.Subjects, log zerolog.Logger, ref events.RunRef, end verdict.End, agent *events.AgentResult) error {
	ev := events.RunResultEvent{
		RunID: ref.RunID, CompanyID: ref.CompanyID,
		Outcome: end.Outcome, ExitCode: end.ExitCode, Reason: end.Reason, Message: end.Message,
		Agent: agent,
	}
	subject, err := subjects.Run(ref.CompanyID, ref.RunID, events.KindResult)
	if err != nil {
		return err
	}
	var last uint64 // the sequence the publish expects last on the subject
	for range resultFences {
		_, err := pub.Publish(ctx, ev, jetstream.WithExpectLastSequencePerSubject(last))
		if err == nil {
			log.Info().Str("outcome", string(end.Outcome)).Str("reason", end.Reason).Msg("published result")
			return nil
		}
		if !isWrongLastSequence(err) {
			return err
		}
		done, err := events.ResultPublished(ctx, stream, subjects, ref)
		if err != nil {
			return fmt.Errorf("reading back the run's result: %w", err)
		}
		if done {
			log.Info().Msg("the run's result was already published")
			return nil
		}
		msg, err := stream.GetLastMsgForSubject(ctx, subject)
		if err != nil {
			return fmt.Errorf("reading the last message on %s: %w", subject, err)
		}
		last = events.StoredSeq(msg)
		log.Warn().Str(events.LogKeySubject, subject).Uint64(events.LogKeySeq, last).
			Msg("the result subject holds a message kubeclip did not publish; publishing the result after it")
	}
	return fmt.Errorf("publishing the result on %s: the subject changed under each of %d publishes", subject, resultFences)
}

// resultFences bounds publishResult's attempts: each refusal either shows kubeclip's result
// (done) or moves the fence past a foreign message, which nothing in kubeclip's account
// stores any more.
const resultFences = 4

// runBudgets are the run-watcher's budgets (*events.Budgets): a log chunk is charged to them,
// and a run's end drops its counters.
type runBudgets interface {
	budgetCharger
	EndRun(ctx context.Context, ref events.RunRef) error
}

var _ runBudgets = (*events.Budgets)(nil)

// endRun is where a run ends, followed (the tracker) or lost (reconcile): its result is
// published (publishResult), then what the run kept in shared stores goes with it: its budget
// counters in KUBECLIP_BUDGETS, the exec-worker's recordings' and this watcher's logs' alike
// (events.Budgets.EndRun). They go after the result: until it is stored the run's log is still
// charged (the flush before it), and a counter dropped earlier would be written again. Dropping
// is idempotent (a result already published ends the run again) and never holds the result: a
// failure is logged and the counters expire with the bucket's TTL.
func endRun(ctx context.Context, d *deps, log zerolog.Logger, ref events.RunRef, end verdict.End, agent *events.AgentResult) error {
	if err := publishResult(ctx, d.pub, d.stream, d.opts.Subjects, log, ref, end, agent); err != nil {
		return err
	}
	if d.budgets == nil {
		return nil
	}
	if err := d.budgets.EndRun(ctx, ref); err != nil {
		log.Warn().Err(err).Msg("dropping the run's budget counters failed; they expire with their bucket's TTL")
	}
	return nil
}

// resultPublished reports whether the run's result is already in the stream (kubeclip's, not
// anything else stored on its subject: events.Published).
func resultPublished(ctx context.Context, stream runStream, subjects events.Subjects, ref events.RunRef) (bool, error) {
	if ref.Validate() != nil {
		return true, nil // a run whose ids cannot be subject tokens is never followed
	}
	return events.ResultPublished(ctx, stream, subjects, ref)
}
