package execsvc

import (
	"context"
	"math"
	"slices"
	"testing"
	"time"
)

// TestSizeFor pins the sizing arithmetic: what remains of the memory limit after the replica's
// reserve, a quarter for buffers, the rest in live sessions; and that it fits the limit.
func TestSizeFor(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name  string
		limit int64
		want  Sizing
	}{
		{"the manifests' 256 Mi", 256 * mib, Sizing{Sessions: 576, BufferBytes: 48 * mib}},
		{"1 GiB", 1024 * mib, Sizing{Sessions: 2048, BufferBytes: 240 * mib}},
		{"128 Mi", 128 * mib, Sizing{Sessions: 192, BufferBytes: 16 * mib}},
		{"less than the reserve", 32 * mib, Sizing{Sessions: 1, BufferBytes: minBufferBytes}},
		{"no limit (cgroup max)", math.MaxInt64, Sizing{Sessions: DefaultMaxSessions, BufferBytes: DefaultBufferBytes}},
		{"unknown", 0, Sizing{Sessions: DefaultMaxSessions, BufferBytes: DefaultBufferBytes}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := SizeFor(tc.limit)
			if got != tc.want {
				t.Errorf("SizeFor(%d) = %+v, want %+v", tc.limit, got, tc.want)
			}
			if tc.limit > sessionReserve+minBufferBytes && tc.limit < math.MaxInt64 {
				if need := sessionReserve + int64(got.Sessions)*SessionCost + got.BufferBytes; need > tc.limit {
					t.Errorf("%+v needs %d bytes, more than the limit %d", got, need, tc.limit)
				}
			}
		})
	}
	// The bound: a 256 Mi replica holds at least 500 idle agent commands.
	if got := SizeFor(256 * mib).Sessions; got < 500 {
		t.Errorf("256 Mi serves %d sessions, want >= 500", got)
	}
}

// TestAdmits is the admission decision of every pool: work-conserving (a company alone takes
// all but the reserve), max-min fair (only a company below its share takes from the reserve: from
// its upper half any such company, from its lower half one holding no more than would remain).
func TestAdmits(t *testing.T) {
	for _, tc := range []struct {
		name                          string
		capacity, reserve, used, mine int64
		companies                     int
		n                             int64
		want                          bool
	}{
		{"alone, empty", 100, 4, 0, 0, 1, 1, true},
		{"alone, past any fixed quarter", 100, 4, 60, 60, 1, 1, true},
		{"alone, the last unit before the reserve", 100, 4, 95, 95, 1, 1, true},
		{"alone, not into the reserve", 100, 4, 96, 96, 1, 1, false},
		{"newcomer while one company holds all but the reserve", 100, 4, 96, 0, 2, 1, true},
		{"newcomer takes the last unit", 100, 4, 99, 0, 3, 1, true},
		{"a company below its share takes the reserve's upper half", 100, 4, 96, 3, 2, 1, true},
		{"but not its lower half while it holds more than would remain", 100, 4, 98, 3, 2, 1, false},
		{"the lower half while it holds no more than would remain", 100, 4, 97, 2, 3, 1, true},
		{"the last unit only to a company holding nothing", 100, 4, 99, 1, 3, 1, false},
		{"nothing free", 100, 4, 100, 0, 2, 1, false},
		{"the big one, once another arrived, not into the reserve", 100, 4, 97, 96, 2, 1, false},
		{"two companies, one below its half takes the reserve", 100, 4, 96, 40, 2, 1, true},
		{"two companies, one at its half does not", 100, 4, 96, 50, 2, 1, false},
		{"ten companies, below a tenth", 100, 4, 97, 9, 10, 1, true},
		{"ten companies, at a tenth", 100, 4, 97, 10, 10, 1, false},
		{"bytes: a frame that fits above the reserve", 48 << 20, 6 << 20, 40 << 20, 40 << 20, 1, 1 << 20, true},
		{"bytes: a frame that would eat the reserve", 48 << 20, 6 << 20, 42 << 20, 42 << 20, 1, 1 << 20, false},
		{"bytes: a newcomer's frame from the reserve", 48 << 20, 6 << 20, 42 << 20, 0, 2, 1 << 20, true},
		{"bytes: larger than what is free", 48 << 20, 6 << 20, 47 << 20, 0, 2, 2 << 20, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := admits(tc.capacity, tc.reserve, tc.used, tc.mine, tc.companies, tc.n); got != tc.want {
				t.Errorf("admits(capacity %d, reserve %d, used %d, mine %d, companies %d, n %d) = %v, want %v",
					tc.capacity, tc.reserve, tc.used, tc.mine, tc.companies, tc.n, got, tc.want)
			}
		})
	}
}

