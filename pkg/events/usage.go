package events

import (
	"fmt"
	"time"
)

// KindUsage carries what a run's model API calls spent, as the credential broker read it from
// the upstreams' own responses (issue 27; docs/contract.md#usage): usage the agent cannot forge,
// unlike the cost it prints on its stdout (AgentResult).
const KindUsage RunKind = "usage"

// The API formats a usage row names (pkg/broker/meter's Format.String).
const (
	UsageFormatNone                  = "none"
	UsageFormatAnthropicMessages     = "anthropic_messages"
	UsageFormatOpenAIChatCompletions = "openai_chat_completions"
	UsageFormatOpenAIResponses       = "openai_responses"
)

func validUsageFormat(f string) bool {
	switch f {
	case UsageFormatNone, UsageFormatAnthropicMessages, UsageFormatOpenAIChatCompletions, UsageFormatOpenAIResponses:
		return true
	}
	return false
}

// Bounds of a usage event. A row is one brokered key, bound host and format, so a run has at
// most (its keys) × (their hosts) × 4 rows, which the operator's bindings bound; the caps keep
// an event small whatever a client of the decoder sends.
const (
	MaxUsageRows      = 64
	maxUsageOutcomes  = 16
	maxUsageMeterLen  = 64
	maxUsageHostLen   = 253
	maxUsageOutcomeID = 32
	// maxUsageCount is 2^53, the largest integer every JSON reader holds exactly (pkg/broker/meter
	// refuses a larger count).
	maxUsageCount = 1 << 53
)

// RunUsageEvent is what a run's model API calls through the credential broker spent since the
// previous event of the same meter: <prefix>.run.<c>.<r>.usage. Each broker replica keeps one
// meter per run it serves and publishes at most one event per meter per flush interval (1 s),
// and one at once when the run's grant is released, each carrying the delta since the meter's
// previous event, so the sum of a run's events' counts is the sum of what the upstreams
// stated, exactly. The message id is <companyId>.<runId>.usage.<meter>.<seq>: a publish the
// broker retries because its acknowledgement was lost is stored once.
type RunUsageEvent struct {
	RunID     string    `json:"runId"`
	CompanyID string    `json:"companyId"`
	At        time.Time `json:"at"`
	// Meter names the count the event belongs to: a ULID one broker process made for the run,
	// so the counts of two replicas, or of one replica before and after a restart, never share
	// a message id.
	Meter string `json:"meter"`
	// Seq numbers the meter's events 1, 2, 3, … without gaps: a gap is an event not stored.
	Seq uint64 `json:"seq"`
	// Usage has one row per key, host and format the calls used, in that order.
	Usage []ModelUsage `json:"usage"`
}

// ModelUsage is the usage of a run's calls with one brokered key to one bound host in one API
// format, since the meter's previous event.
type ModelUsage struct {
	// Key is the brokered key's name (ANTHROPIC_API_KEY), never its value.
	Key string `json:"key"`
	// Host is the bound host the calls went to.
	Host string `json:"host"`
	// Format is the API format the broker metered the responses as (UsageFormat*); "none" for
	// a path it does not meter.
	Format string `json:"format"`
	// Calls is how many calls ended: metered or not.
	Calls int64 `json:"calls"`
	// The token counts the responses stated, normalised as pkg/broker/meter does: InputTokens
	// are neither read from nor written to a prompt cache, OutputTokens include reasoning.
	// Counts of a call that was not metered in full are those stated before it stopped.
	InputTokens      int64 `json:"inputTokens"`
	OutputTokens     int64 `json:"outputTokens"`
	CacheReadTokens  int64 `json:"cacheReadTokens"`
	CacheWriteTokens int64 `json:"cacheWriteTokens"`
	// Unmetered counts the calls among Calls whose response did not state its usage in full,
	// by outcome: "failed" (no response) or pkg/broker/meter's reason (path, encoded,
	// content_type, malformed, bad_value, inconsistent, truncated, no_usage).
	Unmetered map[string]int64 `json:"unmetered,omitempty"`
}

// UsageEventMsgID is the message id of a usage event: <companyId>.<runId>.usage.<meter>.<seq>.
func UsageEventMsgID(ref RunRef, meter string, seq uint64) string {
	return ref.MsgID(fmt.Sprintf("usage.%s.%d", meter, seq))
}

