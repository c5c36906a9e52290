package sandboxd

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kubeclip/kubeclip/pkg/execspec"
)

// maxAnswer bounds every JSON answer the client reads from a pod (a start's result, info, a
// stdin offset, an error: each well under a kilobyte), and the headers of any answer: a pod runs
// the tenant's code, and its sandboxd may answer anything.
const maxAnswer = 64 << 10

// DefaultStallTimeout is how long Output waits for any frame before giving up with ErrStalled:
// three missed heartbeats, plus slack for a loaded node.
const DefaultStallTimeout = 5 * time.Second

// ClientOptions configure a Client.
type ClientOptions struct {
	// Dial opens a byte stream to the daemon: TCP to the pod (DialTCP), the unix socket
	// (DialUnix), or a Kubernetes exec of `sandboxd proxy`. Required.
	Dial func(ctx context.Context) (net.Conn, error)
	// TLS, when set, runs TLS over each dialled stream (ClientTLSConfig pins the lease's key).
	TLS *tls.Config
	// Token is sent as "Authorization: Bearer <token>" (ClientToken).
	Token string
	// StallTimeout defaults to DefaultStallTimeout.
	StallTimeout time.Duration
	// MaxIdleConns is how many kept-alive connections the client holds; default 8 (four
	// execs in flight plus polls, as Paperclip drives one lease).
	MaxIdleConns int
}

// outputBufferSize is an output stream's read buffer.
const outputBufferSize = 32 << 10

// Client calls one sandboxd. It is safe for concurrent use; Close releases its idle connections.
type Client struct {
	hc    *http.Client
	tr    *http.Transport
	base  string
	token string
	stall time.Duration
	// readers recycles the output streams' read buffers: the exec-worker opens one stream per
	// exec (every bridge poll is one), and a new 32 KiB buffer each was over half of what an
	// exec of `true` allocated (BenchmarkExecTrue: 55.9 KB of 32 KiB + the rest).
	readers sync.Pool
}

// DialTCP returns a Dial for a TCP address (a pod IP and port).
func DialTCP(addr string) func(ctx context.Context) (net.Conn, error) {
	var d net.Dialer
	return func(ctx context.Context) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }
}

// DialUnix returns a Dial for a unix socket.
func DialUnix(path string) func(ctx context.Context) (net.Conn, error) {
	var d net.Dialer
	return func(ctx context.Context) (net.Conn, error) { return d.DialContext(ctx, "unix", path) }
}

// NewClient returns a client that reaches sandboxd through o.Dial.
func NewClient(o ClientOptions) (*Client, error) {
	if o.Dial == nil {
		return nil, errors.New("sandboxd: ClientOptions.Dial is required")
	}
	if o.StallTimeout <= 0 {
		o.StallTimeout = DefaultStallTimeout
	}
	if o.MaxIdleConns <= 0 {
		o.MaxIdleConns = 8
	}
	dial := o.Dial
	tr := &http.Transport{
		DialContext:         func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
		MaxIdleConns:        o.MaxIdleConns,
		MaxIdleConnsPerHost: o.MaxIdleConns,
		IdleConnTimeout:     90 * time.Second, // below the server's IdleTimeout
		DisableCompression:  true,
		// A pod's headers are bounded like its bodies.
		MaxResponseHeaderBytes: maxAnswer,
	}
	c := &Client{hc: &http.Client{Transport: tr}, tr: tr, base: "http://sandboxd", token: o.Token, stall: o.StallTimeout}
	if o.TLS != nil {
		cfg := o.TLS.Clone()
		tr.DialTLSContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			conn, err := dial(ctx)
			if err != nil {
				return nil, err
			}
			tc := tls.Client(conn, cfg)
			if err := tc.HandshakeContext(ctx); err != nil {
				_ = conn.Close()
				return nil, fmt.Errorf("TLS handshake with sandboxd: %w", err)
			}
			return tc, nil
		}
		c.base = "https://sandboxd"
	}
	return c, nil
}

// Close closes the client's idle connections.
func (c *Client) Close() { c.tr.CloseIdleConnections() }

func (c *Client) do(ctx context.Context, method, path string, body io.Reader, contentType string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	return c.hc.Do(req)
}

