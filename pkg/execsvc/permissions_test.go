package execsvc_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/execclient"
	"github.com/kubeclip/kubeclip/pkg/execproto"
	"github.com/kubeclip/kubeclip/pkg/execsvc"
	"github.com/kubeclip/kubeclip/pkg/inbox"
)

// natsAuthConf is the users and permissions file kubeclip ships.
const natsAuthConf = "../../" + natstest.ShippedAuthConf

func authServer(t *testing.T) *server.Server { return natstest.StartWithAuth(t, natsAuthConf) }

func user(name string) nats.Option { return natstest.User(name) }

// TestPermissions runs an exec through a server loaded with the shipped permissions, the
// exec-worker and Paperclip each with its own user, and checks that no other user can send exec
// requests or listen to exec subjects.
func TestPermissions(t *testing.T) {
	srv := authServer(t)
	e := newEnvOn(t, srv, roles{harness: []nats.Option{user("kubeclip"), nats.CustomInboxPrefix(inbox.WorkersPrefix)}, replica: []nats.Option{user("exec-worker"), nats.CustomInboxPrefix(inbox.ExecWorkerPrefix)}, client: []nats.Option{user("paperclip"), nats.CustomInboxPrefix(inbox.PaperclipPrefix)}}, 1)
	l := e.newLease(newID("co"))

	t.Run("exec with stdin, recorded", func(t *testing.T) {
		res := e.run(l, execclient.Exec{Command: "sh", Args: []string{"-c", "cat; echo done >&2"}, Stdin: strings.NewReader("in\n"), StdinBytes: 3, Record: true})
		if string(res.Stdout) != "in\n" || string(res.Stderr) != "done\n" || res.ExitCode == nil || *res.ExitCode != 0 {
			t.Fatalf("result %+v", res)
		}
		if evs := execEvents(t, e.js, e.subjects, l); len(evs) == 0 || evs[len(evs)-1].Exit == nil {
			t.Errorf("recorded events: %d, want the chunks and an exit", len(evs))
		}
		// The exec-worker's user may purge the ended exec's entry (read as that user: the
		// workers' may not read the bucket).
		_, js := connect(t, srv, user("exec-worker"), nats.CustomInboxPrefix(inbox.ExecWorkerPrefix))
		kv, err := js.KeyValue(t.Context(), execsvc.RecordedBucket)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Get(t.Context(), l.ref.Key()+"."+res.ExecID); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Errorf("the ended exec's %s entry: %v, want it purged", execsvc.RecordedBucket, err)
		}
	})
	t.Run("the CLI's user too", func(t *testing.T) {
		nc, _ := connect(t, srv, user("cli"), nats.CustomInboxPrefix(inbox.CLIPrefix))
		c, err := execclient.New(execclient.Options{NATS: nc})
		if err != nil {
			t.Fatal(err)
		}
		x := execclient.Exec{Lease: l.Lease, Command: "echo", Args: []string{"cli"}}
		if res, err := c.Run(t.Context(), x); err != nil || string(res.Stdout) != "cli\n" {
			t.Errorf("got %q, %v", res.Stdout, err)
		}
	})

	subj, _ := execproto.NewSubjects(e.subjects).Request(l.CompanyID, l.RunID, execproto.OpStart)
	start := []byte(`{"execId":"perm1","providerLeaseId":"` + l.ProviderLeaseID + `","command":"touch","args":["` + l.daemon.dir + `/ran"]}`)
	for _, who := range []string{"kubeclip", "exec-worker"} {
		t.Run(who+" cannot send exec requests", func(t *testing.T) {
			nc, errs := violations(t, srv, who)
			if err := nc.PublishRequest(subj, nc.NewRespInbox(), start); err != nil {
				t.Fatal(err)
			}
			waitViolation(t, errs, "Publish", subj)
		})
	}
	for _, who := range []string{"kubeclip", "paperclip", "cli"} {
		t.Run(who+" cannot listen to exec subjects", func(t *testing.T) {
			nc, errs := violations(t, srv, who)
			if _, err := nc.QueueSubscribe("paperclip.exec.*.*.start", execproto.QueueGroup, func(*nats.Msg) {}); err != nil {
				t.Fatal(err)
			}
			waitViolation(t, errs, "Subscription", "paperclip.exec.*.*.start")
			if _, err := nc.Subscribe("paperclip.exec.>", func(*nats.Msg) {}); err != nil {
				t.Fatal(err)
			}
			waitViolation(t, errs, "Subscription", "paperclip.exec.>")
		})
	}
	t.Run("paperclip cannot publish run events", func(t *testing.T) {
		nc, errs := violations(t, srv, "paperclip")
		_ = nc.Publish("paperclip.run."+l.CompanyID+"."+l.RunID+".result", []byte(`{}`))
		waitViolation(t, errs, "Publish", "paperclip.run.")
	})
	t.Run("no user, no connection", func(t *testing.T) {
		if nc, err := nats.Connect(srv.ClientURL()); err == nil {
			nc.Close()
			t.Error("connected without credentials")
		}
	})
	if res := e.run(l, execclient.Exec{Command: "ls", Args: []string{l.daemon.dir}}); bytes.Contains(res.Stdout, []byte("ran")) {
		t.Error("a refused request ran its command")
	}
}

// violations connects as who and collects the permission violations the server reports.
func violations(t *testing.T, srv *server.Server, who string) (*nats.Conn, <-chan error) {
	t.Helper()
	errs := make(chan error, 16)
	nc, _ := connect(t, srv, user(who), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case errs <- err:
		default:
		}
	}))
	return nc, errs
}

// waitViolation waits for the server's permission violation of kind (Publish, Subscription) on a
// subject starting with subject.
func waitViolation(t *testing.T, errs <-chan error, kind, subject string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case err := <-errs:
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), kind) && strings.Contains(err.Error(), subject) {
				return
			}
		case <-timeout:
			t.Fatalf("no %s permission violation for %s", kind, subject)
		}
	}
}
