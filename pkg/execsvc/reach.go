package execsvc

import (
	"context"
	"errors"
	"time"

	"github.com/kubeclip/kubeclip/pkg/execproto"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/sandboxd"
)

// startExec starts spec in the lease's pod once the pod is ready and sandboxd answers, within
// wait. Starting again after a failure in transport is safe: a repeated start of the same id
// and spec is answered with the exec that runs.
func (s *Service) startExec(ctx context.Context, r *request, rec lease.Record, spec sandboxd.Spec, wait time.Duration) (Pod, *sandboxd.Client, sandboxd.StartResult, error) {
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	backoff := 50 * time.Millisecond
	var lastErr error
	for {
		pod, err := s.opts.Pods.Ready(wctx, r.ref, rec)
		if err != nil {
			if ctx.Err() != nil {
				return Pod{}, nil, sandboxd.StartResult{}, ctx.Err()
			}
			return Pod{}, nil, sandboxd.StartResult{}, execproto.NewError(execproto.CodeNotReady, "", "the pod of lease %s was not ready within %s", rec.WorkloadName, wait)
		}
		client, err := s.clients.get(r.ref, rec, pod, s.opts.Now())
		if err != nil {
			return Pod{}, nil, sandboxd.StartResult{}, err
		}
		res, err := client.Start(wctx, spec)
		if err == nil {
			return pod, client, res, nil
		}
		if m := meaningOf(callStart, err); m.fate == fateRefused {
			return Pod{}, nil, sandboxd.StartResult{}, m.err(spec.ID, pod.Name)
		}
		if errors.Is(err, sandboxd.ErrServerKeyMismatch) && !errors.Is(lastErr, sandboxd.ErrServerKeyMismatch) {
			r.log.Error().Err(err).Msg("sandboxd does not hold the lease's key: is --sandbox-key-file the dispatcher's?")
		}
		lastErr = err
		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return Pod{}, nil, sandboxd.StartResult{}, ctx.Err()
			}
			if errors.Is(lastErr, sandboxd.ErrServerKeyMismatch) {
				return Pod{}, nil, sandboxd.StartResult{}, execproto.NewError(execproto.CodeUnavailable, "", "sandboxd in pod %s does not hold the lease's key", pod.Name)
			}
			r.log.Info().Err(lastErr).Msg("sandboxd did not answer")
			return Pod{}, nil, sandboxd.StartResult{}, execproto.NewError(execproto.CodeNotReady, "", "sandboxd in pod %s did not answer within %s", pod.Name, wait)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// reach returns the client of the lease's pod for an attach: the pod must exist.
func (s *Service) reach(ctx context.Context, r *request, rec lease.Record) (Pod, *sandboxd.Client, error) {
	if _, ok := s.opts.Pods.Current(r.ref, rec); !ok {
		return Pod{}, nil, execproto.NewError(execproto.CodeWorkloadLost, "", "lease %s has no pod", rec.WorkloadName)
	}
	wctx, cancel := context.WithTimeout(ctx, attachReadyTimeout)
	defer cancel()
	pod, err := s.opts.Pods.Ready(wctx, r.ref, rec)
	if err != nil {
		return Pod{}, nil, execproto.NewError(execproto.CodeNotReady, "", "the pod of lease %s is not ready", rec.WorkloadName)
	}
	client, err := s.clients.get(r.ref, rec, pod, s.opts.Now())
	return pod, client, err
}

// stdinState asks sandboxd how much stdin it has, with an empty write at offset 0: answered
// with the current offset (a mismatch says it), or that stdin is closed.
func stdinState(ctx context.Context, client *sandboxd.Client, execID string) (int64, bool, error) {
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	off, err := client.WriteStdin(qctx, execID, 0, nil, false)
	if err == nil {
		return off, false, nil
	}
	switch m := meaningOf(callStdinState, err); m.fate {
	case fateDone:
		return off, false, nil
	case fateStdinClosed:
		return off, true, nil
	default:
		return 0, false, m.err(execID, "")
	}
}

// errorClass names an error's kind without its text, for messages to clients.
func errorClass(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timed out"
	case errors.Is(err, sandboxd.ErrStalled):
		return "stalled"
	}
	return "connection failed"
}
