package sandboxd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
)

// Proxy bridges in and out to the daemon's unix socket, for `sandboxd proxy`: the exec-worker
// runs it through the Kubernetes exec API and speaks the same HTTP API over its stdin and stdout.
// When in ends, the socket's write side is closed; Proxy returns when the daemon closes the
// connection or ctx ends. The goroutine reading in returns when in does; in a process that is at
// exit.
func Proxy(ctx context.Context, socket string, in io.Reader, out io.Writer) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return fmt.Errorf("connecting to sandboxd: %w", err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	go func() {
		_, _ = io.Copy(conn, in)
		if uc, ok := conn.(*net.UnixConn); ok {
			_ = uc.CloseWrite()
		}
	}()
	if _, err := io.Copy(out, conn); err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("proxying from sandboxd: %w", err)
	}
	return ctx.Err()
}
