package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/kubeclip/kubeclip/internal/app"
	"github.com/kubeclip/kubeclip/internal/config"
	"github.com/kubeclip/kubeclip/pkg/broker/ca"
)

const caSummary = "credential-broker ca makes a new installation CA, name-constrained to the bound hosts (those of --bindings, or the built-in ones, and every --host), and writes its certificate and key to new files (hack/deploy/secrets.sh puts them into the Secret kubeclip-broker)."

// runCA is `credential-broker ca`: the installation CA made by ca.Generate, the one place its
// name constraints are decided, rather than by openssl with constraints spelled a second time.
// It reads the same --bindings as the broker, so by default the CA covers exactly the hosts the
// broker checks it against at start. It never overwrites a file: a CA replaced by accident
// would leave every brokered pod trusting a certificate whose key is gone.
func runCA(args []string, lookupEnv config.LookupEnv, stdout, stderr io.Writer) error {
	var (
		bindingsPath, outCert, outKey string
		extra                         []string
		validity                      time.Duration
	)
	fs := config.New(component+" ca", lookupEnv)
	fs.String(&bindingsPath, "bindings", "KUBECLIP_BROKER_BINDINGS", "", "JSON file of the brokered keys (as the broker reads it); the CA covers every host it binds; empty: the built-in bindings' hosts")
	fs.Strings(&extra, "host", "", "KUBECLIP_BROKER_CA_HOSTS", "a host the CA covers besides the bindings' (one planned for a later bindings file)")
	fs.String(&outCert, "out-cert", "KUBECLIP_BROKER_CA_OUT_CERT", "", "new file for the CA's certificate (PEM); required, must not exist")
	fs.String(&outKey, "out-key", "KUBECLIP_BROKER_CA_OUT_KEY", "", "new file for the CA's key (PKCS #8 PEM, mode 0600); required, must not exist")
	fs.Duration(&validity, "validity", "KUBECLIP_BROKER_CA_VALIDITY", ca.DefaultValidity, "how long the CA lives")
	if err := fs.Parse(args); err != nil {
		fs.Usage(stdout, caSummary)
		return app.Usage(err)
	}
	var errs []error
	if outCert == "" {
		errs = append(errs, fmt.Errorf("%s is required", fs.Names("out-cert")))
	}
	if outKey == "" {
		errs = append(errs, fmt.Errorf("%s is required", fs.Names("out-key")))
	}
	if outCert != "" && outCert == outKey {
		errs = append(errs, fmt.Errorf("%s and %s must be different files", fs.Names("out-cert"), fs.Names("out-key")))
	}
	if validity <= 0 {
		errs = append(errs, fmt.Errorf("%s must be positive, got %s", fs.Names("validity"), validity))
	}
	if err := errors.Join(errs...); err != nil {
		return &app.UsageError{Err: err}
	}
	b, err := loadBindings(bindingsPath)
	if err != nil {
		return &app.UsageError{Err: fmt.Errorf("%s: %w", fs.Names("bindings"), err)}
	}
	hosts := append(b.hosts(), extra...)
	for _, h := range extra {
		if _, err := ca.CanonicalHost(h); err != nil {
			return &app.UsageError{Err: fmt.Errorf("%s: %w", fs.Names("host"), err)}
		}
	}
	authority, err := ca.Generate(ca.Options{Hosts: hosts, Validity: validity})
	if err != nil {
		return err
	}
	keyPEM, err := authority.KeyPEM()
	if err != nil {
		return err
	}
	defer clear(keyPEM)
	// The key first: a certificate whose key was never written is worse than no certificate.
	if err := writeNew(outKey, keyPEM, 0o600); err != nil {
		return fmt.Errorf("%s: %w", fs.Names("out-key"), err)
	}
	if err := writeNew(outCert, authority.CertPEM(), 0o644); err != nil {
		os.Remove(outKey)
		return fmt.Errorf("%s: %w", fs.Names("out-cert"), err)
	}
	fmt.Fprintf(stderr, "made an installation CA for %v, valid until %s: certificate %s, key %s\n",
		authority.Hosts(), authority.Certificate().NotAfter.UTC().Format(time.RFC3339), outCert, outKey)
	return nil
}

// writeNew writes data to path, which must not exist yet.
func writeNew(path string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(path)
		return err
	}
	return nil
}
