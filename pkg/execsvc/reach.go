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
		var ae *sandboxd.APIError
		switch {
		case err == nil:
			return pod, client, res, nil
		case errors.As(err, &ae):
			return Pod{}, nil, sandboxd.StartResult{}, startRefusal(ae, rec)
		case errors.Is(err, sandboxd.ErrServerKeyMismatch) && !errors.Is(lastErr, sandboxd.ErrServerKeyMismatch):
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

// startRefusal maps sandboxd's refusal of a start.
func startRefusal(ae *sandboxd.APIError, rec lease.Record) *execproto.Error {
	switch {
	case errors.Is(ae, sandboxd.ErrSpecMismatch):
		return execproto.InvalidRequest("execId", "exists with a different spec")
	case errors.Is(ae, sandboxd.ErrInvalidRequest), errors.Is(ae, sandboxd.ErrTooLarge):
		return execproto.InvalidRequest("", "sandboxd refused the command: %s", ae.Message)
	case errors.Is(ae, sandboxd.ErrDraining):
		return execproto.NewError(execproto.CodeWorkloadLost, "", "the pod of lease %s is shutting down", rec.WorkloadName)
	}
	return execproto.NewError(execproto.CodeUnavailable, "", "sandboxd refused the command (%s)", ae.Code)
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
	switch {
	case err == nil, errors.Is(err, sandboxd.ErrOffsetMismatch):
		return off, false, nil
	case errors.Is(err, sandboxd.ErrStdinClosed):
		return off, true, nil
	case errors.Is(err, sandboxd.ErrNotFound):
		return 0, false, execproto.NewError(execproto.CodeExecNotFound, "execId", "the pod has no exec %s (never started, closed, or expired)", execID)
	}
	return 0, false, execproto.NewError(execproto.CodeUnavailable, "", "sandboxd did not answer: %s", errorClass(err))
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
