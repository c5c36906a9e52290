package main

import (
	"strings"
	"testing"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// TestPrintUsage: `runs follow` prints a usage event's rows, unmetered outcomes in name order.
func TestPrintUsage(t *testing.T) {
	var b strings.Builder
	printer{w: &b}.print(events.Received{Event: events.RunUsageEvent{RunID: "r1", CompanyID: "c1", Meter: "m", Seq: 1, Usage: []events.ModelUsage{
		{Key: "ANTHROPIC_API_KEY", Host: "api.anthropic.com", Format: events.UsageFormatAnthropicMessages, Calls: 3, InputTokens: 25, OutputTokens: 17, CacheReadTokens: 3, CacheWriteTokens: 1, Unmetered: map[string]int64{"truncated": 1, "failed": 1}},
	}}})
	want := "[usage]   ANTHROPIC_API_KEY api.anthropic.com anthropic_messages: calls=3 tokens in/out/cache read/cache write=25/17/3/1 unmetered failed=1 unmetered truncated=1\n"
	if b.String() != want {
		t.Errorf("printed %q, want %q", b.String(), want)
	}
}

// TestPrintUnknownReceipt: the receipt of a release of a lease the company does not have says
// that nothing was ended, so an operator does not read it as a lease destroyed.
func TestPrintUnknownReceipt(t *testing.T) {
	var b strings.Builder
	printer{w: &b}.print(events.Received{Event: events.RunReleasedEvent{RunID: "r1", CompanyID: "c1", ProviderLeaseID: "pc-1", State: events.ReleaseDestroyed, Unknown: true}})
	want := "[released] lease pc-1 destroyed: the company has no such lease; nothing was ended\n"
	if b.String() != want {
		t.Errorf("printed %q, want %q", b.String(), want)
	}
}
