package deploy_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/internal/leasetest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/inbox"
)

// checkNATSUsers checks the deployed NATS server's users (nats-auth.conf, passwords from the
// Secret kubeclip-nats-users): a client without credentials or with a wrong password is refused,
// each user gets in with its password, and Paperclip's user cannot put a run event into the run
// stream.
func checkNATSUsers(t *testing.T, url string, passwords map[string]string) {
	t.Helper()
	if nc, err := nats.Connect(url, nats.NoReconnect()); !errors.Is(err, nats.ErrAuthorization) {
		if err == nil {
			nc.Close()
		}
		t.Errorf("connecting without credentials: %v, want %v", err, nats.ErrAuthorization)
	}
	if nc, err := nats.Connect(url, nats.NoReconnect(), nats.UserInfo("paperclip", passwords["cli"])); !errors.Is(err, nats.ErrAuthorization) {
		if err == nil {
			nc.Close()
		}
		t.Errorf("connecting as paperclip with the cli's password: %v, want %v", err, nats.ErrAuthorization)
	}
	for _, u := range natsUsers {
		nc, err := nats.Connect(url, nats.NoReconnect(), nats.UserInfo(u, passwords[u]))
		if err != nil {
			t.Errorf("connecting as %s with its password: %v", u, err)
			continue
		}
		nc.Close()
	}

	// Paperclip publishes a result for a run: the server refuses it and the stream holds none.
	violations := make(chan error, 16)
	nc, err := nats.Connect(url, nats.UserInfo("paperclip", passwords["paperclip"]), nats.CustomInboxPrefix(inbox.PaperclipPrefix),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case violations <- err:
			default:
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	subjects, err := events.NewSubjects("")
	if err != nil {
		t.Fatal(err)
	}
	subject, err := subjects.Run(leasetest.NewID("co"), leasetest.NewID("run"), events.KindResult)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish(subject, []byte(`{"outcome":"succeeded"}`)); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// Nor may it read the CLI's inbox (exec output, stdin) or delete the workers' consumer.
	if _, err := nc.SubscribeSync(inbox.CLIPrefix + ".>"); err != nil {
		t.Fatal(err)
	}
	deleteConsumer := "$JS.API.CONSUMER.DELETE." + subjects.LeaseStream() + "." + events.TenantWorkerConsumer
	if err := nc.Publish(deleteConsumer, nil); err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"Publish to \"" + subject + "\"": true, "Subscription to \"" + inbox.CLIPrefix + ".>\"": true, "Publish to \"" + deleteConsumer + "\"": true}
	timeout := time.After(10 * time.Second)
	for len(want) > 0 {
		select {
		case err := <-violations:
			for w := range want {
				if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), w) {
					delete(want, w)
				}
			}
		case <-timeout:
			t.Fatalf("as paperclip: no permission violation for %v", want)
		}
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	stream, err := js.Stream(ctx, subjects.RunStream())
	if err != nil {
		t.Fatalf("reading stream %s as paperclip: %v", subjects.RunStream(), err)
	}
	if m, err := stream.GetLastMsgForSubject(ctx, subject); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("the run stream's last message on %s: %v (%v), want none", subject, m, err)
	}
}
