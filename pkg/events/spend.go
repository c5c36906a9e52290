package events

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// BudgetSourceBroker is the credential broker's counters in BudgetBucket: one per company and
// UTC day, key SpendKey, value a Spend. Every broker replica adds what it forwarded to it, and
// `kubeclip status` reads today's.
const BudgetSourceBroker = "broker"

// spendPrefix starts every key SpendKey makes (the broker's NATS user may write these only).
const spendPrefix = BudgetSourceBroker + ".company."

// Spend is what one company spent through the credential broker on one UTC day: the calls it
// forwarded and the tokens their upstreams stated (input plus output).
type Spend struct {
	Requests int64 `json:"requests"`
	Tokens   int64 `json:"tokens"`
}

// Add returns s plus o.
func (s Spend) Add(o Spend) Spend {
	return Spend{Requests: s.Requests + o.Requests, Tokens: s.Tokens + o.Tokens}
}

// IsZero reports nothing spent.
func (s Spend) IsZero() bool { return s == Spend{} }

// SpendDay is t's UTC day, counted from the epoch: the broker's daily budgets turn over at
// midnight UTC, for every company and replica alike.
func SpendDay(t time.Time) int64 { return t.UTC().Unix() / 86400 }

// SpendDayStart is when day began (and day-1 ended).
func SpendDayStart(day int64) time.Time { return time.Unix(day*86400, 0).UTC() }

// SpendKey is company's counter of day in BudgetBucket: "broker.company.<company>.<day>", the
// company's part as RunRef.Key makes it.
func SpendKey(company string, day int64) string {
	return spendPrefix + keyPart(company) + "." + strconv.FormatInt(day, 10)
}

// SpendKeyFilter matches every company's counter of day (a KV key with a wildcard).
func SpendKeyFilter(day int64) string { return spendPrefix + "*." + strconv.FormatInt(day, 10) }

// ParseSpendKey inverts SpendKey; ok is false for a key of another shape.
func ParseSpendKey(key string) (company string, day int64, ok bool) {
	rest, found := strings.CutPrefix(key, spendPrefix)
	if !found {
		return "", 0, false
	}
	part, d, found := strings.Cut(rest, ".")
	if !found || strings.Contains(d, ".") {
		return "", 0, false
	}
	day, err := strconv.ParseInt(d, 10, 64)
	if err != nil {
		return "", 0, false
	}
	company, ok = parseKeyPart(part)
	return company, day, ok
}

// DecodeSpend reads a counter's value.
func DecodeSpend(b []byte) (Spend, error) {
	var s Spend
	if err := json.Unmarshal(b, &s); err != nil {
		return Spend{}, fmt.Errorf("decoding a spend counter: %w", err)
	}
	if s.Requests < 0 || s.Tokens < 0 {
		return Spend{}, fmt.Errorf("decoding a spend counter: negative counts %+v", s)
	}
	return s, nil
}

// Encode is s as a counter's value: at most 61 bytes, within BudgetBucketConfig's value size.
func (s Spend) Encode() []byte {
	b, _ := json.Marshal(s) // two int64s always marshal
	return b
}
