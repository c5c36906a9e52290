package natstest

import (
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// ShippedAuthConf is the accounts, users and permissions file kubeclip ships, from the module
// root: the workers' users in KUBECLIP (which holds JetStream), paperclip and cli in CLIENTS,
// status in STATUS, each client account importing what it uses (docs/security.md, NATS accounts, users, inboxes and replies).
const ShippedAuthConf = "deploy/kustomize/base/nats-auth.conf"

// authPasswordVars are the shipped users' password variables (KUBECLIP_NATS_PASSWORD_<var>).
func authPasswordVars() map[string]string {
	return map[string]string{"kubeclip": "WORKERS", "exec-worker": "EXEC_WORKER", "broker": "BROKER", "paperclip": "PAPERCLIP", "cli": "CLI", "status": "STATUS"}
}

// SetAuthPasswords puts a test password for each shipped user into the environment, where
// nats-auth.conf reads them, as a deployment does.
func SetAuthPasswords(t *testing.T) {
	for _, v := range authPasswordVars() {
		t.Setenv("KUBECLIP_NATS_PASSWORD_"+v, "pw-"+strings.ToLower(v))
	}
}

// StartWithAuth runs a JetStream server loaded with the accounts, users and permissions file at
// conf (ShippedAuthConf, relative to the test's package), the test passwords set; Cleanup shuts
// it down.
func StartWithAuth(t *testing.T, conf string) *server.Server {
	t.Helper()
	SetAuthPasswords(t)
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("natstest: loading %s: %v", conf, err)
	}
	opts.Host, opts.Port, opts.NoLog, opts.NoSigs = "127.0.0.1", -1, true, true
	opts.JetStream, opts.StoreDir = true, t.TempDir()
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("natstest: configuring nats-server: %v", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(readyTimeout) {
		t.Fatalf("natstest: nats-server not ready after %s", readyTimeout)
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	return srv
}

// User is the connection option of a shipped user with its test password.
func User(name string) nats.Option {
	return nats.UserInfo(name, "pw-"+strings.ToLower(authPasswordVars()[name]))
}
