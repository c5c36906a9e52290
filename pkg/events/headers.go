package events

import (
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// CloudEvents binary-mode headers (NATS protocol binding): every context attribute is a header
// named ce-<attribute>; the message body is the JSON payload.
const (
	HeaderSpecVersion     = "ce-specversion"
	HeaderType            = "ce-type"
	HeaderSource          = "ce-source"
	HeaderID              = "ce-id"
	HeaderTime            = "ce-time"
	HeaderSubject         = "ce-subject"
	HeaderDataContentType = "ce-datacontenttype"
	// HeaderSequence is the CloudEvents sequence extension, set on log events: the zero-padded
	// seq, so string order is numeric order.
	HeaderSequence = "ce-sequence"
	// HeaderMsgID is JetStream's de-duplication header; ce-id carries the same value.
	HeaderMsgID = nats.MsgIdHdr

	SpecVersion     = "1.0"
	ContentTypeJSON = "application/json"
)

// sequenceWidth zero-pads ce-sequence to the width of the largest uint64.
const sequenceWidth = 20

// Source is the CloudEvents source of every message about a run: /companies/<c>/runs/<r>.
// Making the run the source means (source, id) is unique exactly when the JetStream message id
// is, so CloudEvents de-duplication and JetStream de-duplication agree, whichever kubeclip
// component (or Paperclip) published the event.
func Source(companyID, runID string) string {
	return "/companies/" + url.PathEscape(companyID) + "/runs/" + url.PathEscape(runID)
}

// sequenceString formats the ce-sequence value.
func sequenceString(seq uint64) string { return fmt.Sprintf("%0*d", sequenceWidth, seq) }

// setCEHeaders writes the CloudEvents headers for ev at addr onto h.
func setCEHeaders(h nats.Header, ev Event, addr address, t time.Time) {
	companyID, runID := ev.IDs()
	h.Set(HeaderMsgID, addr.msgID)
	h.Set(HeaderSpecVersion, SpecVersion)
	h.Set(HeaderType, EncodeHeaderValue(ev.Type()))
	h.Set(HeaderSource, EncodeHeaderValue(Source(companyID, runID)))
	h.Set(HeaderID, EncodeHeaderValue(addr.msgID))
	h.Set(HeaderTime, t.UTC().Format(time.RFC3339Nano))
	h.Set(HeaderSubject, EncodeHeaderValue(addr.subject))
	h.Set(HeaderDataContentType, ContentTypeJSON)
	if addr.seq > 0 {
		h.Set(HeaderSequence, sequenceString(addr.seq))
	}
}

// EncodeHeaderValue percent-encodes a CloudEvents attribute value for a header, by the rule the
// NATS binding borrows from the HTTP binding: space, '"', '%' and every byte outside printable
// ASCII (U+0021–U+007E) of the value's UTF-8 encoding become %XX.
func EncodeHeaderValue(s string) string {
	needs := false
	for i := 0; i < len(s); i++ {
		if mustEscape(s[i]) {
			needs = true
			break
		}
	}
	if !needs {
		return s
	}
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if mustEscape(c) {
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&0xf])
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

func mustEscape(c byte) bool { return c <= 0x20 || c >= 0x7f || c == '"' || c == '%' }

// MsgIDs returns the company and run a received message's subject names (a lease request
// subject names only the company). Headers are not consulted: they are a client's claims, and
// these ids go into logs as facts.
func MsgIDs(subject string) (companyID, runID string) {
	return idsFromSubject(subject)
}
