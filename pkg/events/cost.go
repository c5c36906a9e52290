package events

import (
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// What a company's events cost the store is charged to its budgets (docs/security.md, Budgets):
// the text it printed and the envelope around it. The envelope is no small change: a one-byte
// event grows the run stream by about 900 bytes, 1.5 KiB with ids of MaxTokenLen bytes, so a
// command that prints a byte every millisecond stores some 45× its output (an event per 100 ms,
// pkg/execsvc's coalescing). Charging what each event stores makes such a command pay per
// event.
const (
	// storeRecordBytes is what nats-server's file store keeps per message besides its subject,
	// headers and data: a 22-byte record header and an 8-byte hash (fileStoreMsgSize).
	storeRecordBytes = 30
	// storedTimeSlack covers the times the event and its ce-time header are stamped with when
	// published: StoredBytes stamps them with a time of the longest RFC 3339 form, so this is
	// only for a year past 9999.
	storedTimeSlack = 16
)

// StoredBytes is what publishing ev (Publisher.Publish) adds to its stream, at most: subject,
// headers (the CloudEvents ones, the message id and the expected stream), data and the file
// store's record.
func StoredBytes(s Subjects, ev Event) (int64, error) {
	// A time with the longest RFC 3339 text: nine digits of nanoseconds.
	p := Publisher{subjects: s, now: func() time.Time { return time.Date(2000, 1, 1, 0, 0, 0, 1, time.UTC) }}
	msg, addr, err := p.build(ev)
	if err != nil {
		return 0, err
	}
	msg.Header.Set(jetstream.ExpectedStreamHeader, addr.stream)
	hdr := len("NATS/1.0\r\n") + len("\r\n")
	for k, vs := range msg.Header {
		for _, v := range vs {
			hdr += len(k) + len(": ") + len(v) + len("\r\n")
		}
	}
	return int64(storeRecordBytes + len(msg.Subject) + hdr + len(msg.Data) + storedTimeSlack), nil
}
