package sandboxd

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"net"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kubeclip/kubeclip/pkg/execspec"
)

func TestKeys(t *testing.T) {
	master := []byte("0123456789abcdef0123456789abcdef")
	// Vectors computed outside Go (Python's hmac, OpenSSL for the ed25519 public key): the
	// dispatcher, the exec-worker and sandboxd must derive the same keys across releases.
	for _, tc := range []struct {
		name, ns, workload string
		want               []string // seed, token, server public key (hex)
	}{
		{"lease", "tenant-a", "run-1", []string{
			"4d3e4f03f6d58fba21b6d8ce3d677089f159d9adb8e2af341188c4ee319bdf52",
			"52949208575185c8b74688b71c2d42c996412e2d661d043b8f44c6c57a11a008",
			"817f8a3abbfd09270574417802868c0aa6b25bb2e946eb7e0e07c61c2c737c3d",
		}},
		{"name boundary moved", "tenant-ab", "run-1", []string{
			"dfdec3267830f2527e120f38a4cbec53d71110a98666444c0c6d3bdb5fadd62f",
			"7c240290f21aaaad8069d144ca6b640708248717167e1e278c78f465d018c941",
			"3a302276e61f7f24a3f748d1a26997e164f33b10e0a02042086bb05dc3796fa0",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seed := execspec.DeriveSeed(master, tc.ns, tc.workload)
			got := []string{hex.EncodeToString(seed), ClientToken(seed), hex.EncodeToString(ServerPublicKey(seed))}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("keys (-want +got):\n%s", diff)
			}
			parsed, err := execspec.ParseSeed(got[0])
			if err != nil || !bytes.Equal(parsed, seed) {
				t.Errorf("execspec.ParseSeed(hex(seed)) = %x, %v", parsed, err)
			}
		})
	}
}

func TestParseSeedRejects(t *testing.T) {
	for _, s := range []string{"", "zz", hex.EncodeToString(make([]byte, 16))} {
		if _, err := execspec.ParseSeed(s); err == nil {
			t.Errorf("execspec.ParseSeed(%q) succeeded", s)
		}
	}
}

// TestPinnedHandshake: a client pinned to a lease's key completes the handshake with that
// lease's server (TLS 1.3) and fails with ErrServerKeyMismatch against any other.
func TestPinnedHandshake(t *testing.T) {
	seed := execspec.DeriveSeed([]byte("master"), "ns", "a")
	other := execspec.DeriveSeed([]byte("master"), "ns", "b")
	srvCfg, err := ServerTLSConfig(seed)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		client  *tls.Config
		wantErr error
	}{
		{"same lease", ClientTLSConfig(seed), nil},
		{"other lease", ClientTLSConfig(other), ErrServerKeyMismatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, s := net.Pipe()
			defer c.Close()
			defer s.Close()
			srvErr := make(chan error, 1)
			go func() { srvErr <- tls.Server(s, srvCfg).HandshakeContext(t.Context()) }()
			tc2 := tls.Client(c, tc.client)
			err := tc2.HandshakeContext(context.Background())
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("handshake error = %v, want %v", err, tc.wantErr)
			}
			if err == nil {
				if v := tc2.ConnectionState().Version; v != tls.VersionTLS13 {
					t.Errorf("TLS version %x, want 1.3", v)
				}
			}
			_ = c.Close()
			if err := <-srvErr; (err == nil) != (tc.wantErr == nil) {
				t.Errorf("server handshake error = %v; want one only when the client refused", err)
			}
		})
	}
}
