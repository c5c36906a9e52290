package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"k8s.io/client-go/rest"
)

// apiProxy counts the workers' requests to the API server. The workers' kubeconfig points at it
// (loopback, no credentials); it forwards every request with the bench's own credentials and
// counts it by verb (a GET with watch=true is a WATCH, a GET of a collection is
// not told apart from a GET of an object), with the time each took (a WATCH's is its whole life:
// not summed). The API server's own apiserver_request_total cannot tell kubeclip's requests from
// the scheduler's, kwok's and the controllers'.
//
// It serves TLS, with a certificate of the cluster's CA for 127.0.0.1, as the API server does:
// client-go then speaks HTTP/2 to it and multiplexes a worker's requests, long ones included,
// over a few connections, as it would to the API server. Over plain HTTP client-go speaks
// HTTP/1.1, one connection per request in flight: every Job lease's log follow held a connection
// in the run-watcher and one in the bench, 10,500 each at the 10,000 job size, which with the
// log server's 10,500 passed the bench's open-file limit (20,000 on this machine, not raisable
// without CAP_SYS_RESOURCE) and inflated the run-watcher's RSS per lease.
type apiProxy struct {
	srv *http.Server
	ln  net.Listener
	// caFile is the CA that issued the proxy's certificate, for the workers' kubeconfig.
	caFile string

	mu     sync.Mutex
	counts map[string]int64
	// took sums the time of the requests of each verb but WATCH.
	took map[string]time.Duration
}

// startAPIProxy forwards to cfg's API server and serves TLS with a certificate issued by the CA
// in pkiDir (ca.crt, ca.key).
func startAPIProxy(cfg *rest.Config, pkiDir string) (*apiProxy, error) {
	cert, err := servingCert(pkiDir)
	if err != nil {
		return nil, err
	}
	target, err := url.Parse(cfg.Host)
	if err != nil {
		return nil, fmt.Errorf("parsing the API server address %q: %w", cfg.Host, err)
	}
	transport, err := rest.TransportFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("building the API server transport: %w", err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = transport
	rp.FlushInterval = -1 // watches stream
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &apiProxy{ln: ln, caFile: filepath.Join(pkiDir, "ca.crt"), counts: map[string]int64{}, took: map[string]time.Duration{}}
	p.srv = &http.Server{TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		verb := r.Method
		if verb == http.MethodGet && r.URL.Query().Get("watch") == "true" {
			verb = "WATCH"
		}
		// Counted before it is served: a client may have the whole answer before ServeHTTP
		// returns.
		p.mu.Lock()
		p.counts[verb]++
		p.mu.Unlock()
		start := time.Now()
		rp.ServeHTTP(w, r)
		if verb != "WATCH" {
			p.mu.Lock()
			p.took[verb] += time.Since(start)
			p.mu.Unlock()
		}
	})}
	// ServeTLS offers HTTP/2 (ALPN h2) beside HTTP/1.1.
	go func() { _ = p.srv.ServeTLS(ln, "", "") }()
	return p, nil
}

// writeKubeconfig writes a kubeconfig naming the proxy into dir and returns its path.
func (p *apiProxy) writeKubeconfig(dir string) (string, error) {
	path := filepath.Join(dir, "proxy.kubeconfig")
	data := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: proxy
  cluster: {server: "https://%s", certificate-authority: %q}
users:
- name: bench
  user: {}
contexts:
- name: proxy
  context: {cluster: proxy, user: bench}
current-context: proxy
`, p.ln.Addr(), p.caFile)
	return path, os.WriteFile(path, []byte(data), 0o600)
}

// snapshot returns the counts so far.
func (p *apiProxy) snapshot() apiCounts {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := apiCounts{}
	for k, v := range p.counts {
		out[k] = v
	}
	return out
}

// meanMs returns each verb's mean request time in ms since before (taken by snapshotTook).
func (p *apiProxy) meanMs(before apiCounts, beforeTook map[string]time.Duration) map[string]float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]float64{}
	for verb, took := range p.took {
		if n := p.counts[verb] - before[verb]; n > 0 {
			out[verb] = round(float64((took - beforeTook[verb]).Microseconds()) / 1000 / float64(n))
		}
	}
	return out
}

// snapshotTook returns the summed request times so far.
func (p *apiProxy) snapshotTook() map[string]time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]time.Duration{}
	for k, v := range p.took {
		out[k] = v
	}
	return out
}

func (p *apiProxy) close() error {
	if err := p.srv.Close(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// apiCounts is requests per verb.
type apiCounts map[string]int64

// since returns c − before.
func (c apiCounts) since(before apiCounts) apiCounts {
	out := apiCounts{}
	for k, v := range c {
		if d := v - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

func (c apiCounts) total() int64 {
	var n int64
	for _, v := range c {
		n += v
	}
	return n
}

// String is "GET 12, POST 3, ..." in verb order.
func (c apiCounts) String() string {
	verbs := make([]string, 0, len(c))
	for k := range c {
		verbs = append(verbs, k)
	}
	sort.Strings(verbs)
	s := ""
	for i, k := range verbs {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%s %d", k, c[k])
	}
	return s
}
