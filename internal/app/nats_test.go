package app_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	natsservertest "github.com/nats-io/nats-server/v2/test"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/internal/app"
	"github.com/kubeclip/kubeclip/internal/config"
)

// startServer runs a nats-server configured by mod on a random port.
func startServer(t *testing.T, mod func(*server.Options)) *server.Server {
	t.Helper()
	opts := natsservertest.DefaultTestOptions
	opts.Port = -1
	mod(&opts)
	s, err := server.NewServer(&opts)
	if err != nil {
		t.Fatalf("configuring nats-server: %v", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s
}

// parseAuth binds NATSAuth to env and parses no flags, as a worker started with env does.
func parseAuth(t *testing.T, env map[string]string) (app.NATSAuth, error) {
	t.Helper()
	var a app.NATSAuth
	fs := config.New("test", func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	a.Bind(fs)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	return a, a.Validate(fs)
}

// connect connects with the settings in env; the connection must succeed on the first try.
func connect(t *testing.T, url string, env map[string]string) error {
	t.Helper()
	a, err := parseAuth(t, env)
	if err != nil {
		t.Fatalf("validating %v: %v", env, err)
	}
	opts, err := a.Options()
	if err != nil {
		return err
	}
	nc, err := nats.Connect(url, append(opts, nats.Timeout(5*time.Second))...)
	if err != nil {
		return err
	}
	defer nc.Close()
	return nc.Flush()
}

func write(t *testing.T, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestNATSAuthMethods(t *testing.T) {
	userKP, _ := nkeys.CreateUser()
	userSeed, _ := userKP.Seed()
	userPub, _ := userKP.PublicKey()

	tests := []struct {
		name   string
		server func(*server.Options)
		good   map[string]string
		bad    map[string]string
	}{
		{
			name:   "user and password",
			server: func(o *server.Options) { o.Username, o.Password = "kubeclip", "s3cret" },
			good:   map[string]string{"KUBECLIP_NATS_USER": "kubeclip", "KUBECLIP_NATS_PASSWORD": "s3cret"},
			bad:    map[string]string{"KUBECLIP_NATS_USER": "kubeclip", "KUBECLIP_NATS_PASSWORD": "wrong"},
		},
		{
			name:   "token",
			server: func(o *server.Options) { o.Authorization = "t0ken" },
			good:   map[string]string{"KUBECLIP_NATS_TOKEN": "t0ken"},
			bad:    map[string]string{"KUBECLIP_NATS_TOKEN": "nope"},
		},
		{
			name:   "nkey seed file",
			server: func(o *server.Options) { o.Nkeys = []*server.NkeyUser{{Nkey: userPub}} },
			good:   map[string]string{"KUBECLIP_NATS_NKEY": write(t, "user.nk", userSeed)},
			bad:    map[string]string{},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := startServer(t, tc.server)
			if err := connect(t, s.ClientURL(), tc.good); err != nil {
				t.Errorf("connecting with the right credentials: %v", err)
			}
			if err := connect(t, s.ClientURL(), tc.bad); err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization") {
				t.Errorf("connecting with wrong credentials: %v, want an authorization error", err)
			}
		})
	}
}

func TestNATSCredsFile(t *testing.T) {
	okp, _ := nkeys.CreateOperator()
	opub, _ := okp.PublicKey()
	ojwt, err := jwt.NewOperatorClaims(opub).Encode(okp)
	if err != nil {
		t.Fatal(err)
	}
	akp, _ := nkeys.CreateAccount()
	apub, _ := akp.PublicKey()
	ajwt, err := jwt.NewAccountClaims(apub).Encode(okp)
	if err != nil {
		t.Fatal(err)
	}
	ukp, _ := nkeys.CreateUser()
	upub, _ := ukp.PublicKey()
	useed, _ := ukp.Seed()
	ujwt, err := jwt.NewUserClaims(upub).Encode(akp)
	if err != nil {
		t.Fatal(err)
	}
	creds, err := jwt.FormatUserConfig(ujwt, useed)
	if err != nil {
		t.Fatal(err)
	}
	oc, err := jwt.DecodeOperatorClaims(ojwt)
	if err != nil {
		t.Fatal(err)
	}
	resolver := &server.MemAccResolver{}
	s := startServer(t, func(o *server.Options) {
		o.TrustedOperators = []*jwt.OperatorClaims{oc}
		o.AccountResolver = resolver
	})
	if err := resolver.Store(apub, ajwt); err != nil {
		t.Fatal(err)
	}
	if err := connect(t, s.ClientURL(), map[string]string{"KUBECLIP_NATS_CREDS": write(t, "user.creds", creds)}); err != nil {
		t.Errorf("connecting with the credentials file: %v", err)
	}
	if err := connect(t, s.ClientURL(), map[string]string{}); err == nil {
		t.Error("connecting without credentials succeeded")
	}
}

func TestNATSMutualTLS(t *testing.T) {
	ca, caKey := newCA(t)
	srvCert := issue(t, ca, caKey, "nats", x509.ExtKeyUsageServerAuth)
	cliCert := issue(t, ca, caKey, "kubeclip", x509.ExtKeyUsageClientAuth)
	caFile := write(t, "ca.crt", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw}))
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	s := startServer(t, func(o *server.Options) {
		o.TLS, o.TLSVerify = true, true
		o.TLSConfig = &tls.Config{
			Certificates: []tls.Certificate{srvCert.pair}, ClientCAs: pool,
			ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12,
		}
	})
	url := strings.Replace(s.ClientURL(), "nats://", "tls://", 1)
	good := map[string]string{
		"KUBECLIP_NATS_TLS_CA":   caFile,
		"KUBECLIP_NATS_TLS_CERT": write(t, "tls.crt", cliCert.certPEM),
		"KUBECLIP_NATS_TLS_KEY":  write(t, "tls.key", cliCert.keyPEM),
	}
	if err := connect(t, url, good); err != nil {
		t.Errorf("connecting with the client certificate: %v", err)
	}
	if err := connect(t, url, map[string]string{"KUBECLIP_NATS_TLS_CA": caFile}); err == nil {
		t.Error("connecting without a client certificate succeeded")
	}
	if err := connect(t, url, map[string]string{}); err == nil {
		t.Error("connecting without trusting the CA succeeded")
	}
}

