package app_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubeclip/kubeclip/internal/app"
	"github.com/kubeclip/kubeclip/internal/config"
	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/events"
)

// shippedAuthConf is the users and permissions file kubeclip ships.
const shippedAuthConf = "../../" + natstest.ShippedAuthConf

// workerUsers are the NATS users the workers connect as (nats-auth.conf).
var workerUsers = map[string]struct{ user, password string }{
	"tenant-worker": {"kubeclip", "pw-workers"},
	"dispatcher":    {"kubeclip", "pw-workers"},
	"run-watcher":   {"kubeclip", "pw-workers"},
	"exec-worker":   {"exec-worker", "pw-exec_worker"},
	// NATS only: it has no Kubernetes client (CheckNATSPermissions).
	"credential-broker": {"broker", "pw-broker"},
}

// workerCommon is the common settings of worker connecting to url as its user, the rest
// defaults, as a worker started with only those in its environment has them.
func workerCommon(t *testing.T, worker, url string) *app.Common {
	t.Helper()
	u := workerUsers[worker]
	env := map[string]string{"KUBECLIP_NATS_URL": url, "KUBECLIP_NATS_USER": u.user, "KUBECLIP_NATS_PASSWORD": u.password}
	var c app.Common
	fs := config.New(worker, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	c.Bind(fs)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	return &c
}

// natsVerdicts probes worker's NATS needs against url and returns the names of those missing;
// a probe that cannot tell fails the test.
func natsVerdicts(t *testing.T, worker, url string) (missing []string, all int) {
	t.Helper()
	c := workerCommon(t, worker, url)
	subjects, err := c.Subjects()
	if err != nil {
		t.Fatal(err)
	}
	probes := c.NATSProbes(worker)
	defer probes.Close()
	perms := c.NATSPermissions(worker, subjects, probes)
	for _, p := range perms {
		granted, err := p.Probe(t.Context())
		if err != nil {
			t.Errorf("%s: probing %s: %v", worker, p.Name, err)
			continue
		}
		if !granted {
			missing = append(missing, p.Name)
		}
	}
	return missing, len(perms)
}

// TestNATSSelfCheckPassesWithShippedUsers: every worker, on its user of nats-auth.conf as
// shipped, holds every NATS permission its self-check asks about, so a default installation
// becomes ready.
func TestNATSSelfCheckPassesWithShippedUsers(t *testing.T) {
	srv := natstest.StartWithAuth(t, shippedAuthConf)
	for worker := range workerUsers {
		t.Run(worker, func(t *testing.T) {
			missing, n := natsVerdicts(t, worker, srv.ClientURL())
			if len(missing) > 0 {
				t.Errorf("%s lacks %v with the shipped users", worker, missing)
			}
			if n < 4 {
				t.Errorf("%s has %d NATS needs, want its subscriptions, the clients' inboxes and its streams", worker, n)
			}
		})
	}
}

// TestNATSSelfCheckNamesWhatAUserLacks: with one subscription and one JetStream API subject taken
// from the workers' user, the tenant-worker's probes find exactly those two missing (an answer,
// not a timeout) and every other need held.
func TestNATSSelfCheckNamesWhatAUserLacks(t *testing.T) {
	shipped, err := os.ReadFile(shippedAuthConf)
	if err != nil {
		t.Fatal(err)
	}
	conf := string(shipped)
	for _, cut := range []string{`"paperclip.api.validate", `, `"$JS.API.CONSUMER.INFO.*.*", `} {
		if !strings.Contains(conf, cut) {
			t.Fatalf("nats-auth.conf has no %s any more: update this test", cut)
		}
		conf = strings.Replace(conf, cut, "", 1)
	}
	path := filepath.Join(t.TempDir(), "nats-auth.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := natstest.StartWithAuth(t, path)
	s, err := events.NewSubjects("paperclip")
	if err != nil {
		t.Fatal(err)
	}
	missing, _ := natsVerdicts(t, "tenant-worker", srv.ClientURL())
	want := []string{
		"subscribe paperclip.api.validate",
		"publish $JS.API.CONSUMER.INFO." + s.LeaseStream() + ".tenant-worker",
		"publish $JS.API.CONSUMER.INFO.KUBECLIP_RETRY.tenant-worker-retry",
	}
	if strings.Join(missing, "\n") != strings.Join(want, "\n") {
		t.Errorf("missing:\n%s\nwant:\n%s", strings.Join(missing, "\n"), strings.Join(want, "\n"))
	}
}
