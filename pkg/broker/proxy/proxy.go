// Package proxy is the credential broker's TLS-terminating reverse proxy. A brokered pod
// reaches a bound host (api.anthropic.com) by its own name at the broker (its /etc/hosts
// points the name there), and trusts the installation CA (pkg/broker/ca) the broker's leaf for
// that name comes from. The proxy finds the placeholder in the request's credential header,
// resolves it (pkg/broker's Cache: the grant, the host, the header and the pod's IP must all
// match), puts the real value in its place and forwards the request to the real host, streaming
// the response back unbuffered. Every refusal answers in the called API's own error shape and is
// counted by reason (kubeclip_broker_refusals_total).
package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	stdlog "log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/pkg/broker"
	"github.com/kubeclip/kubeclip/pkg/broker/ca"
)

// Resolver is the part of broker.Cache the proxy needs.
type Resolver interface {
	ResolveWait(ctx context.Context, wait time.Duration, placeholder, host string, header broker.Header, peer netip.Addr) (broker.Resolved, error)
}

// DefaultBindWait is how long a request whose grant is not bound to its pod yet waits for the
// binding before it is refused (broker.ReasonUnbound). The binding normally comes before the
// agent's first call: the run-watcher reports the pod's address once Kubernetes assigns it,
// while the pod is still starting, and the broker binds within milliseconds of the event. The
// wait covers a call that races it, and a run-watcher or broker replica that is restarting,
// without holding a stolen placeholder's request for long: 5 s is well inside every model
// CLI's own timeout, and the refusal after it is a 503 the CLIs retry.
const DefaultBindWait = 5 * time.Second

var _ Resolver = (*broker.Cache)(nil)

// Certificates gives the TLS handshake its certificate for the client's server name, and
// refuses a host that is not bound (ca.Issuer).
type Certificates interface {
	GetCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error)
}

var _ Certificates = (*ca.Issuer)(nil)

// Route is a bound host the proxy serves.
type Route struct {
	// Host is the host's name, as the pod dials it (TLS server name and HTTP Host).
	Host string
	// Address is where the proxy reaches the real host, host:port; "" is Host:443. The
	// operator overrides it for a private endpoint, and tests for a local upstream; the
	// upstream's certificate is still verified for Host.
	Address string
	// Errors is the shape of the API's error bodies, for refusals.
	Errors ErrorFormat
}

// Options configure New.
type Options struct {
	// Routes are the bound hosts. Required.
	Routes []Route
	// Resolver resolves placeholders. Required.
	Resolver Resolver
	// BindWait is how long a request whose grant is not bound to its pod yet waits for the
	// binding (0: DefaultBindWait; negative: not at all).
	BindWait time.Duration
	// Observer sees every forwarded call (nil: none).
	Observer Observer
	// RootCAs verify the upstreams' certificates (nil: the system's roots).
	RootCAs *x509.CertPool
	// Registerer gets kubeclip_broker_refusals_total (nil: not registered).
	Registerer prometheus.Registerer
	// Log gets upstream failures and the HTTP server's errors (never a header's value).
	Log zerolog.Logger
}

// Proxy is the swapping reverse proxy; it is an http.Handler for connections that TLS
// terminated at the broker (Serve).
type Proxy struct {
	routes    map[string]Route
	resolver  Resolver
	bindWait  time.Duration
	observer  Observer
	transport *http.Transport
	rp        *httputil.ReverseProxy
	refusals  *prometheus.CounterVec
	log       zerolog.Logger
	errLog    *stdlog.Logger
}

