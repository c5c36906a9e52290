package events_test

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/events"
)

// TestSpendKeysRoundTrip: a company id of any shape (dots and slashes encoded, 128 bytes) makes a
// key that parses back to it and its day, and today's filter matches it.
func TestSpendKeysRoundTrip(t *testing.T) {
	day := events.SpendDay(time.Date(2026, 12, 7, 23, 59, 59, 0, time.UTC))
	if start := events.SpendDayStart(day); !start.Equal(time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("SpendDayStart = %v, want midnight UTC of the day", start)
	}
	for _, company := range []string{"acme", "9d2c6f2e-0b7a-4b0e-9b51-6c3f1a2d7e10", "has.dots", "_b64_tricky", strings.Repeat("é", 64)} {
		key := events.SpendKey(company, day)
		got, gotDay, ok := events.ParseSpendKey(key)
		if !ok || got != company || gotDay != day {
			t.Errorf("ParseSpendKey(%q) = %q, %d, %v; want %q, %d", key, got, gotDay, ok, company, day)
		}
		if f := strings.Split(events.SpendKeyFilter(day), "."); len(f) != len(strings.Split(key, ".")) {
			t.Errorf("the filter %s and the key %s have different token counts", events.SpendKeyFilter(day), key)
		}
	}
	for _, key := range []string{"log.company.acme.1", "broker.company.acme", "broker.company.acme.x", "broker.company.a.b.1"} {
		if _, _, ok := events.ParseSpendKey(key); ok {
			t.Errorf("ParseSpendKey(%q) parsed", key)
		}
	}
	if _, err := events.DecodeSpend([]byte(`{"requests":-1,"tokens":2}`)); err == nil {
		t.Error("a negative spend decoded")
	}
}

// TestBudgetBucketTakesCompareAndSetHeaders: the server counts a message's headers against the
// bucket's value bound, and a compare-and-set carries its expected revision in one. The largest
// spend with a 20-digit expected revision is refused for its revision, not its size (with the
// bound of 64 bytes before, an 8-digit byte counter already failed at a 6-digit revision:
// "message size exceeds maximum allowed").
func TestBudgetBucketTakesCompareAndSetHeaders(t *testing.T) {
	_, _, js := natstest.Start(t)
	kv, err := js.CreateKeyValue(t.Context(), events.BudgetBucketConfig(1, 0, 0))
	if err != nil {
		t.Fatal(err)
	}
	key := events.SpendKey(strings.Repeat("c", 128), 20794)
	if _, err := kv.Create(t.Context(), key, events.Spend{}.Encode()); err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg("$KV." + events.BudgetBucket + "." + key)
	m.Header.Set("Nats-Expected-Last-Subject-Sequence", "18446744073709551615")
	m.Data = events.Spend{Requests: 1<<63 - 1, Tokens: 1<<63 - 1}.Encode()
	_, err = js.PublishMsg(t.Context(), m)
	if err == nil || !strings.Contains(err.Error(), "wrong last sequence") {
		t.Errorf("the largest spend with a 20-digit expected revision: %v, want refused for its revision only", err)
	}
}
