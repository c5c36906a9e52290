package execsvc

import (
	"context"
	"math"
	"sync"

	"github.com/kubeclip/kubeclip/pkg/execproto"
)

// What a replica's memory holds (docs/security.md, "Sessions and buffers"): its own
// reserve, a fixed cost per live session, and one byte budget for every session's buffers,
// taken as they grow (frames read from pods, stdin queued for sandboxd, the recorder's line).
const (
	// sessionReserve is the replica's own memory before any session: the pod cache, the NATS
	// and Kubernetes clients, the Go runtime.
	sessionReserve = 64 << 20
	// SessionCost is what a live session holds whatever it does: its goroutines' stacks, the
	// output stream's 32 KiB read buffer, its HTTP/TLS connection, its subscriptions, the
	// recorder's retained batch (up to 32 KiB; its line is charged to the lines budget).
	// Measured idle: 87-89 KiB of heap, 111-115 KiB of RSS (TestProductionSettingsHoldTwoHundredAgents
	// and TestOneReplicaHoldsFiveHundredAgents log both).
	SessionCost = 256 << 10
	// DefaultBufferBytes is the session buffers' budget when the memory limit is unknown.
	DefaultBufferBytes = 256 << 20
	// minBufferBytes keeps room for a few whole frames (sandboxd.MaxFramePayload) however small
	// the replica.
	minBufferBytes = 8 << 20
)

// Sizing is what a replica serves at once: live sessions, and the bytes their buffers may
// hold in all.
type Sizing struct {
	Sessions    int
	BufferBytes int64
}

// SizeFor sizes a replica whose memory limit is memoryLimit bytes: what remains after
// sessionReserve, a quarter for buffers (at least minBufferBytes) and the rest in SessionCost,
// at least 1 and at most DefaultMaxSessions. A limit of 0 or less, or math.MaxInt64, is none:
// DefaultMaxSessions and DefaultBufferBytes. 256 MiB gives 576 sessions and 48 MiB of buffers.
func SizeFor(memoryLimit int64) Sizing {
	if memoryLimit <= 0 || memoryLimit == math.MaxInt64 {
		return Sizing{Sessions: DefaultMaxSessions, BufferBytes: DefaultBufferBytes}
	}
	avail := memoryLimit - sessionReserve
	buffers := max(minBufferBytes, avail/4)
	n := (avail - buffers) / SessionCost
	return Sizing{Sessions: int(max(1, min(n, DefaultMaxSessions))), BufferBytes: buffers}
}

// The buffer budget's split: frames read from pods and stdin queued for them (an io buffer is
// held for one frame or one write, so a waiting session always gets one back), and the
// recorder's stdout lines (held across frames while a line is incomplete, so never waited for).
func splitBuffers(total int64) (io, lines int64) {
	lines = total / 4
	return total - lines, lines
}

// admits is the admission rule of every fairPool (docs/security.md, "Exec streams
// and buffers"): n more of a pool of capacity, of which used are taken, mine by the asking
// company; companies is how many companies hold some, the asker counted. Work-conserving: anyone
// may take what leaves the reserve whole, so a company alone holds all but the reserve. Max-min
// fair: only a company below its fair share (the capacity over the companies competing, at
// least two, since a newcomer may arrive at any time) takes from the reserve, so what other
// companies release goes to the companies below their share; the upper half of the reserve to
// any of them, the lower half only to a company that holds no more than would remain free,
// so a newcomer (holding nothing) gets any free unit and each leaves half for the next.
func admits(capacity, reserve, used, mine int64, companies int, n int64) bool {
	free := capacity - used
	if n > free {
		return false
	}
	share := capacity / int64(max(2, companies))
	return free-n >= reserve || (mine < share && free-n >= min(reserve/2, mine))
}

// fairPool is a capacity shared by companies under admits, with an optional hard ceiling per
// company. Units are sessions (one per stream) or bytes (buffers).
type fairPool struct {
	// what names the pool in refusals: "streams", "buffer bytes".
	what     string
	capacity int64
	reserve  int64
	ceiling  int64 // per company; 0: none

	mu      sync.Mutex
	used    int64
	peak    int64
	holders map[string]int64
	freed   chan struct{} // closed and replaced on every release
}

