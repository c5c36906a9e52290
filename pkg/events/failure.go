package events

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/pkg/strictjson"
)

// EventPublisher is the part of Publisher PublishFailure needs.
type EventPublisher interface {
	Publish(ctx context.Context, ev Event, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error)
}

var _ EventPublisher = (*Publisher)(nil)

// PublishFailure is the usual ConsumeOptions.OnTerminal body: it publishes the `failed` event of
// the request m carries, with te's code, field and message.
//
// The company is the one in m's subject, never a header or the payload: a client publishes
// only on its own company's subjects (NATS permissions), so a failure is always reported where
// the requester reads, and a forged ce-source cannot write into another company's run. The run
// is the subject's (run and dispatch subjects) or the payload's runId (a lease request names
// only the company in its subject; the run id is then a claim within that company). When m
// names no valid run there is nobody to tell: that is logged and nil returned, so the message
// is still termed. A publish error is returned, so Consume retries the message and the report
// is not lost.
func PublishFailure(ctx context.Context, p EventPublisher, log zerolog.Logger, m jetstream.Msg, te *TerminalError) error {
	ref, request := FailureRef(m)
	log = log.With().Str(LogKeySubject, m.Subject()).Str(LogKeyCode, string(te.Code)).Logger()
	if ref.Validate() != nil || !request.valid() {
		log.Warn().Err(te).Msg("request names no valid run; its failure cannot be reported")
		return nil
	}
	ev := NewRunFailed(ref, request, te)
	ev.RequestID = requestID(m.Data())
	if _, err := p.Publish(ctx, ev); err != nil {
		return fmt.Errorf("publishing the failed event of run %s: %w", ref.RunID, err)
	}
	log.Info().Str(LogKeyRunID, ref.RunID).Str(LogKeyTenant, ref.CompanyID).Msg("published failed event")
	return nil
}

// FailureRef finds the run and the request kind a failed message is about, from its subject
// (and, for a lease request, the payload's runId).
func FailureRef(m jetstream.Msg) (RunRef, LeaseKind) {
	subject := m.Subject()
	t := strings.Split(subject, ".")
	switch {
	case len(t) == 4 && t[1] == "lease":
		return RunRef{CompanyID: t[2], RunID: requestRunID(m.Data())}, LeaseKind(t[3])
	case len(t) == 4 && t[0] == "kubeclip" && t[1] == "dispatch":
		return RunRef{CompanyID: t[2], RunID: t[3]}, LeaseAcquire
	}
	return RunRef{}, ""
}

// requestRunID reads a lease request's runId the way the request decoders do (strictjson): a
// key given twice or spelled in another case names no run, because encoding/json would pick one
// of them silently and the failure could then be reported to a run the request was never about.
// The top level alone is read (strictjson.TopLevel): a request refused for what it holds deeper
// (nested past the decoders' depth limit, a repeated key inside config) still names its run,
// and hears why.
func requestRunID(data []byte) string {
	ids := topLevel(data, "runId")
	if ids == nil {
		return ""
	}
	return jsonString(ids[0])
}

// requestID reads the id a repeated lease request names itself with (a resume's resumeId, a
// release's releaseId), strictly as requestRunID reads the run id; "" when there is none.
func requestID(data []byte) string {
	ids := topLevel(data, "resumeId", "releaseId")
	if ids == nil {
		return ""
	}
	id := jsonString(ids[0])
	if id == "" {
		id = jsonString(ids[1])
	}
	if validateID("requestId", id) != nil {
		return ""
	}
	return id
}

// topLevel reads the named top-level values of a request strictly (strictjson.TopLevel); nil
// when the payload is too large, not a JSON object, or repeats or misspells a top-level key.
func topLevel(data []byte, names ...string) []json.RawMessage {
	if len(data) > DefaultMaxMsgSize {
		return nil
	}
	values, err := strictjson.TopLevel(data, names...)
	if err != nil {
		return nil
	}
	return values
}

func jsonString(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return ""
	}
	return s
}
