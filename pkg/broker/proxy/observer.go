package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/kubeclip/kubeclip/pkg/broker"
)

// Observer is where metering and budgets plug in: it sees every call the proxy forwards, and
// may refuse one before it is forwarded. The meter (pkg/broker/meter) reads usage from the
// response body as it streams through Exchange.Write; a budget answers Begin with a
// *Rejection.
type Observer interface {
	// Begin is called once a call's placeholders resolved, before it is forwarded. Request is
	// the pod's request as it arrived (placeholders, never real values; its body is not to be
	// read: it streams to the upstream). An error refuses the call: a *Rejection chooses the
	// status and message the agent sees (a budget's 429); any other error answers 500 and is
	// logged, so an observer that cannot account for a call fails it closed (an observer that
	// prefers to fail open returns a nil error).
	Begin(ctx context.Context, call Call) (Exchange, error)
}

// Call is a call the proxy is about to forward.
type Call struct {
	// Grant is whose call it is (company, run, lease, key); with several placeholders, the first.
	Grant broker.Grant
	// Host is the bound host it goes to.
	Host string
	// Request is the pod's request.
	Request *http.Request
}

// Exchange follows one forwarded call. Its methods are called from the goroutine serving the
// call, in order: Response at most once, Write for each chunk of the body, End exactly once.
type Exchange interface {
	// Response is the upstream's status and headers, before the body streams.
	Response(status int, header http.Header)
	// Write is given each chunk of the response body as it is read from the upstream, before
	// the client gets it. It must not retain p, and should not block: the stream waits for it.
	// Its error is ignored.
	io.Writer
	// End is called when the call is over: err is nil when the whole body was read, else why
	// it stopped (the upstream failed or could not be reached, the client went away).
	End(err error)
}

// Rejection is an Observer's refusal of a call: the HTTP status (429 for a budget) and the
// message (which should start "kubeclip broker: " and name the budget, never a value).
type Rejection struct {
	Status  int
	Message string
	// Quota says a spend budget refused the call (no call passes before RetryAfter, hours
	// away), not a rate (retry shortly): the answer says X-Should-Retry: false, which the
	// OpenAI and Anthropic SDKs honour rather than retrying a 429, and OpenAI's error type is
	// insufficient_quota rather than rate_limit_exceeded.
	Quota bool
	// RetryAfter is when the budget allows calls again (0: not said); the answer carries it as
	// Retry-After (whole seconds, rounded up) and retry-after-ms, which the model SDKs honour.
	RetryAfter time.Duration
}

func (r *Rejection) Error() string { return strconv.Itoa(r.Status) + " " + r.Message }

// errBodyClosed is End's error when the body was closed before its end: the client went away,
// or writing to it failed.
var errBodyClosed = errors.New("the response body was closed before its end")

// teeBody gives the Exchange what the client is given, as it is read.
type teeBody struct {
	body io.ReadCloser
	ex   Exchange
	once sync.Once
}

func (t *teeBody) Read(p []byte) (int, error) {
	n, err := t.body.Read(p)
	if n > 0 {
		_, _ = t.ex.Write(p[:n])
	}
	switch {
	case err == io.EOF:
		t.end(nil)
	case err != nil:
		t.end(err)
	}
	return n, err
}

func (t *teeBody) Close() error {
	err := t.body.Close()
	t.end(errBodyClosed) // after EOF, End was already called
	return err
}

func (t *teeBody) end(err error) { t.once.Do(func() { t.ex.End(err) }) }
