package dispatch

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
)

// Busy-agent acquires wait outside the dispatch consumer. A dispatch whose agent is busy is
// copied to KUBECLIP_PARKED, on a subject of its own agent, and acknowledged: waiting holds no
// delivery slot of the work queue, so one company's thousand waiting acquires do not delay
// another company's (a NakWithDelay would keep each one pending against MaxAckPending, and
// fill it). When the agent is freed, the dispatcher that freed it republishes the agent's
// oldest parked dispatch to the work queue; a sweep every AgentBusyRetry catches guards that
// lapsed by TTL and fails dispatches that waited AgentBusyTimeout with agent_busy.
const (
	// ParkedStream holds parked dispatches.
	ParkedStream = "KUBECLIP_PARKED"
	// parkedSubjectPrefix: kubeclip.parked.<agent token>.
	parkedSubjectPrefix = "kubeclip.parked."
	// headerQueuedAt carries when the acquire first reached the work queue (RFC 3339 nano) on
	// parked and republished dispatches, so the busy timeout counts from the acquire, not from
	// the last time it was parked.
	headerQueuedAt = "Kubeclip-Queued-At"
	// parkedMaxAge drops a parked dispatch a sweep never got to (no dispatcher ran for a day):
	// like the work queue's own age limit, a day-old acquire is not run late.
	parkedMaxAge = 24 * time.Hour
)

// ParkedStreamConfig is the KUBECLIP_PARKED stream: limits retention (parked dispatches are
// deleted one by one when they leave), file storage (a parked acquire is a run Paperclip waits
// for), and the work queue's message size.
//
// It takes its share of the store (events.StoreLimit) and, full, refuses new parked
// dispatches (the dispatch stays on the work queue and is retried) rather than drop one.
func ParkedStreamConfig(replicas int, storeBytes int64) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        ParkedStream,
		Description: "kubeclip dispatches waiting for their agent's previous run",
		Subjects:    []string{parkedSubjectPrefix + ">"},
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardNew,
		MaxAge:      parkedMaxAge,
		MaxMsgs:     -1,
		MaxBytes:    events.StoreLimit(storeBytes, events.StoreParked),
		MaxMsgSize:  events.DefaultMaxMsgSize,
		Duplicates:  events.DefaultDuplicates,
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
	}
}

// parkedSubject is the agent's parking subject. Company and agent ids may contain '.', so the
// pair is base64url-encoded into one subject token.
func parkedSubject(companyID, agentID string) string {
	return parkedSubjectPrefix + base64.RawURLEncoding.EncodeToString([]byte(companyID+"\x00"+agentID))
}

// park copies the dispatch m to its agent's parking subject; the caller then acknowledges m.
// The copy's message id comes from m's stream sequence, so a redelivered m parks once.
func (d *Dispatcher) park(ctx context.Context, log zerolog.Logger, m jetstream.Msg, req events.AcquireRequest, queuedAt time.Time) error {
	md, err := m.Metadata()
	if err != nil {
		return fmt.Errorf("reading the dispatch's metadata: %w", err)
	}
	msg := nats.NewMsg(parkedSubject(req.CompanyID, req.AgentID))
	msg.Data = m.Data()
	msg.Header.Set(headerQueuedAt, queuedAt.UTC().Format(time.RFC3339Nano))
	msg.Header.Set(jetstream.MsgIDHeader, events.Ref(req.CompanyID, req.RunID).MsgID("parked."+strconv.FormatUint(md.Sequence.Stream, 10)))
	if _, err := d.opts.JetStream.PublishMsg(ctx, msg, jetstream.WithExpectStream(ParkedStream)); err != nil {
		return fmt.Errorf("parking the dispatch: %w", err)
	}
	log.Debug().Msg("agent busy; dispatch parked")
	return nil
}

// unpark republishes the agent's oldest parked dispatch whose lease is still live to the work
// queue, and deletes it from the parking stream; parked dispatches of leases released (or
// failed) while they waited are dropped on the way. The republished message's id comes from
// the parked message's sequence, so two dispatchers unparking the same one put one copy in the
// queue.
func (d *Dispatcher) unpark(ctx context.Context, companyID, agentID string) error {
	parked, err := d.nextParked(ctx, parkedSubject(companyID, agentID))
	if parked == nil || err != nil {
		return err
	}
	return d.republish(ctx, parked)
}

// nextParked returns the oldest parked dispatch on subj whose lease is live, dropping the
// others it meets first; nil when there is none.
func (d *Dispatcher) nextParked(ctx context.Context, subj string) (*jetstream.RawStreamMsg, error) {
	for {
		parked, err := d.parked.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(subj))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("reading parked dispatches: %w", err)
		}
		req, err := events.DecodeDispatch(dispatchSubjectOf(parked.Data), parked.Data)
		if err == nil {
			rec, _, rerr := d.records.Get(ctx, events.Ref(req.CompanyID, req.RunID))
			if rerr != nil && !errors.Is(rerr, lease.ErrNotFound) {
				return nil, rerr
			}
			if rerr == nil && rec.State.Live() {
				return parked, nil
			}
		}
		if err := d.dropParked(ctx, parked.Sequence); err != nil {
			return nil, err
		}
	}
}

