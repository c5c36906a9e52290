package execsvc

import (
	"math"
	"sync"

	"github.com/kubeclip/kubeclip/pkg/execproto"
	"github.com/kubeclip/kubeclip/pkg/sandboxd"
)

// How many sessions fit in a replica's memory (docs/boundary/execsvc.md, "Sessions"). Every
// bound below is what a hostile pod or client can make one session hold at once.
const (
	// sessionReserve is the replica's own memory before any session: the pod cache, the NATS
	// and Kubernetes clients, the Go runtime.
	sessionReserve = 64 << 20
	// sessionOverhead is a session's fixed cost: its goroutines' stacks, the output stream's
	// read buffer (32 KiB), its HTTP/TLS connection's buffers, subscriptions.
	sessionOverhead = 256 << 10
)

// SessionBytes is the most one session holds when the recorder parses stdout lines of up to
// maxLine bytes (RecordLimits.MaxLine): one output frame as read from the pod, the stdin
// messages queued for sandboxd plus the one being written, the recorder's line (recorded execs)
// and the fixed overhead. With the default 1 MiB line: 1 + 2.5 + 1 MiB + 256 KiB = 4.75 MiB.
func SessionBytes(maxLine int) int64 {
	return int64(sandboxd.MaxFramePayload + (stdinQueue+1)*execproto.MaxStdinChunk + maxLine + sessionOverhead)
}

// SessionsFor is how many sessions a replica whose memory limit is memoryLimit bytes serves:
// what remains after sessionReserve, in SessionBytes(maxLine), at least 1 and at most
// DefaultMaxSessions. A limit of 0 or less, or math.MaxInt64, is none: DefaultMaxSessions. 256 MiB
// with the default line gives 40.
func SessionsFor(memoryLimit int64, maxLine int) int {
	if memoryLimit <= 0 || memoryLimit == math.MaxInt64 {
		return DefaultMaxSessions
	}
	n := (memoryLimit - sessionReserve) / SessionBytes(maxLine)
	return int(max(1, min(n, DefaultMaxSessions)))
}

// CompanyShare is the default per-company bound of max sessions: a quarter, so that one
// company's flood leaves three quarters to the others, at least 1.
func CompanyShare(maxSessions int) int { return max(1, maxSessions/4) }

// slots are a replica's sessions: at most max in all and perCompany for each company. A slot is
// taken before any work is spawned for a request, so a company past its share costs the
// replica one answer per request, never a goroutine or a lease read.
type slots struct {
	max, perCompany int

	mu        sync.Mutex
	total     int
	byCompany map[string]int
}

func newSlots(maxTotal, perCompany int) *slots {
	return &slots{max: maxTotal, perCompany: perCompany, byCompany: map[string]int{}}
}

// take takes a slot of company's; the error says which bound refused it.
func (s *slots) take(company string) (release func(), err *execproto.Error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.byCompany[company] >= s.perCompany:
		return nil, execproto.NewError(execproto.CodeUnavailable, "", "the exec-worker serves its maximum of %d streams for company %s; try again", s.perCompany, company)
	case s.total >= s.max:
		return nil, execproto.NewError(execproto.CodeUnavailable, "", "the exec-worker serves its maximum of streams; try again")
	}
	s.total++
	s.byCompany[company]++
	var once sync.Once
	return func() { once.Do(func() { s.give(company) }) }, nil
}

func (s *slots) give(company string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total--
	if s.byCompany[company]--; s.byCompany[company] == 0 {
		delete(s.byCompany, company)
	}
}
