package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// agentLog is what every container of a Job lease "prints": a few short lines, so each run's
// follower streams something into the run stream.
var agentLog = []string{"scale: agent started", "scale: working", "scale: still working"}

// logServer stands in for the fake nodes' kubelet, for container logs only: every fake node's
// InternalIP and kubelet port (kwok's --node-ip and --node-port) point at it, so the API server
// forwards a GetLogs of any bench pod here. It answers every container with agentLog, stamped
// with fixed times, honours sinceTime, and holds a follow stream open until the client closes it,
// as a kubelet does for a running container that prints nothing more.
//
// Not kwok's own server (--server-address with a ClusterLogs): kwok v0.8.0 reads a log with
// k8s.io/cri-client's ReadLogs, which at the end of the file of a follow request opens an inotify
// instance and holds it while the stream is open. inotify instances are counted per user
// (fs.inotify.max_user_instances, 128 on this machine, root's shared with the real kubelet,
// containerd and every other test on it): a thousand live Job leases would hold a thousand.
//
// The API server verifies a kubelet's serving certificate against the cluster's CA
// (--kubelet-certificate-authority in hack/cluster/cluster.sh), so the server's certificate is
// issued by that CA, for 127.0.0.1.
type logServer struct {
	srv   *http.Server
	ln    net.Listener
	lines []logLine

	mu     sync.Mutex
	opened int64 // log requests answered
	open   int64 // follow streams open now
}

type logLine struct {
	at   time.Time
	text string
}

// startLogServer listens on 127.0.0.1 with a serving certificate issued by the CA in pkiDir
// (ca.crt, ca.key).
func startLogServer(pkiDir string) (*logServer, error) {
	cert, err := servingCert(pkiDir)
	if err != nil {
		return nil, err
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	if err != nil {
		return nil, err
	}
	s := &logServer{ln: ln}
	stamp := time.Now().UTC().Truncate(time.Second)
	for i, text := range agentLog {
		s.lines = append(s.lines, logLine{at: stamp.Add(time.Duration(i) * 10 * time.Millisecond), text: text})
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /containerLogs/{namespace}/{pod}/{container}", s.serveLogs)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// port is the port kwok gives every fake node as its kubelet endpoint.
func (s *logServer) port() string {
	_, port, _ := net.SplitHostPort(s.ln.Addr().String())
	return port
}

func (s *logServer) serveLogs(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var since time.Time
	if v := q.Get("sinceTime"); v != "" {
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			http.Error(w, "sinceTime: "+err.Error(), http.StatusBadRequest)
			return
		}
		since = t
	}
	follow := q.Get("follow") == "true"
	s.mu.Lock()
	s.opened++
	if follow {
		s.open++
	}
	s.mu.Unlock()
	if follow {
		defer func() { s.mu.Lock(); s.open--; s.mu.Unlock() }()
	}
	w.Header().Set("Content-Type", "text/plain")
	var b strings.Builder
	for _, l := range s.lines {
		if l.at.Before(since) {
			continue
		}
		if q.Get("timestamps") == "true" {
			b.WriteString(l.at.Format(time.RFC3339Nano) + " ")
		}
		b.WriteString(l.text + "\n")
	}
	_, _ = w.Write([]byte(b.String()))
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	if follow {
		<-r.Context().Done()
	}
}

// counts returns the log requests answered so far and the follow streams open now.
func (s *logServer) counts() (opened, open int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.opened, s.open
}

func (s *logServer) close() error {
	// Close, not Shutdown: follow streams stay open until their clients go.
	if err := s.srv.Close(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// servingCert issues a one-day serving certificate for 127.0.0.1 from the CA in pkiDir: the log
// server's and the API proxy's.
func servingCert(pkiDir string) (tls.Certificate, error) {
	caPair, err := tls.LoadX509KeyPair(filepath.Join(pkiDir, "ca.crt"), filepath.Join(pkiDir, "ca.key"))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("loading the cluster CA from %s: %w", pkiDir, err)
	}
	ca, err := x509.ParseCertificate(caPair.Certificate[0])
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("parsing the cluster CA: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "kubeclip-scale"},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caPair.PrivateKey)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("issuing a serving certificate from the cluster CA: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.X509KeyPair(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
}