// New checks o and builds the proxy.
func New(o Options) (*Proxy, error) {
	if o.Resolver == nil {
		return nil, errors.New("proxy.Options.Resolver is required")
	}
	if len(o.Routes) == 0 {
		return nil, errors.New("proxy.Options.Routes must name at least one bound host")
	}
	if o.BindWait == 0 {
		o.BindWait = DefaultBindWait
	}
	p := &Proxy{routes: map[string]Route{}, resolver: o.Resolver, bindWait: o.BindWait, observer: o.Observer, log: o.Log}
	for _, r := range o.Routes {
		host, err := ca.CanonicalHost(r.Host)
		if err != nil {
			return nil, fmt.Errorf("proxy.Options.Routes: %w", err)
		}
		if _, dup := p.routes[host]; dup {
			return nil, fmt.Errorf("proxy.Options.Routes: %q is routed twice", host)
		}
		r.Host = host
		if r.Address == "" {
			r.Address = net.JoinHostPort(host, "443")
		} else if _, _, err := net.SplitHostPort(r.Address); err != nil {
			return nil, fmt.Errorf("proxy.Options.Routes: %s's address %q: %w", host, r.Address, err)
		}
		p.routes[host] = r
	}
	var reasons []string
	for _, r := range broker.Reasons() {
		reasons = append(reasons, string(r))
	}
	p.refusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kubeclip_broker_refusals_total",
		Help: "Requests the credential broker refused, by reason (" + strings.Join(reasons, ", ") + ").",
	}, []string{"reason"})
	for _, r := range reasons {
		p.refusals.WithLabelValues(r) // every reason is exported from zero
	}
	if o.Registerer != nil {
		if err := o.Registerer.Register(p.refusals); err != nil {
			return nil, fmt.Errorf("registering kubeclip_broker_refusals_total: %w", err)
		}
	}
	p.errLog = stdlog.New(o.Log.With().Str("component", "broker-proxy").Logger(), "", 0)
	p.transport = &http.Transport{
		DialContext:         p.dialUpstream,
		TLSClientConfig:     &tls.Config{RootCAs: o.RootCAs, MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2:   true,
		TLSHandshakeTimeout: 10 * time.Second,
		// Model calls can take minutes to their first header (a long non-streamed
		// completion), so no ResponseHeaderTimeout: the client's own timeout governs.
		ExpectContinueTimeout: time.Second,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		// The meter reads bodies as they are; Accept-Encoding: identity is set on every
		// request, and the transport must not ask for gzip on its own.
		DisableCompression: true,
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite:        p.rewrite,
		Transport:      p.transport,
		FlushInterval:  -1, // every write reaches the client at once: SSE events as they come
		BufferPool:     newBufferPool(),
		ModifyResponse: p.modifyResponse,
		ErrorHandler:   p.upstreamFailed,
		ErrorLog:       p.errLog,
	}
	return p, nil
}

// dialUpstream dials a route's address for its host.
func (p *Proxy) dialUpstream(ctx context.Context, network, addr string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	r, ok := p.routes[host]
	if !ok {
		return nil, fmt.Errorf("kubeclip broker: no route to %s", host) // unreachable: rewrite sets routed hosts only
	}
	var d net.Dialer
	return d.DialContext(ctx, network, r.Address)
}

// forward is what ServeHTTP decided, handed to the ReverseProxy's hooks in the request's
// context.
type forward struct {
	route   Route
	headers http.Header // the credential headers, real values in place of placeholders
	ex      Exchange    // nil without an observer
}

type forwardKey struct{}

func forwardOf(ctx context.Context) *forward {
	f, _ := ctx.Value(forwardKey{}).(*forward)
	return f
}

// ServeHTTP swaps and forwards one request, or refuses it.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	route, reason := p.route(r)
	if reason != "" {
		p.refuse(w, route.Errors, reason)
		return
	}
	headers, res, err := p.swap(r, route.Host, peerOf(r))
	if err != nil {
		reason, _ := broker.RefusalReason(err)
		p.refuse(w, route.Errors, reason)
		return
	}
	f := &forward{route: route, headers: headers}
	if p.observer != nil {
		ex, err := p.observer.Begin(r.Context(), Call{Grant: res.Grant, Host: route.Host, Request: r})
		var rej *Rejection
		switch {
		case errors.As(err, &rej):
			writeRejection(w, route.Errors, rej)
			return
		case err != nil:
			p.log.Error().Err(err).Str("host", route.Host).Msg("the broker's observer failed a call")
			writeError(w, route.Errors, http.StatusInternalServerError, "observer", "kubeclip broker: the call could not be accounted for (details are in the broker's logs)")
			return
		}
		f.ex = ex
	}
	// The transport sends the request body from a goroutine of its own, and after the body's
	// last byte it reads once more to see its end. Before an HTTP/1 server writes the
	// response's header (the upstream answered) it consumes and closes what is left of the
	// request body; when that beats the transport's last read, the read fails ("invalid Read
	// on closed Body"), the transport drops the upstream connection and a stream still
	// running is cut. On loopback under load that cut one held stream in five
	// (TestBrokerReplicaKilledMidStream); full duplex leaves the body to the transport.
	// HTTP/2 is always full duplex: nothing to do, and no error.
	_ = http.NewResponseController(w).EnableFullDuplex()
	p.rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), forwardKey{}, f)))
}

