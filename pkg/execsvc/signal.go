package execsvc

import (
	"context"
	"time"

	"github.com/kubeclip/kubeclip/pkg/execproto"
)

// signal answers a signal request with one signaled message whatever happens: the answer is
// no part of the exec's stream and never ends it.
func (s *Service) signal(ctx context.Context, r *request) {
	var req execproto.SignalRequest
	answer := func(res execproto.Signaled) {
		res.ExecID = req.ExecID
		s.answerSignal(r.msg.Reply, res)
	}
	fail := func(err error) {
		perr := r.asProtocolError(err)
		answer(execproto.Signaled{Code: string(perr.Code), Message: perr.Message})
	}
	if err := decode(r.msg.Data, &req); err != nil {
		fail(err)
		return
	}
	r.log = r.log.With().Str(logKeyExecID, req.ExecID).Logger()
	rec, err := s.admit(ctx, r, req.ProviderLeaseID)
	if err != nil {
		fail(err)
		return
	}
	pod, ok := s.opts.Pods.Current(r.ref, rec)
	if !ok {
		fail(execproto.NewError(execproto.CodeWorkloadLost, "", "lease %s has no pod", rec.WorkloadName))
		return
	}
	client, err := s.clients.get(r.ref, rec, pod, s.opts.Now())
	if err != nil {
		fail(err)
		return
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err = client.Signal(sctx, req.ExecID, req.Signal)
	if err == nil {
		r.log.Info().Str(logKeySignal, req.Signal).Msg("exec signalled")
		answer(execproto.Signaled{Delivered: true})
		return
	}
	switch m := meaningOf(callSignal, err); m.fate {
	case fateExited:
		answer(execproto.Signaled{Code: execproto.SignalExited, Message: "the command and its process group are gone"})
	default:
		if m.code == execproto.CodeUnavailable {
			r.log.Warn().Err(err).Msg("signalling an exec failed")
		}
		fail(m.err(req.ExecID, pod.Name))
	}
}

// answerSignal sends a signal request's one answer.
func (s *Service) answerSignal(reply string, res execproto.Signaled) {
	if m, err := execproto.NewJSONMsg(reply, execproto.KindSignaled, res); err == nil {
		_ = s.opts.NATS.PublishMsg(m)
	}
}
