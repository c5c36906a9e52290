package app

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/kubeclip/kubeclip/internal/config"
)

// NATSAuth are the NATS authentication and TLS settings. At most one way to authenticate may be
// set: a credentials file (JWT and NKey, decentralised auth), an NKey seed file, a user and
// password, or a token. Secret values (password, token) belong in environment variables from
// a Kubernetes Secret, not on the command line, where ps shows them.
type NATSAuth struct {
	CredsFile    string
	NKeySeedFile string
	User         string
	Password     string
	Token        string
	TLSCA        string
	TLSCert      string
	TLSKey       string
}

// Bind registers the NATS authentication and TLS settings on s.
func (a *NATSAuth) Bind(s *config.Set) {
	s.String(&a.CredsFile, "nats-creds", "KUBECLIP_NATS_CREDS", "", "NATS credentials file (user JWT and NKey seed)")
	s.String(&a.NKeySeedFile, "nats-nkey", "KUBECLIP_NATS_NKEY", "", "file holding a NATS NKey seed (SU...)")
	s.String(&a.User, "nats-user", "KUBECLIP_NATS_USER", "", "NATS user name (with --nats-password)")
	s.String(&a.Password, "nats-password", "KUBECLIP_NATS_PASSWORD", "", "NATS password; prefer the environment variable")
	s.String(&a.Token, "nats-token", "KUBECLIP_NATS_TOKEN", "", "NATS authentication token; prefer the environment variable")
	s.String(&a.TLSCA, "nats-tls-ca", "KUBECLIP_NATS_TLS_CA", "", "PEM file of the CA that signed the NATS server's certificate (enables TLS)")
	s.String(&a.TLSCert, "nats-tls-cert", "KUBECLIP_NATS_TLS_CERT", "", "PEM client certificate for NATS mutual TLS (with --nats-tls-key)")
	s.String(&a.TLSKey, "nats-tls-key", "KUBECLIP_NATS_TLS_KEY", "", "PEM private key of --nats-tls-cert")
}

// Validate checks that the settings are consistent and the files they name are readable.
func (a *NATSAuth) Validate(s *config.Set) error {
	var errs []error
	var methods []string
	if a.CredsFile != "" {
		methods = append(methods, s.Names("nats-creds"))
	}
	if a.NKeySeedFile != "" {
		methods = append(methods, s.Names("nats-nkey"))
	}
	if a.User != "" {
		methods = append(methods, s.Names("nats-user"))
	}
	if a.Token != "" {
		methods = append(methods, s.Names("nats-token"))
	}
	if len(methods) > 1 {
		errs = append(errs, fmt.Errorf("set only one NATS authentication method, got %s", strings.Join(methods, ", ")))
	}
	if a.Password != "" && a.User == "" {
		errs = append(errs, fmt.Errorf("%s needs %s", s.Names("nats-password"), s.Names("nats-user")))
	}
	if (a.TLSCert == "") != (a.TLSKey == "") {
		errs = append(errs, fmt.Errorf("%s and %s go together", s.Names("nats-tls-cert"), s.Names("nats-tls-key")))
	}
	for _, f := range []struct{ name, path string }{
		{"nats-creds", a.CredsFile}, {"nats-nkey", a.NKeySeedFile},
		{"nats-tls-ca", a.TLSCA}, {"nats-tls-cert", a.TLSCert}, {"nats-tls-key", a.TLSKey},
	} {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", s.Names(f.name), err))
		}
	}
	return errors.Join(errs...)
}

// Options returns the nats.Options that apply the settings.
func (a *NATSAuth) Options() ([]nats.Option, error) {
	var opts []nats.Option
	switch {
	case a.CredsFile != "":
		opts = append(opts, nats.UserCredentials(a.CredsFile))
	case a.NKeySeedFile != "":
		opt, err := nats.NkeyOptionFromSeed(a.NKeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("loading the NATS NKey seed: %w", err)
		}
		opts = append(opts, opt)
	case a.User != "":
		opts = append(opts, nats.UserInfo(a.User, a.Password))
	case a.Token != "":
		opts = append(opts, nats.Token(a.Token))
	}
	if a.TLSCA != "" {
		opts = append(opts, nats.RootCAs(a.TLSCA))
	}
	if a.TLSCert != "" {
		opts = append(opts, nats.ClientCert(a.TLSCert, a.TLSKey))
	}
	return opts, nil
}
