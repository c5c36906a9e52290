package events

import "time"

// Fate is what the consume loop did with a message.
type Fate string

// Fates of a settled message.
const (
	// FateAcked: the handler succeeded and the message was acknowledged.
	FateAcked Fate = "acked"
	// FateRetried: the handler failed and the message will be redelivered after a backoff.
	FateRetried Fate = "retried"
	// FateDeferred: the handler asked to be called again later (a busy agent).
	FateDeferred Fate = "deferred"
	// FateTerminated: the message failed for good (a terminal error or the last delivery).
	FateTerminated Fate = "terminated"
	// FateHandedBack: the worker was stopping; the message goes to another replica at once.
	FateHandedBack Fate = "handed_back"
)

// Settlement describes one settled delivery, for metrics.
type Settlement struct {
	// Consumer is the durable consumer's name.
	Consumer string
	// Subject is the message's subject (it carries ids: aggregate before using it as a label).
	Subject string
	// Attempt is the delivery count; above 1 the message is a redelivery.
	Attempt uint64
	// Fate is what happened to the message.
	Fate Fate
	// Code is the failure code of a terminated message, empty otherwise.
	Code Code
	// HandlerDuration is how long the handler ran; zero when it never ran.
	HandlerDuration time.Duration
}

// ConsumeObserver is told about every message Consume settles. It is called on the handler's
// goroutine and must not block.
type ConsumeObserver interface {
	MessageSettled(Settlement)
}

// Publication describes one Publish call, for metrics.
type Publication struct {
	// Subject is the event's subject; empty when the event could not be addressed.
	Subject string
	// Event is what was published (events never carry secrets).
	Event Event
	// Duplicate is true when the stream already had the message (same id in its window).
	Duplicate bool
	// Err is the publish error, nil on success.
	Err error
	// Duration is how long the publish took, acknowledgement included.
	Duration time.Duration
}

// PublishObserver is told about every Publish call. It must not block.
type PublishObserver interface {
	EventPublished(Publication)
}

// Observer is both; the workers' metrics implement it.
type Observer interface {
	ConsumeObserver
	PublishObserver
}

// fateOf maps a classifier decision to the fate reported to observers.
func fateOf(dec decision, handedBack bool) Fate {
	switch dec.action {
	case actionAck:
		return FateAcked
	case actionTerm:
		return FateTerminated
	}
	switch {
	case handedBack:
		return FateHandedBack
	case dec.deferred:
		return FateDeferred
	}
	return FateRetried
}
