package sandboxd

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kubeclip/kubeclip/pkg/execspec"
)

// markStride is how many chunks one sparse index entry covers. Finding a seq reads at most
// markStride-1 frame headers; the index costs 8 bytes per markStride chunks, so a command that
// writes a byte at a time cannot make it large.
const markStride = 128

// memJournalMax is how large a journal grows in memory before it moves to its file. Most execs
// (probes, mkdir, bridge polls: ~9 a second per run) print far less, and creating, writing and
// unlinking a file for each costs more than running the command (a create alone is ~0.2 ms on
// a loaded ext4). Agent output and downloads go to disk.
const memJournalMax = 64 << 10

// journalExt names journal files (<exec id>.<n>.journal in the journal directory).
const journalExt = ".journal"

// DefaultJournalMemory bounds the memory of all in-memory journals together; past it, new
// output goes to disk even for small journals.
const DefaultJournalMemory = 64 << 20

// DefaultJournalDisk bounds the journal files together: the pod's run emptyDir is 2 GiB
// (pkg/policy), and the kubelet evicts a pod whose emptyDir outgrows its sizeLimit, so past
// this bound output is dropped (the exit says truncated) instead.
const DefaultJournalDisk = 1536 << 20

// errJournalDisk is output dropped because the journal files hold the server's disk bound.
var errJournalDisk = errors.New("the journals hold --journal-disk-bytes: output dropped")

// errFromBeyond is a read from a seq past the next one to be written: a client cannot have seen
// it, so the request is wrong.
var errFromBeyond = errors.New("from is beyond the journal's next seq")

// byteBudget is what is left of a bound shared by a server's journals: the memory of in-memory
// journals, and the disk of spilled ones.
type byteBudget struct{ left atomic.Int64 }

func newByteBudget(n int64) *byteBudget {
	b := &byteBudget{}
	b.left.Store(n)
	return b
}

func (b *byteBudget) take(n int64) bool {
	if b.left.Add(-n) < 0 {
		b.left.Add(n)
		return false
	}
	return true
}

func (b *byteBudget) release(n int64) { b.left.Add(n) }

// journal is one exec's output: its output frames, exactly as sent on the wire, kept in memory
// while small and then in a file, with a sparse index from seq to offset. Bytes once written
// never change, so followers read them without the lock, and are woken by closing changed,
// never by polling.
type journal struct {
	path   string
	max    int64 // size cap: payload plus frameHeaderSize per chunk
	head   int64 // max less the tails' reserve: output past it goes to the tails
	budget *byteBudget
	disk   *byteBudget

	mu        sync.Mutex
	mem       []byte   // the frames until spilled
	spilled   bool     // the frames are in the file at path
	onDisk    int64    // bytes taken from disk
	removed   bool     // remove gave the memory and disk back
	f         *os.File // write side once spilled; nil after finish
	size      int64
	lastSeq   uint64
	marks     []int64 // marks[k]: offset of seq k*markStride+1
	bytes     [3]int64
	truncated bool
	tails     [3]*tailRing // per stream, from the first output past head until finish
	tailMem   int64        // what the tails took from budget
	werr      error
	exit      *execspec.Exit
	changed   chan struct{}
}

func newJournal(path string, max int64, budget, disk *byteBudget) *journal {
	return &journal{path: path, max: max, head: max - tailReserve(max), budget: budget, disk: disk, changed: make(chan struct{})}
}

// append journals buf[frameHeaderSize:] as the next chunk of stream; buf[:frameHeaderSize] is
// room for the header. Output past the head (a chunk that crosses it is cut) goes to the
// stream's tail, journaled when the command exits (finish); seqs stay contiguous.
func (j *journal) append(stream Stream, buf []byte) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.exit != nil || j.werr != nil {
		return
	}
	n := int64(len(buf) - frameHeaderSize)
	if room := max(j.head-j.size-frameHeaderSize, 0); n > room {
		j.keepTail(stream, buf[frameHeaderSize+room:])
		if n = room; n == 0 {
			return
		}
	}
	j.record(stream, buf[:frameHeaderSize+n])
}

// record writes buf[frameHeaderSize:] as the next chunk of stream, its header into
// buf[:frameHeaderSize]. The caller holds mu and has checked the cap.
func (j *journal) record(stream Stream, buf []byte) {
	seq := j.lastSeq + 1
	putHeader(buf, frameOutput, stream, seq, len(buf)-frameHeaderSize)
	if err := j.write(buf); err != nil {
		// A full disk: keep what is whole and drop the rest, like the cap.
		j.werr = err
		j.truncated = true
		return
	}
	if (seq-1)%markStride == 0 {
		j.marks = append(j.marks, j.size)
	}
	j.size += int64(len(buf))
	j.lastSeq = seq
	j.bytes[stream] += int64(len(buf) - frameHeaderSize)
	j.notify()
}