// route is the request's bound host: the TLS server name its connection was made for (the
// handshake refused any other), which its Host must repeat.
func (p *Proxy) route(r *http.Request) (Route, broker.Reason) {
	if r.TLS == nil {
		return Route{}, broker.ReasonMisdirected
	}
	sni, err := ca.CanonicalHost(r.TLS.ServerName)
	if err != nil {
		return Route{}, broker.ReasonMisdirected
	}
	route, ok := p.routes[sni]
	if !ok {
		return Route{}, broker.ReasonMisdirected
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(r.Host); err == nil {
		host = h
	}
	if h, err := ca.CanonicalHost(host); err != nil || h != route.Host {
		return route, broker.ReasonMisdirected
	}
	return route, ""
}

// peerOf is the IP the request's connection came from.
func peerOf(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

// swap resolves every placeholder in the request's credential headers and returns those
// headers with the real values in their place. Values that are no placeholder (another
// scheme's Authorization, a key of the agent's own beside a placeholder) stay as they are; a
// request with no placeholder at all is refused (broker.ReasonMissing), and so is one whose
// placeholders belong to different leases. A placeholder whose grant is not bound to its pod
// yet waits for the binding, up to bindWait (broker.Cache.ResolveWait).
func (p *Proxy) swap(r *http.Request, host string, peer netip.Addr) (http.Header, broker.Resolved, error) {
	out := http.Header{}
	var first broker.Resolved
	found := false
	for _, h := range broker.Headers() {
		name := http.CanonicalHeaderKey(string(h))
		values := r.Header[name]
		if len(values) == 0 {
			continue
		}
		swapped := make([]string, len(values))
		for i, v := range values {
			swapped[i] = v
			cred, ok := h.Credential(v)
			if !ok || !broker.LooksLikePlaceholder(cred) {
				continue
			}
			res, err := p.resolver.ResolveWait(r.Context(), p.bindWait, cred, host, h, peer)
			if err != nil {
				return nil, broker.Resolved{}, err
			}
			if !found {
				first, found = res, true
			} else if res.Grant.Company != first.Grant.Company || res.Grant.Lease != first.Grant.Lease {
				return nil, broker.Resolved{}, &broker.RefusedError{Reason: broker.ReasonMixed}
			}
			swapped[i] = h.WithCredential(res.Value.Reveal())
		}
		out[name] = swapped
	}
	if !found {
		return nil, broker.Resolved{}, &broker.RefusedError{Reason: broker.ReasonMissing}
	}
	return out, first, nil
}

// rewrite makes the upstream request: the bound host, the real values, identity encoding.
// Rewrite (rather than Director) has already dropped the hop-by-hop headers and every
// Forwarded and X-Forwarded-* header, and sets none: the upstream learns nothing of the pod.
func (p *Proxy) rewrite(pr *httputil.ProxyRequest) {
	f := forwardOf(pr.In.Context())
	pr.Out.URL.Scheme = "https"
	pr.Out.URL.Host = f.route.Host
	pr.Out.Host = f.route.Host
	for name, values := range f.headers {
		pr.Out.Header[name] = values
	}
	pr.Out.Header.Set("Accept-Encoding", "identity") // the meter reads the body as it is
}

// modifyResponse hands the response to the call's Exchange: its status and headers, then its
// body as the client reads it.
func (p *Proxy) modifyResponse(resp *http.Response) error {
	f := forwardOf(resp.Request.Context())
	if f == nil || f.ex == nil {
		return nil
	}
	f.ex.Response(resp.StatusCode, resp.Header)
	if resp.StatusCode == http.StatusSwitchingProtocols {
		// An upgraded connection (a WebSocket) is tunnelled as it is: the proxy needs its
		// body to stay the connection, and an observer sees only that it began.
		f.ex.End(nil)
		return nil
	}
	resp.Body = &teeBody{body: resp.Body, ex: f.ex}
	return nil
}

// upstreamFailed answers a call the upstream did not answer: 502 in the API's shape (the
// transport's error, which names the host and never a header, goes to the log).
func (p *Proxy) upstreamFailed(w http.ResponseWriter, r *http.Request, err error) {
	f := forwardOf(r.Context())
	if f == nil { // unreachable: ServeHTTP always sets it
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	if f.ex != nil {
		f.ex.End(err)
	}
	if r.Context().Err() != nil {
		return // the client went away; nobody reads an answer
	}
	p.log.Warn().Err(err).Str("host", f.route.Host).Msg("the bound host's upstream failed a call")
	writeError(w, f.route.Errors, http.StatusBadGateway, "upstream", "kubeclip broker: "+f.route.Host+" could not be reached")
}

// refuse answers a refusal and counts it.
func (p *Proxy) refuse(w http.ResponseWriter, format ErrorFormat, reason broker.Reason) {
	if reason == "" {
		reason = broker.ReasonUnavailable // unreachable: every refusal has a reason
	}
	p.refusals.WithLabelValues(string(reason)).Inc()
	writeError(w, format, reason.Status(), string(reason), reason.Message())
}

func writeError(w http.ResponseWriter, format ErrorFormat, status int, code, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(format.errorBody(status, code, message))
}

// writeRejection answers an observer's rejection: its status and message in the API's shape,
// with when to retry.
func writeRejection(w http.ResponseWriter, format ErrorFormat, rej *Rejection) {
	if rej.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.FormatInt(int64((rej.RetryAfter+time.Second-1)/time.Second), 10))
		w.Header().Set("Retry-After-Ms", strconv.FormatInt(int64((rej.RetryAfter+time.Millisecond-1)/time.Millisecond), 10))
	}
	openAIType := ""
	if rej.Status == http.StatusTooManyRequests {
		openAIType = openAIRateLimit
	}
	if rej.Quota {
		openAIType = openAIQuota
		w.Header().Set("X-Should-Retry", "false")
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(rej.Status)
	_, _ = w.Write(format.errorBodyAs(rej.Status, "budget", rej.Message, openAIType))
}

// DefaultDrainTimeout is how long Serve waits for calls in flight once its context ends. A
// streamed completion can run for minutes; those still running after it are cut, and their
// agents retry against another replica.
const DefaultDrainTimeout = 30 * time.Second

// Serve answers TLS connections on ln, with certificates from certs (a host it refuses fails
// the handshake), until ctx ends; then it stops accepting, waits up to DefaultDrainTimeout for
// the calls in flight, and closes the rest. It returns nil after a shutdown ctx asked for.
func (p *Proxy) Serve(ctx context.Context, ln net.Listener, certs Certificates) error {
	srv := &http.Server{
		Handler: p,
		TLSConfig: &tls.Config{
			GetCertificate: certs.GetCertificate,
			MinVersion:     tls.VersionTLS12,
			NextProtos:     []string{"h2", "http/1.1"},
		},
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		// No ReadTimeout or WriteTimeout: a request body or a streamed response may take
		// minutes, and a deadline would cut them mid-stream.
		ErrorLog: p.errLog,
	}
	served := make(chan error, 1)
	go func() { served <- srv.ServeTLS(ln, "", "") }()
	defer p.transport.CloseIdleConnections()
	select {
	case err := <-served:
		return fmt.Errorf("serving the broker proxy: %w", err)
	case <-ctx.Done():
	}
	drain, cancel := context.WithTimeout(context.WithoutCancel(ctx), DefaultDrainTimeout)
	defer cancel()
	if err := srv.Shutdown(drain); err != nil {
		_ = srv.Close()
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving the broker proxy: %w", err)
	}
	return nil
}