func newFairPool(what string, capacity, reserve, ceiling int64) *fairPool {
	return &fairPool{what: what, capacity: capacity, reserve: reserve, ceiling: ceiling, holders: map[string]int64{}, freed: make(chan struct{})}
}

// sessionReserveOf is how many of a replica's sessions are kept for companies below their
// share: a thirty-second, at least one, so a company alone holds the rest; none of a replica
// of one session, which would otherwise serve nobody.
func sessionReserveOf(sessions int) int64 { return int64(min(max(1, sessions/32), sessions-1)) }

// bufferReserveOf is how many buffer bytes are kept for companies below their share: an
// eighth.
func bufferReserveOf(bytes int64) int64 { return bytes / 8 }

// tryTake takes n for company if admits lets it, or reports why not.
func (p *fairPool) tryTake(company string, n int64) *execproto.Error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.takeLocked(company, n)
}

func (p *fairPool) takeLocked(company string, n int64) *execproto.Error {
	mine := p.holders[company]
	companies := len(p.holders)
	if mine == 0 {
		companies++
	}
	switch {
	case p.ceiling > 0 && mine+n > p.ceiling:
		return execproto.NewError(execproto.CodeUnavailable, "", "the exec-worker serves its maximum of %d %s for company %s; try again", p.ceiling, p.what, company)
	case !admits(p.capacity, p.reserve, p.used, mine, companies, n):
		return execproto.NewError(execproto.CodeUnavailable, "", "the exec-worker's %s are taken (%d of %d; company %s holds %d); try again", p.what, p.used, p.capacity, company, mine)
	}
	p.used += n
	p.peak = max(p.peak, p.used)
	p.holders[company] = mine + n
	return nil
}

// wait takes n for company once admits lets it, or fails when ctx ends; n larger than the
// whole pool fails at once.
func (p *fairPool) wait(ctx context.Context, company string, n int64) error {
	if n > p.capacity {
		return execproto.NewError(execproto.CodeUnavailable, "", "%d bytes are more than the exec-worker's %d %s", n, p.capacity, p.what)
	}
	for {
		p.mu.Lock()
		err := p.takeLocked(company, n)
		freed := p.freed
		p.mu.Unlock()
		if err == nil {
			return nil
		}
		select {
		case <-freed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// release gives back n of company's.
func (p *fairPool) release(company string, n int64) {
	if n <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.used -= n
	if p.holders[company] -= n; p.holders[company] <= 0 {
		delete(p.holders, company)
	}
	close(p.freed)
	p.freed = make(chan struct{})
}

// take takes one unit (a stream) for company; release gives it back, once however often
// called.
func (p *fairPool) take(company string) (release func(), err *execproto.Error) {
	if err := p.tryTake(company, 1); err != nil {
		return nil, err
	}
	var once sync.Once
	return func() { once.Do(func() { p.release(company, 1) }) }, nil
}

// stats are what the pool holds now and held at most.
func (p *fairPool) stats() (used, peak int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.used, p.peak
}

// account is one session's part of a byte pool: what it holds is given back whole when the
// session ends, and nothing is taken after.
type account struct {
	pool    *fairPool
	company string

	mu     sync.Mutex
	held   int64
	closed bool
}

func newAccount(p *fairPool, company string) *account { return &account{pool: p, company: company} }

// tryTake takes n if the pool admits it now; nothing is always granted.
func (a *account) tryTake(n int64) bool {
	if n <= 0 {
		return true
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed || a.pool.tryTake(a.company, n) != nil {
		return false
	}
	a.held += n
	return true
}

// wait takes n once the pool admits it; nothing is granted at once (a heartbeat frame).
func (a *account) wait(ctx context.Context, n int64) error {
	if n <= 0 {
		return nil
	}
	if err := a.pool.wait(ctx, a.company, n); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		a.pool.release(a.company, n)
		return context.Canceled
	}
	a.held += n
	return nil
}

// release gives back n taken.
func (a *account) release(n int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	n = min(n, a.held)
	a.held -= n
	a.pool.release(a.company, n)
}

// close gives back everything still held.
func (a *account) close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closed = true
	a.pool.release(a.company, a.held)
	a.held = 0
}