// keepTail writes p, output past the head, to stream's tail. The tail's memory comes from the
// journals' memory budget; without room there (or with a cap too small to split) the output is
// dropped, as it was before tails.
func (j *journal) keepTail(stream Stream, p []byte) {
	r := j.tails[stream]
	if r == nil {
		keep := tailKeep(j.max)
		if keep == 0 || !j.budget.take(keep) {
			j.truncated = true
			return
		}
		r = &tailRing{buf: make([]byte, keep)}
		j.tails[stream], j.tailMem = r, j.tailMem+keep
	}
	r.write(p)
}

// flushTails journals each stream's tail, after a marker when output was skipped before it,
// and gives the tails' memory back. The caller holds mu; tailReserve left room for it all.
func (j *journal) flushTails() {
	for _, stream := range []Stream{Stdout, Stderr} {
		r := j.tails[stream]
		if r == nil || j.werr != nil {
			continue
		}
		data, skipped := r.kept()
		if skipped > 0 {
			j.truncated = true
			j.recordCopy(stream, tailMarker(skipped, int64(len(data))))
		}
		for len(data) > 0 && j.werr == nil {
			n := min(len(data), tailChunk)
			j.recordCopy(stream, data[:n])
			data = data[n:]
		}
	}
	j.releaseTails()
}

func (j *journal) recordCopy(stream Stream, payload []byte) {
	buf := make([]byte, frameHeaderSize+len(payload))
	copy(buf[frameHeaderSize:], payload)
	j.record(stream, buf)
}

func (j *journal) releaseTails() {
	j.budget.release(j.tailMem)
	j.tails, j.tailMem = [3]*tailRing{}, 0
}

// write stores frame in memory, or in the file once the journal outgrew memory.
func (j *journal) write(frame []byte) error {
	if !j.spilled {
		if len(j.mem)+len(frame) <= memJournalMax && j.budget.take(int64(len(frame))) {
			j.mem = append(j.mem, frame...)
			return nil
		}
		if !j.takeDisk(int64(len(j.mem))) {
			return errJournalDisk
		}
		f, err := os.OpenFile(j.path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
		if err != nil {
			return fmt.Errorf("creating the journal: %w", err)
		}
		if _, err := f.Write(j.mem); err != nil {
			_ = f.Close()
			return fmt.Errorf("writing the journal: %w", err)
		}
		// Followers holding the old slice keep reading it; the bytes are the same.
		j.budget.release(int64(len(j.mem)))
		j.f, j.mem, j.spilled = f, nil, true
	}
	if !j.takeDisk(int64(len(frame))) {
		return errJournalDisk
	}
	if _, err := j.f.Write(frame); err != nil {
		return fmt.Errorf("writing the journal: %w", err)
	}
	return nil
}

func (j *journal) takeDisk(n int64) bool {
	if !j.disk.take(n) {
		return false
	}
	j.onDisk += n
	return true
}

// finish completes e with the journal's counts, records it as the exit frame and closes the
// write side. It returns the completed exit.
func (j *journal) finish(e execspec.Exit) execspec.Exit {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.flushTails()
	e.StdoutBytes, e.StderrBytes = j.bytes[Stdout], j.bytes[Stderr]
	e.LastSeq = j.lastSeq
	e.Truncated = j.truncated
	if j.werr != nil && e.Error == "" {
		e.Error = j.werr.Error()
	}
	if j.f != nil {
		if err := j.f.Close(); err != nil && e.Error == "" {
			e.Error = "closing the journal: " + err.Error()
		}
		j.f = nil
	}
	j.exit = &e
	j.notify()
	return e
}

// remove drops the journal's file and gives its memory back to the budget. A follower still
// streaming it (an observer, when the exec's own client closes it) finishes from the memory it
// still references, or from the file it has open; the memory goes with the last follower.
func (j *journal) remove() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.removed {
		return nil
	}
	j.removed = true
	j.releaseTails()
	j.budget.release(int64(len(j.mem)))
	j.disk.release(j.onDisk)
	j.onDisk = 0
	if j.f != nil {
		_ = j.f.Close()
		j.f = nil
	}
	if !j.spilled {
		return nil
	}
	if err := os.Remove(j.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing the journal: %w", err)
	}
	return nil
}

