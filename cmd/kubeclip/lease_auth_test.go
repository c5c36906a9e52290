package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/internal/app"
	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/inbox"
	"github.com/kubeclip/kubeclip/pkg/lease"
)

// installation is a JetStream server with the shipped users and permissions, the streams and
// buckets as the workers create them, and the workers' connection.
type installation struct {
	url string
	js  jetstream.JetStream
	pub *events.Publisher
	// answeredSeq is the lease stream sequence of the last resume request answerNextResume took.
	answeredSeq uint64
}

func install(t *testing.T) *installation {
	t.Helper()
	srv := natstest.StartWithAuth(t, "../../"+natstest.ShippedAuthConf)
	nc, err := nats.Connect(srv.ClientURL(), natstest.User("kubeclip"), nats.CustomInboxPrefix(inbox.WorkersPrefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := events.EnsureStreams(t.Context(), js, events.Options{}); err != nil {
		t.Fatal(err)
	}
	if err := lease.EnsureBuckets(t.Context(), js, lease.BucketOptions{}); err != nil {
		t.Fatal(err)
	}
	pub, err := events.NewPublisher(events.PublisherOptions{JS: js})
	if err != nil {
		t.Fatal(err)
	}
	return &installation{url: srv.ClientURL(), js: js, pub: pub}
}

func (in *installation) publish(t *testing.T, evs ...events.Event) {
	t.Helper()
	for _, ev := range evs {
		if _, err := in.pub.Publish(t.Context(), ev); err != nil {
			t.Fatalf("publishing %T: %v", ev, err)
		}
	}
}

// kubeclip runs the CLI as NATS user user against in and returns its output and error.
func (in *installation) kubeclip(ctx context.Context, user string, args ...string) (string, error) {
	env := map[string]string{"KUBECLIP_NATS_URL": in.url, "KUBECLIP_NATS_USER": user, "KUBECLIP_NATS_PASSWORD": "pw-" + user}
	var out bytes.Buffer
	err := run(ctx, args, func(k string) (string, bool) { v, ok := env[k]; return v, ok }, &out, &out)
	return out.String(), err
}

// TestLeaseShowAsTheCLIUser runs `kubeclip lease show` as the shipped cli user: it reads the
// lease record and the run's events (tests/natsauth: Paperclip's user reads no bucket).
func TestLeaseShowAsTheCLIUser(t *testing.T) {
	in := install(t)
	ctx := t.Context()
	now := time.Now().UTC()
	kv, err := in.js.KeyValue(ctx, lease.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := (lease.Records{KV: kv}).Create(ctx, lease.Record{
		RunID: "r1", CompanyID: "acme", State: lease.StateRetained, Namespace: "paperclip-acme", WorkloadName: "pc-1",
		Backend: "pod", CreatedAt: now, Reusable: true, VolumeClaim: "pc-1-data", RetainedAt: &now,
	}); err != nil {
		t.Fatal(err)
	}
	in.publish(t,
		events.RunCreatedEvent{RunID: "r1", CompanyID: "acme", ProviderLeaseID: "pc-1", Namespace: "paperclip-acme", WorkloadName: "pc-1", Backend: "pod", Phase: events.PhasePending},
		events.RunReleasedEvent{RunID: "r1", CompanyID: "acme", ProviderLeaseID: "pc-1", State: events.ReleaseStopped, ReleaseID: "1"},
	)

	out, err := in.kubeclip(ctx, "cli", "lease", "show", "--company", "acme", "--run", "r1")
	if err != nil {
		t.Fatalf("show as cli: %v\n%s", err, out)
	}
	for _, want := range []string{"state       retained", "volume      pc-1-data", "[created] lease pc-1: pod paperclip-acme/pc-1", "[released] lease pc-1 stopped"} {
		if !strings.Contains(out, want) {
			t.Errorf("show: %q missing in\n%s", want, out)
		}
	}
	if out, err := in.kubeclip(ctx, "cli", "lease", "show", "--company", "other", "--run", "r1"); err == nil || !strings.Contains(err.Error(), "company other has no lease for run r1") {
		t.Errorf("show of another company's run: %v\n%s", err, out)
	}
}

// TestLeaseResumeWaitsForItsAnswer runs `kubeclip lease resume` as the cli user against a
// responder that answers the request it reads from the lease stream: an earlier resume's
// resumed is not the answer; the resume's own resumed is (exit 0); its failed is a refusal (exit
// 1, the code and field).
func TestLeaseResumeWaitsForItsAnswer(t *testing.T) {
	in := install(t)
	ctx := t.Context()
	in.publish(t,
		events.RunCreatedEvent{RunID: "r1", CompanyID: "acme", ProviderLeaseID: "pc-1", Namespace: "paperclip-acme", WorkloadName: "pc-1", Backend: "pod", Phase: events.PhasePending},
		events.RunResumedEvent{RunID: "r1", CompanyID: "acme", ProviderLeaseID: "pc-1", From: events.ResumedFromRetained, Resumes: 1, ResumeID: "earlier"},
	)
	for _, tc := range []struct {
		name     string
		answer   func(events.ResumeRequest) events.Event
		wantOut  string
		wantCode int
		wantErr  string
	}{
		{
			name: "resumed",
			answer: func(r events.ResumeRequest) events.Event {
				return events.RunResumedEvent{RunID: r.RunID, CompanyID: r.CompanyID, ProviderLeaseID: r.ProviderLeaseID, From: events.ResumedFromSuspended, Generation: 1, Resumes: 2, ResumeID: r.ResumeID}
			},
			wantOut: "[resumed] lease pc-1 from suspended: generation 1, resume 2\n",
		},
		{
			name: "refused",
			answer: func(r events.ResumeRequest) events.Event {
				return events.RunFailedEvent{RunID: r.RunID, CompanyID: r.CompanyID, Code: events.CodeLeaseNotFound, Field: "providerLeaseId", Message: "lease pc-1 is gone", Request: events.LeaseResume, RequestID: r.ResumeID}
			},
			wantOut:  "[failed]  lease_not_found field=providerLeaseId: lease pc-1 is gone\n",
			wantCode: 1, wantErr: "resume of run r1 refused: lease_not_found (field providerLeaseId): lease pc-1 is gone",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			answered := make(chan error, 1)
			go func() { answered <- in.answerNextResume(ctx, tc.answer) }()
			out, err := in.kubeclip(ctx, "cli", "lease", "resume", "--company", "acme", "--run", "r1", "--timeout", "30s")
			if aerr := <-answered; aerr != nil {
				t.Fatal(aerr)
			}
			if out != tc.wantOut || app.ExitCode(err) != tc.wantCode || (tc.wantErr != "" && (err == nil || err.Error() != tc.wantErr)) {
				t.Errorf("got %q, %v (exit %d); want %q, exit %d, %q", out, err, app.ExitCode(err), tc.wantOut, tc.wantCode, tc.wantErr)
			}
		})
	}
}

// answerNextResume reads the next resume request of the lease stream, as the dispatcher does,
// and publishes answer's event for it.
func (in *installation) answerNextResume(ctx context.Context, answer func(events.ResumeRequest) events.Event) error {
	s := events.Subjects{}
	subject, err := s.Lease("acme", events.LeaseResume)
	if err != nil {
		return err
	}
	stream, err := in.js.Stream(ctx, s.LeaseStream())
	if err != nil {
		return err
	}
	for {
		msg, err := stream.GetLastMsgForSubject(ctx, subject)
		if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return err
		}
		if err == nil && msg.Sequence > in.answeredSeq {
			in.answeredSeq = msg.Sequence
			req, err := s.DecodeResume(msg.Subject, msg.Data)
			if err != nil {
				return err
			}
			_, err = in.pub.Publish(ctx, answer(req))
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
