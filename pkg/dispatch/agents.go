package dispatch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/pkg/cas"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
)

// AgentBucket holds the agent guards: one key per agent whose value is the run holding it, so
// the dispatcher keeps one active run per agent across replicas (created with compare-and-set).
// Only the dispatcher uses it, so only the dispatcher creates it (AgentBucketConfig).
const AgentBucket = "KUBECLIP_AGENTS"

const (
	// agentGuardMarkerTTL is how long the marker of an agent guard that expired stays in the
	// bucket: long enough for a watcher to see the guard went away, short enough not to pile up.
	agentGuardMarkerTTL = 5 * time.Minute
	// maxAgentGuardBytes bounds a guard's value, the run id holding the agent.
	maxAgentGuardBytes = 1 << 10
)

// AgentBucketConfig is the KUBECLIP_AGENTS bucket. Keys carry their own TTL (jetstream.KeyTTL,
// the run's deadline plus agentGuardMargin) so a guard whose holder died is freed; the bucket has
// none of its own. It takes its share of a store of storeBytes (0: the default).
func AgentBucketConfig(replicas int, storeBytes int64) jetstream.KeyValueConfig {
	if replicas <= 0 {
		replicas = 1
	}
	return jetstream.KeyValueConfig{
		Bucket:         AgentBucket,
		Description:    "kubeclip agent guards: the run holding each agent",
		History:        1,
		MaxValueSize:   maxAgentGuardBytes,
		MaxBytes:       events.StoreLimit(storeBytes, events.StoreAgents),
		LimitMarkerTTL: agentGuardMarkerTTL, // enables per-key TTLs
		Storage:        jetstream.FileStorage,
		Replicas:       replicas,
	}
}

// agentGuardMargin is added to a run's deadline for its guard's TTL: the guard outlives the
// run's own deadline, so it never lapses under a live run, yet a dispatcher that died without
// freeing it blocks the agent for a bounded time only.
const agentGuardMargin = 5 * time.Minute

// agentGuard keeps one active run per agent in KUBECLIP_AGENTS: the key is the agent, the value
// the run holding it. Create is compare-and-set across every dispatcher replica, and the
// per-key TTL frees an agent whose holder never got to free it.
type agentGuard struct {
	kv jetstream.KeyValue
}

// agentKey is the guard's key. Company and agent ids are label values ([A-Za-z0-9._-], alnum at
// both ends), which are valid KV key characters.
func agentKey(companyID, agentID string) string { return companyID + "/" + agentID }

// take makes runID the agent's holder if nobody holds it, and returns the holder.
func (g agentGuard) take(ctx context.Context, companyID, agentID, runID string, ttl time.Duration) (string, error) {
	holder, _, err := cas.Take(ctx, g.kv, agentKey(companyID, agentID), []byte(runID), jetstream.KeyTTL(ttl))
	if err != nil {
		return "", fmt.Errorf("taking the guard of agent %s: %w", agentID, err)
	}
	return string(holder), nil
}

// holder returns the run holding the agent, "" when it is free.
func (g agentGuard) holder(ctx context.Context, companyID, agentID string) (string, error) {
	entry, err := g.kv.Get(ctx, agentKey(companyID, agentID))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("reading the guard of agent %s: %w", agentID, err)
	}
	return string(entry.Value()), nil
}

// free releases the agent if runID holds it. Errors are logged: the TTL frees it anyway.
func (g agentGuard) free(ctx context.Context, log zerolog.Logger, companyID, agentID, runID string) {
	if agentID == "" {
		return
	}
	if err := cas.Free(ctx, g.kv, agentKey(companyID, agentID), []byte(runID)); err != nil {
		log.Warn().Err(err).Str(events.LogKeyRunID, runID).Msg("freeing the agent guard failed; its TTL will")
	}
}

// holdAgent takes the agent's guard for this run. While another run of the agent holds it, the
// dispatch is parked (see park.go) and holdAgent reports held false: the caller acknowledges
// the message. A dispatch that has waited AgentBusyTimeout since its acquire fails with
// agent_busy.
func (d *Dispatcher) holdAgent(ctx context.Context, log zerolog.Logger, m jetstream.Msg, plan lease.Plan) (held bool, err error) {
	req := plan.Request
	ttl := time.Duration(plan.Config.PodActivityDeadlineSec)*time.Second + agentGuardMargin
	if plan.Deadline != nil {
		ttl = time.Duration(plan.Deadline.ActiveDeadlineSeconds)*time.Second + agentGuardMargin
	}
	holder, err := d.agents.take(ctx, req.CompanyID, req.AgentID, req.RunID, ttl)
	if err != nil {
		return false, err
	}
	if holder == req.RunID {
		return true, nil
	}
	queuedAt := queuedAt(m, d.opts.Now())
	if waited := d.opts.Now().Sub(queuedAt); waited >= d.opts.AgentBusyTimeout {
		return false, events.Terminalf(events.CodeAgentBusy, "agentId",
			"agent %s is still running run %s after %s; one run per agent at a time", req.AgentID, holder, waited.Round(time.Second))
	}
	if err := d.park(ctx, log, m, req, queuedAt); err != nil {
		return false, err
	}
	// The holder may have freed the agent between take and park, finding nothing to unpark.
	if now, err := d.agents.holder(ctx, req.CompanyID, req.AgentID); err == nil && now == "" {
		if err := d.unpark(ctx, req.CompanyID, req.AgentID); err != nil {
			log.Warn().Err(err).Msg("unparking after the agent was freed failed; the sweep will")
		}
	}
	return false, nil
}

// freeAgent frees the agent of runID and hands the agent's oldest parked dispatch back to the
// work queue. Errors are logged: the guard's TTL frees the agent, the sweep unparks.
func (d *Dispatcher) freeAgent(ctx context.Context, log zerolog.Logger, companyID, agentID, runID string) {
	if agentID == "" {
		return
	}
	d.agents.free(ctx, log, companyID, agentID, runID)
	if err := d.unpark(ctx, companyID, agentID); err != nil {
		log.Warn().Err(err).Msg("unparking the agent's next dispatch failed; the sweep will")
	}
}