// exited reports whether the exit frame is in the journal.
func (j *journal) exited() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.exit != nil
}

func (j *journal) notify() {
	close(j.changed)
	j.changed = make(chan struct{})
}

// view is a consistent state for a follower: the first size bytes are whole frames, in mem
// unless spilled.
type view struct {
	size    int64
	lastSeq uint64
	mem     []byte
	spilled bool
	exit    *execspec.Exit
	changed <-chan struct{}
}

func (j *journal) view() view {
	j.mu.Lock()
	defer j.mu.Unlock()
	v := view{size: j.size, lastSeq: j.lastSeq, spilled: j.spilled, exit: j.exit, changed: j.changed}
	if !j.spilled {
		v.mem = j.mem[:j.size:j.size]
	}
	return v
}

// follower streams a journal from one seq on.
type follower struct {
	j   *journal
	r   *os.File // opened once the journal is on disk
	pos int64
}

// follow positions a follower at seq from (1 = the beginning).
func (j *journal) follow(from uint64) (*follower, error) {
	f := &follower{j: j}
	if err := f.locate(from); err != nil {
		f.close()
		return nil, err
	}
	return f, nil
}

func (f *follower) close() {
	if f.r != nil {
		_ = f.r.Close()
	}
}

// reader returns the bytes [off, end) of v.
func (f *follower) reader(v view, off, end int64) (io.Reader, error) {
	if !v.spilled {
		return &sliceReader{b: v.mem[off:end]}, nil
	}
	if f.r == nil {
		r, err := os.Open(f.j.path)
		if err != nil {
			return nil, fmt.Errorf("opening the journal: %w", err)
		}
		f.r = r
	}
	return io.NewSectionReader(f.r, off, end-off), nil
}

// sliceReader is bytes.Reader without WriteTo's single large write (a 64 KiB slice per call
// keeps TLS records and flushes regular).
type sliceReader struct{ b []byte }

func (s *sliceReader) Read(p []byte) (int, error) {
	if len(s.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, s.b)
	s.b = s.b[n:]
	return n, nil
}

// locate sets pos to seq's frame: the nearest mark, then frame headers.
func (f *follower) locate(seq uint64) error {
	f.j.mu.Lock()
	if seq == 0 || seq > f.j.lastSeq+1 {
		last := f.j.lastSeq
		f.j.mu.Unlock()
		return fmt.Errorf("%w (from=%d, last seq %d)", errFromBeyond, seq, last)
	}
	if seq == f.j.lastSeq+1 {
		f.pos = f.j.size
		f.j.mu.Unlock()
		return nil
	}
	off := f.j.marks[(seq-1)/markStride]
	f.j.mu.Unlock()
	v := f.j.view()
	var hdr [frameHeaderSize]byte
	for range (seq - 1) % markStride {
		r, err := f.reader(v, off, off+frameHeaderSize)
		if err == nil {
			_, err = io.ReadFull(r, hdr[:])
		}
		if err != nil {
			return fmt.Errorf("reading the journal: %w", err)
		}
		off += frameHeaderSize + int64(binary.BigEndian.Uint32(hdr[10:14]))
	}
	f.pos = off
	return nil
}

// stream writes every frame from the follower's position to w, following live output, then the
// exit frame; while nothing else is written it sends a heartbeat every heartbeat. flush pushes
// what was written to the client; the caller flushes after the exit frame (by returning).
func (f *follower) stream(ctx context.Context, w io.Writer, flush func() error, heartbeat time.Duration) error {
	defer f.close()
	timer := time.NewTimer(heartbeat)
	defer timer.Stop()
	sent := func() error {
		if err := flush(); err != nil {
			return err
		}
		timer.Reset(heartbeat)
		return nil
	}
	for {
		v := f.j.view()
		if f.pos < v.size {
			r, err := f.reader(v, f.pos, v.size)
			if err != nil {
				return err
			}
			if _, err := io.Copy(w, r); err != nil {
				return fmt.Errorf("sending output: %w", err)
			}
			f.pos = v.size
			if err := sent(); err != nil {
				return err
			}
			continue
		}
		if v.exit != nil {
			// Not flushed: the end of the response follows at once, in the same write.
			if _, err := w.Write(exitFrame(v.exit)); err != nil {
				return fmt.Errorf("sending the exit frame: %w", err)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-v.changed:
		case <-timer.C:
			if _, err := w.Write(appendControlFrame(nil, frameHeartbeat, v.lastSeq, nil)); err != nil {
				return fmt.Errorf("sending a heartbeat: %w", err)
			}
			if err := sent(); err != nil {
				return err
			}
		}
	}
}