// TestFairPoolSessions: a company alone holds all but the reserve; newcomers are admitted from
// the reserve, the first leaving half of it for the next; once they compete, the first company
// gets a released stream back only while the reserve stays whole, and the last free stream goes
// only to a company holding none; a ceiling binds; a release (once, however often called) frees
// a stream.
func TestFairPoolSessions(t *testing.T) {
	const capacity = 64
	p := newFairPool("streams", capacity, sessionReserveOf(capacity), 0)
	var a []func()
	for {
		release, err := p.take("a")
		if err != nil {
			break
		}
		a = append(a, release)
	}
	if want := capacity - 2; len(a) != want {
		t.Fatalf("company a alone holds %d of %d, want %d (all but the reserve of 2)", len(a), capacity, want)
	}
	b1, err := p.take("b")
	if err != nil {
		t.Fatalf("company b's first stream while a holds all it may: %v", err)
	}
	if _, err := p.take("c"); err != nil {
		t.Fatalf("company c's first stream: %v", err)
	}
	if _, err := p.take("b"); err == nil {
		t.Fatal("a stream past the capacity")
	}
	a[0]()
	a[0]()
	if _, err := p.take("a"); err == nil {
		t.Fatal("company a, over its share, took the reserve back")
	}
	if _, err := p.take("b"); err == nil {
		t.Fatal("company b, holding one, took the last free stream")
	}
	if _, err := p.take("d"); err != nil {
		t.Fatalf("company d's first stream, the last free one: %v", err)
	}
	if _, err := p.take("e"); err == nil {
		t.Fatal("a released twice freed two streams")
	}
	b1()
	if used, _ := p.stats(); used != capacity-1 {
		t.Errorf("used %d, want %d", used, capacity-1)
	}

	capped := newFairPool("signals", 100, 1, 2)
	for range 2 {
		if _, err := capped.take("a"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := capped.take("a"); err == nil {
		t.Fatal("a signal past the company's ceiling of 2")
	}
}

// TestAccountWaitsForBytes: a session waiting for buffer bytes gets them once another company's
// are released, never more than the pool; a closed account gives back all it held.
func TestAccountWaitsForBytes(t *testing.T) {
	p := newFairPool("buffer bytes", 1<<20, 1<<17, 0)
	hog := newAccount(p, "a")
	for hog.tryTake(64 << 10) {
	}
	if used, _ := p.stats(); used != 1<<20-1<<17 {
		t.Fatalf("company a alone holds %d, want all but the reserve", used)
	}
	if !newAccount(p, "b").tryTake(64 << 10) {
		t.Fatal("company b's first bytes while a holds all it may")
	}
	c := newAccount(p, "c")
	got := make(chan error, 1)
	go func() { got <- c.wait(t.Context(), 256<<10) }()
	select {
	case err := <-got:
		t.Fatalf("256 KiB granted with %d free: %v", 1<<17-64<<10, err)
	case <-time.After(50 * time.Millisecond):
	}
	hog.close()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if _, peak := p.stats(); peak > 1<<20 {
		t.Errorf("the pool held %d, more than its 1 MiB", peak)
	}
	c.close()
	c.release(256 << 10) // after close: nothing more is given back
	if used, _ := p.stats(); used != 64<<10 {
		t.Errorf("used %d after a's and c's accounts closed, want b's 64 KiB", used)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := newAccount(p, "d").wait(ctx, 2<<20); err == nil {
		t.Error("a wait for more than the pool ended without its context's error")
	}
}

// TestLineBufferCharged: the recorder's line buffer and its parse are taken from the session's
// line budget as they grow and given back at the line's end; a line the budget has no room for
// is not parsed (still recorded), and the next one is.
func TestLineBufferCharged(t *testing.T) {
	pool := newFairPool("line buffer bytes", 64<<10, 8<<10, 0)
	p := &lineParser{max: DefaultMaxRecordedLine, mem: newAccount(pool, "a")}
	json := []byte(`{"type":"system","subtype":"init","session_id":"s1"}`)
	p.feed(json[:10]) // a line spanning two chunks is buffered
	if used, _ := pool.stats(); used < 10 {
		t.Errorf("a buffered line holds %d bytes of the budget, want its buffer", used)
	}
	p.feed(append(json[10:], '\n'))
	if used, _ := pool.stats(); used != 0 || !p.sawJSON {
		t.Errorf("after the line: %d bytes held, parsed %v; want 0, true", used, p.sawJSON)
	}
	q := &lineParser{max: DefaultMaxRecordedLine, mem: newAccount(pool, "a")}
	big := append([]byte(`{"type":"system","x":"`), make([]byte, 32<<10)...)
	for i := range big[22:] {
		big[22+i] = 'x'
	}
	q.feed(append(big, "\"}\n"...)) // 32 KiB parsed costs 160 KiB: more than the budget
	if q.sawJSON {
		t.Error("a line whose parse exceeds the budget was parsed")
	}
	q.feed(append(json, '\n'))
	if !q.sawJSON {
		t.Error("the line after it was not parsed")
	}
	if used, peak := pool.stats(); used != 0 || peak > 64<<10 {
		t.Errorf("held %d after the lines, at most %d; want 0 and at most the budget", used, peak)
	}
}

// TestAccountGrantsNothingAtOnce: a heartbeat frame or an EOF-only stdin message (0 bytes) never
// waits, even for a company over its share of a full pool.
func TestAccountGrantsNothingAtOnce(t *testing.T) {
	p := newFairPool("buffer bytes", 100, 10, 0)
	a := newAccount(p, "a")
	if !a.tryTake(90) {
		t.Fatal("company a alone: 90 of 100 with a reserve of 10")
	}
	if !newAccount(p, "b").tryTake(10) {
		t.Fatal("company b: the reserve")
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := a.wait(ctx, 0); err != nil || !a.tryTake(0) {
		t.Errorf("0 bytes over the share: wait %v, want granted", err)
	}
}

// TestSessionReserve: a thirty-second of a replica's sessions, at least one, and none of a
// replica of one session (whose one session a company alone must get).
func TestSessionReserve(t *testing.T) {
	for _, tc := range []struct {
		sessions int
		want     int64
	}{{576, 18}, {64, 2}, {8, 1}, {2, 1}, {1, 0}} {
		if got := sessionReserveOf(tc.sessions); got != tc.want {
			t.Errorf("sessionReserveOf(%d) = %d, want %d", tc.sessions, got, tc.want)
		}
	}
	p := newFairPool("streams", 1, sessionReserveOf(1), 0)
	if _, err := p.take("a"); err != nil {
		t.Errorf("a replica of one session refused a company alone: %v", err)
	}
}

// TestNewcomersShareTheReserve: on a replica sized from 256 Mi that one company fills, each
// newcomer in turn floods it; the first leaves half the reserve for the next, and so on, so
// one newcomer's flood never takes every other newcomer's first stream.
func TestNewcomersShareTheReserve(t *testing.T) {
	capacity := SizeFor(256 << 20).Sessions
	p := newFairPool("streams", int64(capacity), sessionReserveOf(capacity), 0)
	for {
		if _, err := p.take("a"); err != nil {
			break
		}
	}
	var got []int
	for _, c := range []string{"b", "c", "d", "e", "f"} {
		n := 0
		for {
			if _, err := p.take(c); err != nil {
				break
			}
			n++
		}
		got = append(got, n)
	}
	t.Logf("reserve %d of %d: newcomers flooding in turn got %v", sessionReserveOf(capacity), capacity, got)
	if want := []int{9, 5, 2, 1, 1}; !slices.Equal(got, want) {
		t.Errorf("newcomers flooding in turn got %v of the reserve, want %v", got, want)
	}
}