func TestNATSAuthValidation(t *testing.T) {
	file := write(t, "f", []byte("x"))
	tests := []struct {
		name    string
		env     map[string]string
		wantErr string
	}{
		{"nothing set", map[string]string{}, ""},
		{"two methods", map[string]string{"KUBECLIP_NATS_TOKEN": "t", "KUBECLIP_NATS_USER": "u"}, "set only one NATS authentication method"},
		{"password without user", map[string]string{"KUBECLIP_NATS_PASSWORD": "p"}, "--nats-password (KUBECLIP_NATS_PASSWORD) needs --nats-user"},
		{"cert without key", map[string]string{"KUBECLIP_NATS_TLS_CERT": file}, "go together"},
		{"missing file", map[string]string{"KUBECLIP_NATS_CREDS": "/nonexistent/creds"}, "--nats-creds (KUBECLIP_NATS_CREDS): stat /nonexistent/creds"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseAuth(t, tc.env)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("Validate() = %v, want nil", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("Validate() = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestWorkerWaitsForNATSWithCredentials(t *testing.T) {
	s := startServer(t, func(o *server.Options) {
		o.JetStream, o.StoreDir = true, t.TempDir()
		o.Username, o.Password = "kubeclip", "s3cret"
	})
	c := app.Common{NATSURL: s.ClientURL(), SubjectPrefix: "paperclip"}
	c.NATS = app.NATSAuth{User: "kubeclip", Password: "s3cret"}
	nc, _, err := c.JetStream(t.Context(), "test", app.Streams{Replicas: 1}, zerolog.New(zerolog.NewTestWriter(t)))
	if err != nil {
		t.Fatalf("JetStream with credentials: %v", err)
	}
	nc.Close()
}

type keyPair struct {
	pair            tls.Certificate
	certPEM, keyPEM []byte
}

func newCA(t *testing.T) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(der)
	return ca, key
}

func issue(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey, cn string, usage x509.ExtKeyUsage) keyPair {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{usage}, KeyUsage: x509.KeyUsageDigitalSignature,
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	kp := keyPair{
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	}
	kp.pair, err = tls.X509KeyPair(kp.certPEM, kp.keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return kp
}

// TestWorkerStartedBeforeNATSWaits: a worker may start before its NATS server (a pod rollout, a
// compose stack); JetStream waits for the first connection instead of failing.
func TestWorkerStartedBeforeNATSWaits(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()

	c := app.Common{NATSURL: fmt.Sprintf("nats://127.0.0.1:%d", port), SubjectPrefix: "paperclip"}
	type result struct {
		nc  *nats.Conn
		err error
	}
	done := make(chan result, 1)
	go func() {
		nc, _, err := c.JetStream(t.Context(), "test", app.Streams{Replicas: 1}, zerolog.New(zerolog.NewTestWriter(t)))
		done <- result{nc, err}
	}()
	select {
	case r := <-done:
		t.Fatalf("JetStream returned (%v) before any server was listening", r.err)
	case <-time.After(500 * time.Millisecond):
	}
	startServer(t, func(o *server.Options) { o.Port, o.JetStream, o.StoreDir = port, true, t.TempDir() })
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatalf("JetStream after the server came up: %v", r.err)
		}
		r.nc.Close()
	case <-time.After(10 * time.Second):
		t.Fatal("JetStream still waiting 10s after the server came up")
	}
}