// call sends a request and decodes a JSON answer of one of the ok statuses into out (if not
// nil); any other answer becomes an *APIError.
func (c *Client) call(ctx context.Context, method, path string, body io.Reader, contentType string, out any, ok ...int) (int, error) {
	resp, err := c.do(ctx, method, path, body, contentType)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	for _, s := range ok {
		if resp.StatusCode != s {
			continue
		}
		b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer+1))
		if err != nil {
			return resp.StatusCode, fmt.Errorf("reading the answer: %w", err)
		}
		if len(b) > maxAnswer {
			return resp.StatusCode, fmt.Errorf("%w: the answer is over %d bytes", ErrProtocol, maxAnswer)
		}
		if out != nil {
			if err := json.Unmarshal(b, out); err != nil {
				return resp.StatusCode, fmt.Errorf("decoding the answer: %w", err)
			}
		}
		return resp.StatusCode, nil
	}
	return resp.StatusCode, apiError(resp)
}

// apiError reads an error answer.
func apiError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	var body errorBody
	if json.Unmarshal(b, &body) == nil && body.Code != "" {
		e := &APIError{Status: resp.StatusCode, Code: body.Code, Message: body.Message}
		if body.Offset != nil {
			e.Offset = *body.Offset
		}
		return e
	}
	return &APIError{Status: resp.StatusCode, Message: string(bytes.TrimSpace(b))}
}

func execPath(id, op string) string {
	p := "/v1/execs/" + url.PathEscape(id)
	if op != "" {
		p += "/" + op
	}
	return p
}

// Start starts spec, or returns the exec that already has its id and spec (Created false).
func (c *Client) Start(ctx context.Context, spec Spec) (StartResult, error) {
	b, err := json.Marshal(spec)
	if err != nil {
		return StartResult{}, fmt.Errorf("encoding exec %s: %w", spec.ID, err)
	}
	var res StartResult
	status, err := c.call(ctx, http.MethodPost, "/v1/execs", bytes.NewReader(b), "application/json", &res, http.StatusCreated, http.StatusOK)
	if err != nil {
		return StartResult{}, fmt.Errorf("starting exec %s: %w", spec.ID, err)
	}
	res.Created = status == http.StatusCreated
	return res, nil
}

// WriteStdin sends data as the command's stdin from offset (the bytes sent so far), closing
// stdin after it when eof. It returns the new offset; on ErrOffsetMismatch (and ErrStdinClosed)
// it returns the daemon's current offset, from which a client resends.
func (c *Client) WriteStdin(ctx context.Context, id string, offset int64, data []byte, eof bool) (int64, error) {
	q := url.Values{"offset": {strconv.FormatInt(offset, 10)}}
	if eof {
		q.Set("eof", "1")
	}
	var res offsetResponse
	_, err := c.call(ctx, http.MethodPost, execPath(id, "stdin")+"?"+q.Encode(), bytes.NewReader(data), "application/octet-stream", &res, http.StatusOK)
	if err != nil {
		var ae *APIError
		if errors.As(err, &ae) && (errors.Is(ae, ErrOffsetMismatch) || errors.Is(ae, ErrStdinClosed)) {
			return ae.Offset, fmt.Errorf("writing stdin of exec %s: %w", id, err)
		}
		return offset, fmt.Errorf("writing stdin of exec %s: %w", id, err)
	}
	return res.Offset, nil
}

// Signal sends sig ("SIGTERM", …) to the exec's process group.
func (c *Client) Signal(ctx context.Context, id, sig string) error {
	b, _ := json.Marshal(signalRequest{Signal: sig})
	if _, err := c.call(ctx, http.MethodPost, execPath(id, "signal"), bytes.NewReader(b), "application/json", nil, http.StatusOK); err != nil {
		return fmt.Errorf("signalling exec %s: %w", id, err)
	}
	return nil
}

// Resize sets the size of the exec's terminal (an exec started with Spec.TTY).
func (c *Client) Resize(ctx context.Context, id string, sz execspec.TTY) error {
	b, _ := json.Marshal(resizeRequest(sz))
	if _, err := c.call(ctx, http.MethodPost, execPath(id, "resize"), bytes.NewReader(b), "application/json", nil, http.StatusOK); err != nil {
		return fmt.Errorf("resizing the terminal of exec %s: %w", id, err)
	}
	return nil
}

// Delete forgets an exited exec and its journal.
func (c *Client) Delete(ctx context.Context, id string) error {
	if _, err := c.call(ctx, http.MethodDelete, execPath(id, ""), nil, "", nil, http.StatusNoContent); err != nil {
		return fmt.Errorf("deleting exec %s: %w", id, err)
	}
	return nil
}

