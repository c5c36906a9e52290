package isolation

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	pt "github.com/kubeclip/kubeclip/internal/pipelinetest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// retryBacklog is how many of company A's acquires fail retryably at once: the number issue 15
// measured (another company's acquire waited 2 min 35 s behind them).
const retryBacklog = 10000

// TestOneCompanysRetriesCannotDelayAnother is issue 15 item 19: with 10,000 acquires of one
// company failing retryably at the tenant-worker (Kubernetes answers 500: an admission webhook
// of that company's namespaces is down), another company's first acquire waited minutes: the
// retries waiting for their backoff filled the consumer's window (MaxAckPending) and were
// redelivered ahead of new requests. Retries now wait in the retry queue (pkg/events
// RetryQueue), outside the consumer that first meets every company's acquire: the other
// company's acquire takes about as long as it does alone.
func TestOneCompanysRetriesCannotDelayAnother(t *testing.T) {
	cs := clustertest.Clientset(t)
	failing, other, warm := pt.NewID("co"), pt.NewID("co"), pt.NewID("co")
	for _, c := range []string{failing, other, warm} {
		pt.CleanupTenant(t, cs, c)
	}
	brokenWebhook(t, cs, failing)

	baseline := acquireLatency(t, warm)

	ctx := t.Context()
	pub, err := events.NewPublisher(events.PublisherOptions{JS: env.JS, Subjects: env.Subjects})
	if err != nil {
		t.Fatal(err)
	}
	agent := pt.NewID("agent")
	var last uint64
	for range retryBacklog {
		r := env.NewRun(t, failing, agent)
		ack, err := pub.Publish(ctx, r.Request(pt.StubConfig(nil)))
		if err != nil {
			t.Fatal(err)
		}
		last = ack.Sequence
	}
	purgeAtEnd(t, failing)
	cons, err := env.JS.Consumer(ctx, env.Subjects.LeaseStream(), events.TenantWorkerConsumer)
	if err != nil {
		t.Fatal(err)
	}
	// Measure once every failing acquire had its first attempt and waits for a retry. Without
	// the retry queue that never happens in time (retries are redelivered ahead of the rest):
	// measure anyway after four minutes.
	start := time.Now()
	tried := pollUpTo(4*time.Minute, func() bool {
		info, err := cons.Info(ctx)
		// Acknowledged, not delivered: the tenant-worker pulls ahead into its per-company
		// queues (issue 26 item 15), so a delivered acquire may not have been tried yet.
		return err == nil && info.AckFloor.Stream >= last
	})
	t.Logf("every failing acquire tried once: %t, after %s", tried, time.Since(start).Round(time.Second))

	loaded := acquireLatency(t, other)
	t.Logf("another company's acquire → created: %s alone, %s with %d acquires of one company failing retryably", baseline, loaded, retryBacklog)
	// Generous on a shared machine: the bound catches the regression (minutes), the figure is
	// the report.
	if limit := max(3*baseline, baseline+30*time.Second); loaded > limit {
		t.Errorf("another company's acquire took %s with %d acquires of one company failing retryably, %s alone; want at most %s", loaded, retryBacklog, baseline, limit)
	}
}

// pollUpTo polls cond until it holds (true) or timeout passes (false).
func pollUpTo(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
	return true
}

// purgeAtEnd drops company's acquires still waiting (on the tenant-worker's consumer and in its
// retry queue) before the broken webhook goes, so none of them provisions anything after the
// test. Registered after brokenWebhook, it runs before the webhook's removal.
func purgeAtEnd(t *testing.T, company string) {
	t.Helper()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		subj, err := env.Subjects.Lease(company, events.LeaseAcquire)
		if err != nil {
			t.Error(err)
			return
		}
		if s, err := env.JS.Stream(ctx, env.Subjects.LeaseStream()); err == nil {
			if err := s.Purge(ctx, jetstream.WithPurgeSubject(subj)); err != nil {
				t.Errorf("purging %s: %v", subj, err)
			}
		}
		if s, err := env.JS.Stream(ctx, events.RetryStream); err == nil {
			if err := s.Purge(ctx, jetstream.WithPurgeSubject("kubeclip.retry.*."+subj)); err != nil {
				t.Errorf("purging the retries of %s: %v", subj, err)
			}
		} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Error(err)
		}
		// Handlers in flight finish (and fail) while the webhook is still there.
		if cons, err := env.JS.Consumer(ctx, env.Subjects.LeaseStream(), events.TenantWorkerConsumer); err == nil {
			pollUpTo(10*time.Second, func() bool {
				info, err := cons.Info(ctx)
				return err == nil && info.NumAckPending == 0
			})
		}
	})
}

// brokenWebhook installs an admission webhook for company's namespaces (and everything in
// them) whose service does not exist: the API server answers every write there with an
// internal error, which kubeclip retries (k8s.Meaning: 5xx → retry, backend_unavailable).
func brokenWebhook(t *testing.T, cs kubernetes.Interface, company string) {
	t.Helper()
	ctx := t.Context()
	fail := admissionregistrationv1.Fail
	none := admissionregistrationv1.SideEffectClassNone
	path := "/validate"
	timeout := int32(2)
	name := "kubeclip-isolation-broken-" + pt.NewID("wh")[3:]
	wh := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: "broken.isolation.kubeclip.local",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{
				Service: &admissionregistrationv1.ServiceReference{Namespace: "default", Name: "kubeclip-no-such-webhook", Path: &path},
			},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{"*"}, APIVersions: []string{"*"}, Resources: []string{"*"}},
			}},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{policy.LabelCompanyID: company}},
			// A namespaceSelector does not limit cluster-scoped objects: without this, every PV,
			// Namespace or ClusterRole write of the tests running beside this one would fail here.
			// The company's tenant objects, its Namespace included, carry its label.
			ObjectSelector:          &metav1.LabelSelector{MatchLabels: map[string]string{policy.LabelCompanyID: company}},
			FailurePolicy:           &fail,
			SideEffects:             &none,
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          &timeout,
		}},
	}
	if _, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, wh, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(ctx, name, metav1.DeleteOptions{})
	})
	probe := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "paperclip-probe-" + name[len(name)-8:], Labels: map[string]string{policy.LabelCompanyID: company}}}
	pt.Eventually(t, time.Minute, "the broken webhook in force", func() bool {
		_, err := cs.CoreV1().Namespaces().Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil || !apierrors.IsInternalError(err) {
			t.Logf("waiting for the webhook: %v", fmt.Sprint(err))
			return false
		}
		return true
	})
}