// Type implements Event.
func (RunUsageEvent) Type() string { return runType(KindUsage) }

// IDs implements Event.
func (e RunUsageEvent) IDs() (string, string) { return e.CompanyID, e.RunID }

func (e RunUsageEvent) address(s Subjects) (address, error) {
	if err := validateIDSafe("meter", e.Meter, maxUsageMeterLen); err != nil {
		return address{}, err
	}
	if e.Seq == 0 {
		return address{}, InvalidRequest("seq", "must be at least 1")
	}
	if len(e.Usage) == 0 || len(e.Usage) > MaxUsageRows {
		return address{}, InvalidRequest("usage", "must hold 1 to %d rows, got %d", MaxUsageRows, len(e.Usage))
	}
	for i, u := range e.Usage {
		if err := u.validate(fmt.Sprintf("usage[%d]", i)); err != nil {
			return address{}, err
		}
	}
	return runAddress(s, e.CompanyID, e.RunID, KindUsage, UsageEventMsgID(Ref(e.CompanyID, e.RunID), e.Meter, e.Seq), 0)
}

func (u ModelUsage) validate(field string) error {
	if err := validateID(field+".key", u.Key); err != nil {
		return err
	}
	if len(u.Key) > maxKeyNameLen {
		return InvalidRequest(field+".key", "must be at most %d bytes, got %d", maxKeyNameLen, len(u.Key))
	}
	if err := validateID(field+".host", u.Host); err != nil {
		return err
	}
	if len(u.Host) > maxUsageHostLen {
		return InvalidRequest(field+".host", "must be at most %d bytes, got %d", maxUsageHostLen, len(u.Host))
	}
	if !validUsageFormat(u.Format) {
		return InvalidRequest(field+".format", "must be none, anthropic_messages, openai_chat_completions or openai_responses, got %q", truncate(u.Format, 32))
	}
	if u.Calls < 1 || u.Calls > maxUsageCount {
		return InvalidRequest(field+".calls", "must be between 1 and 2^53, got %d", u.Calls)
	}
	for _, c := range []struct {
		name string
		v    int64
	}{{"inputTokens", u.InputTokens}, {"outputTokens", u.OutputTokens}, {"cacheReadTokens", u.CacheReadTokens}, {"cacheWriteTokens", u.CacheWriteTokens}} {
		if c.v < 0 || c.v > maxUsageCount {
			return InvalidRequest(field+"."+c.name, "must be between 0 and 2^53, got %d", c.v)
		}
	}
	if len(u.Unmetered) > maxUsageOutcomes {
		return InvalidRequest(field+".unmetered", "must name at most %d outcomes, got %d", maxUsageOutcomes, len(u.Unmetered))
	}
	var unmetered int64
	for outcome, n := range u.Unmetered {
		if err := validateIDSafe(field+".unmetered", outcome, maxUsageOutcomeID); err != nil {
			return err
		}
		if n < 1 || n > u.Calls {
			return InvalidRequest(field+".unmetered."+outcome, "must be between 1 and calls (%d), got %d", u.Calls, n)
		}
		unmetered += n
	}
	if unmetered > u.Calls {
		return InvalidRequest(field+".unmetered", "counts %d calls, more than calls (%d)", unmetered, u.Calls)
	}
	return nil
}

// maxKeyNameLen bounds a brokered key's name as subject tokens are bounded.
const maxKeyNameLen = MaxTokenLen

// validateIDSafe checks a value that becomes part of a message id: 1 to max bytes of
// [A-Za-z0-9_-].
func validateIDSafe(field, v string, max int) error {
	if v == "" || len(v) > max {
		return InvalidRequest(field, "must be 1 to %d bytes, got %d", max, len(v))
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return InvalidRequest(field, "must hold only letters, digits, '-' and '_', got %q", truncate(v, max))
		}
	}
	return nil
}

func (e RunUsageEvent) stamp(now time.Time) Event { e.At = stampTime(e.At, now); return e }
func (e RunUsageEvent) eventTime() time.Time      { return e.At }

var _ Event = RunUsageEvent{}