// Info returns the daemon's state.
func (c *Client) Info(ctx context.Context) (Info, error) {
	var info Info
	if _, err := c.call(ctx, http.MethodGet, "/v1/info", nil, "", &info, http.StatusOK); err != nil {
		return Info{}, fmt.Errorf("asking sandboxd for info: %w", err)
	}
	return info, nil
}

// Output opens the exec's output from journal seq from (1 = the beginning). ctx bounds the whole
// stream.
func (c *Client) Output(ctx context.Context, id string, from uint64) (*OutputStream, error) {
	path := execPath(id, "output") + "?from=" + strconv.FormatUint(from, 10)
	resp, err := c.do(ctx, http.MethodGet, path, nil, "")
	if err != nil {
		return nil, fmt.Errorf("reading output of exec %s: %w", id, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, fmt.Errorf("reading output of exec %s: %w", id, apiError(resp))
	}
	r, ok := c.readers.Get().(*bufio.Reader)
	if ok {
		r.Reset(resp.Body)
	} else {
		r = bufio.NewReaderSize(resp.Body, outputBufferSize)
	}
	return &OutputStream{body: resp.Body, r: r, stall: c.stall, recycle: c.readers.Put}, nil
}

// OutputStream reads an exec's frames: *Chunk, *Heartbeat, then one *execspec.Exit.
type OutputStream struct {
	body    io.ReadCloser
	r       *bufio.Reader
	hdr     [frameHeaderSize]byte
	stall   time.Duration
	stalled atomic.Bool
	done    bool
	// recycle takes r back once the stream was read to its end (nothing reads r after that);
	// a stream closed before its end leaves r to the garbage collector.
	recycle func(any)
	budget  Budget
}

// Budget is charged the payload of every frame an OutputStream reads, before the payload is
// read: a pod's frames cost their reader only what the budget grants.
type Budget interface {
	// Take blocks until n bytes are granted; its error ends the stream.
	Take(n int) error
	// Release gives back n bytes taken.
	Release(n int)
}

// Charge makes the stream take every frame's payload from b. A chunk's Data stays charged until
// the caller releases len(Data); every other frame is released before Next returns it. While
// Take blocks the stream is not read, so the pod's sandboxd waits (its journal keeps the
// command's output), and the stall timeout does not run.
func (s *OutputStream) Charge(b Budget) { s.budget = b }

// Next returns the next frame. After the *execspec.Exit frame it returns io.EOF. A stream that ends
// before the exit frame returns io.ErrUnexpectedEOF (or the transport's error), one on which no
// frame arrived within the stall timeout ErrStalled: resume with Output from the seq after the
// last chunk received.
func (s *OutputStream) Next() (Frame, error) {
	if s.done {
		return nil, io.EOF
	}
	t := time.AfterFunc(s.stall, func() { s.stalled.Store(true); _ = s.body.Close() })
	defer t.Stop()
	var budget Budget
	if s.budget != nil {
		budget = stallPaused{s.budget, t, s.stall}
	}
	f, err := readFrameCharged(s.r, s.hdr[:], budget)
	if err != nil {
		if s.stalled.Load() {
			return nil, ErrStalled
		}
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("output stream ended before the exit frame: %w", io.ErrUnexpectedEOF)
		}
		return nil, err
	}
	if _, chunk := f.(*Chunk); !chunk && s.budget != nil {
		s.budget.Release(int(binary.BigEndian.Uint32(s.hdr[10:14])))
	}
	if _, ok := f.(*execspec.Exit); ok {
		s.done = true
		// Read the end of the response so the connection goes back to the pool (a pod that
		// sends more after its exit frame loses the connection instead).
		_, _ = io.Copy(io.Discard, io.LimitReader(s.r, maxAnswer))
		s.r.Reset(nil)
		s.recycle(s.r)
		s.r = nil
	}
	return f, nil
}

// Close ends the stream.
func (s *OutputStream) Close() error { return s.body.Close() }

// stallPaused is a stream's budget with its stall timer stopped while Take waits: waiting for
// memory is not the pod stalling.
type stallPaused struct {
	Budget
	timer *time.Timer
	stall time.Duration
}

func (b stallPaused) Take(n int) error {
	b.timer.Stop()
	defer b.timer.Reset(b.stall)
	return b.Budget.Take(n)
}