func (d *Dispatcher) republish(ctx context.Context, parked *jetstream.RawStreamMsg) error {
	req, err := events.DecodeDispatch(dispatchSubjectOf(parked.Data), parked.Data)
	if err != nil {
		// Nothing kubeclip parks fails to decode; drop it rather than block the agent.
		return d.dropParked(ctx, parked.Sequence)
	}
	subj, err := events.DispatchSubject(req.CompanyID, req.RunID)
	if err != nil {
		return d.dropParked(ctx, parked.Sequence)
	}
	msg := nats.NewMsg(subj)
	msg.Data = parked.Data
	msg.Header.Set(headerQueuedAt, parked.Header.Get(headerQueuedAt))
	msg.Header.Set(jetstream.MsgIDHeader, events.Ref(req.CompanyID, req.RunID).MsgID("dispatch."+strconv.FormatUint(parked.Sequence, 10)))
	if _, err := d.opts.JetStream.PublishMsg(ctx, msg, jetstream.WithExpectStream(events.WorkStream)); err != nil {
		return fmt.Errorf("republishing a parked dispatch: %w", err)
	}
	return d.dropParked(ctx, parked.Sequence)
}

func (d *Dispatcher) dropParked(ctx context.Context, seq uint64) error {
	err := d.parked.DeleteMsg(ctx, seq)
	if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) && !errors.Is(err, jetstream.ErrMsgDeleteUnsuccessful) {
		return fmt.Errorf("deleting parked dispatch %d: %w", seq, err)
	}
	return nil
}

// sweepLoop looks at every parked agent every AgentBusyRetry: an agent that is free (its guard
// lapsed, or the run that freed it unparked nothing because the dispatch parked a moment
// later) gets its oldest dispatch back; a dispatch that waited AgentBusyTimeout fails with
// agent_busy.
func (d *Dispatcher) sweepLoop(ctx context.Context) {
	tick := time.NewTicker(d.opts.AgentBusyRetry)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if err := d.sweep(ctx); err != nil && ctx.Err() == nil {
			d.log.Warn().Err(err).Msg("sweeping parked dispatches failed")
		}
	}
}

func (d *Dispatcher) sweep(ctx context.Context) error {
	info, err := d.parked.Info(ctx, jetstream.WithSubjectFilter(parkedSubjectPrefix+">"))
	if err != nil {
		return fmt.Errorf("reading parked agents: %w", err)
	}
	for subj := range info.State.Subjects {
		if err := d.sweepAgent(ctx, subj); err != nil {
			return err
		}
	}
	return nil
}

// sweepAgent fails the agent's parked dispatches that waited too long, oldest first, then hands
// the oldest of the rest back if the agent is free.
func (d *Dispatcher) sweepAgent(ctx context.Context, subj string) error {
	for {
		parked, err := d.nextParked(ctx, subj)
		if parked == nil || err != nil {
			return err
		}
		req, err := events.DecodeDispatch(dispatchSubjectOf(parked.Data), parked.Data)
		if err != nil {
			return err // nextParked decoded it
		}
		queuedAt, _ := time.Parse(time.RFC3339Nano, parked.Header.Get(headerQueuedAt))
		if waited := d.opts.Now().Sub(queuedAt); waited >= d.opts.AgentBusyTimeout {
			if err := d.failParked(ctx, req, waited); err != nil {
				return err
			}
			if err := d.dropParked(ctx, parked.Sequence); err != nil {
				return err
			}
			continue
		}
		holder, err := d.agents.holder(ctx, req.CompanyID, req.AgentID)
		if err != nil || holder != "" {
			return err
		}
		return d.republish(ctx, parked)
	}
}

// failParked fails a dispatch that waited AgentBusyTimeout for its agent, unless its lease moved
// on meanwhile (released while it waited).
func (d *Dispatcher) failParked(ctx context.Context, req events.DispatchRequest, waited time.Duration) error {
	ref := events.Ref(req.CompanyID, req.RunID)
	busy := events.Terminalf(events.CodeAgentBusy, "agentId",
		"agent %s was still busy with another run after %s; one run per agent at a time", req.AgentID, waited.Round(time.Second))
	if _, err := d.records.Modify(ctx, ref, lease.Fail(events.CodeAgentBusy)); err != nil {
		if errors.Is(err, lease.ErrEnded) || errors.Is(err, lease.ErrFinished) || errors.Is(err, lease.ErrFailed) || errors.Is(err, lease.ErrNotFound) {
			return nil
		}
		return err
	}
	if _, err := d.publisher.Publish(ctx, events.NewRunFailed(ref, events.LeaseAcquire, busy)); err != nil {
		return fmt.Errorf("publishing the failed event of run %s: %w", ref.RunID, err)
	}
	d.log.Info().Str(events.LogKeyRunID, ref.RunID).Str(events.LogKeyTenant, ref.CompanyID).Msg("parked dispatch waited too long for its agent")
	return nil
}

// dispatchSubjectOf rebuilds a parked dispatch's work subject from its payload's ids (the
// parking subject names the agent, not the run).
func dispatchSubjectOf(data []byte) string {
	var ids struct {
		CompanyID string `json:"companyId"`
		RunID     string `json:"runId"`
	}
	if err := json.Unmarshal(data, &ids); err != nil {
		return ""
	}
	subj, _ := events.DispatchSubject(ids.CompanyID, ids.RunID)
	return subj
}

// queuedAt is when the acquire first reached the work queue: the header a parked dispatch
// carries back, else the message's stream timestamp, so the wait for a busy agent counts from
// the acquire, not from this delivery.
func queuedAt(m jetstream.Msg, fallback time.Time) time.Time {
	if h := m.Headers().Get(headerQueuedAt); h != "" {
		if t, err := time.Parse(time.RFC3339Nano, h); err == nil {
			return t
		}
	}
	md, err := m.Metadata()
	if err != nil {
		return fallback
	}
	return md.Timestamp
}
