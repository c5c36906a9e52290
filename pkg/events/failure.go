package events

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// EventPublisher is the part of Publisher PublishFailure needs.
type EventPublisher interface {
	Publish(ctx context.Context, ev Event, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error)
}

var _ EventPublisher = (*Publisher)(nil)

// PublishFailure is the usual ConsumeOptions.OnTerminal body: it publishes the `failed` event of
// the run m is about, with te's code, field and message. The run is found in m's ce-source
// header, else its subject, else the payload's runId and companyId (read with a tiny decoder,
// nothing else of the payload). When m names no valid run there is nobody to tell: that is
// logged and nil returned, so the message is still termed. A publish error is returned, so
// Consume retries the message and the report is not lost.
func PublishFailure(ctx context.Context, p EventPublisher, log zerolog.Logger, m jetstream.Msg, te *TerminalError) error {
	companyID, runID := failureIDs(m)
	log = log.With().Str(LogKeySubject, m.Subject()).Str(LogKeyCode, string(te.Code)).Logger()
	if validateIDs(companyID, runID) != nil {
		log.Warn().Err(te).Msg("request names no valid run; its failure cannot be reported")
		return nil
	}
	if _, err := p.Publish(ctx, NewRunFailed(companyID, runID, te)); err != nil {
		return fmt.Errorf("publishing the failed event of run %s: %w", runID, err)
	}
	log.Info().Str(LogKeyRunID, runID).Str(LogKeyTenant, companyID).Msg("published failed event")
	return nil
}

func failureIDs(m jetstream.Msg) (companyID, runID string) {
	companyID, runID = MsgIDs(m.Headers(), m.Subject())
	if companyID != "" && runID != "" {
		return companyID, runID
	}
	var ids struct {
		RunID     json.RawMessage `json:"runId"`
		CompanyID json.RawMessage `json:"companyId"`
	}
	if len(m.Data()) > DefaultMaxMsgSize || json.Unmarshal(m.Data(), &ids) != nil {
		return companyID, runID
	}
	if runID == "" {
		runID = jsonString(ids.RunID)
	}
	if companyID == "" {
		companyID = jsonString(ids.CompanyID)
	}
	return companyID, runID
}

func jsonString(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return ""
	}
	return s
}
