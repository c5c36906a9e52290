package execsvc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/kubeclip/kubeclip/pkg/sandboxd"
)

// Defaults of KubeExecRoute.
const (
	// DefaultContainer is the agent container, whose main process is sandboxd.
	DefaultContainer = "agent"
	// DefaultProxyCommand bridges an exec stream to sandboxd's unix socket in the pod.
	DefaultProxyCommand = "/kubeclip/bin/sandboxd proxy"
	// kubeExecIdleConns is lower than the daemon route's: every kept connection is a live exec
	// session through the API server and the kubelet, and a `sandboxd proxy` process in the pod.
	kubeExecIdleConns = 4
)

// KubeExecRoute reaches sandboxd through the Kubernetes exec API: each connection is a
// WebSocket exec of `sandboxd proxy` in the agent container, which bridges its stdin and stdout
// to the daemon's unix socket. The API server authenticates and carries the stream, so there is
// no TLS of the lease's key on top; it needs RBAC `create pods/exec` in the tenant namespaces
// and nothing of the pod network.
type KubeExecRoute struct {
	Config    *rest.Config
	Clientset kubernetes.Interface
	// Container defaults to DefaultContainer, Command to DefaultProxyCommand.
	Container string
	Command   []string
}

var _ Route = (*KubeExecRoute)(nil)

// Name implements Route.
func (*KubeExecRoute) Name() string { return RouteKubeExec }

// Client implements Route.
func (r *KubeExecRoute) Client(pod Pod, _ []byte) (*sandboxd.Client, error) {
	if r.Config == nil || r.Clientset == nil {
		return nil, errors.New("execsvc: KubeExecRoute needs Config and Clientset")
	}
	container, command := r.Container, r.Command
	if container == "" {
		container = DefaultContainer
	}
	if len(command) == 0 {
		command = strings.Fields(DefaultProxyCommand)
	}
	url := r.Clientset.CoreV1().RESTClient().Post().
		Resource("pods").Namespace(pod.Namespace).Name(pod.Name).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{
			Container: container, Command: command, Stdin: true, Stdout: true, Stderr: true,
		}, scheme.ParameterCodec).URL()
	exec, err := remotecommand.NewWebSocketExecutor(r.Config, "GET", url.String())
	if err != nil {
		return nil, fmt.Errorf("building the exec executor for pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return sandboxd.NewClient(sandboxd.ClientOptions{
		Dial:         func(ctx context.Context) (net.Conn, error) { return dialExec(ctx, exec), nil },
		MaxIdleConns: kubeExecIdleConns,
	})
}

// execConn is a net.Conn over one exec stream's stdin and stdout.
type execConn struct {
	stdin  *io.PipeWriter
	stdout *io.PipeReader
	cancel context.CancelFunc
	once   sync.Once
}

// dialExec starts an exec stream and returns it as a connection at once: the stream is
// established while the first request is written, and a stream that fails (no such pod, no
// permission) fails that request's read with the exec's error.
func dialExec(ctx context.Context, exec remotecommand.Executor) net.Conn {
	// The stream lives as long as the connection, not as the dial: the HTTP transport dials
	// with the context of the request that needed a connection, and keeps the connection after.
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	c := &execConn{stdin: inW, stdout: outR, cancel: cancel}
	go func() {
		var stderr bytes.Buffer
		err := exec.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: inR, Stdout: outW, Stderr: &limitedWriter{w: &stderr, n: 4 << 10}})
		if err == nil {
			err = io.EOF
		} else if msg := strings.TrimSpace(stderr.String()); msg != "" {
			err = fmt.Errorf("%w (sandboxd proxy: %s)", err, msg)
		}
		_ = inR.CloseWithError(err)
		_ = outW.CloseWithError(err)
	}()
	return c
}

func (c *execConn) Read(b []byte) (int, error)  { return c.stdout.Read(b) }
func (c *execConn) Write(b []byte) (int, error) { return c.stdin.Write(b) }

// Close ends stdin (sandboxd proxy then closes its socket and exits) and the stream.
func (c *execConn) Close() error {
	c.once.Do(func() {
		_ = c.stdin.Close()
		_ = c.stdout.Close()
		c.cancel()
	})
	return nil
}

func (c *execConn) LocalAddr() net.Addr              { return execAddr{} }
func (c *execConn) RemoteAddr() net.Addr             { return execAddr{} }
func (c *execConn) SetDeadline(time.Time) error      { return errors.ErrUnsupported }
func (c *execConn) SetReadDeadline(time.Time) error  { return errors.ErrUnsupported }
func (c *execConn) SetWriteDeadline(time.Time) error { return errors.ErrUnsupported }

type execAddr struct{}

func (execAddr) Network() string { return "kube-exec" }
func (execAddr) String() string  { return "sandboxd proxy" }

// limitedWriter keeps the first n bytes written (the proxy's error message) and drops the rest.
type limitedWriter struct {
	w io.Writer
	n int
}

func (l *limitedWriter) Write(b []byte) (int, error) {
	if l.n > 0 {
		k := min(len(b), l.n)
		_, _ = l.w.Write(b[:k])
		l.n -= k
	}
	return len(b), nil
}
