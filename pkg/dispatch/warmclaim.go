package dispatch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/k8s"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
	"github.com/kubeclip/kubeclip/pkg/workload"
)

// warmEligible reports whether an acquire may get a warm pod: warm pools are on, its workload
// can be a warm pod (workload.Workload.Warmable: the backend's answer, not a name compared
// here), and it is not a reusable lease (whose pod mounts the lease's own volume).
func (d *Dispatcher) warmEligible(plan lease.Plan, rec lease.Record) bool {
	if d.warm == nil || rec.Reusable {
		return false
	}
	w, err := workload.For(plan.Config.Backend, d.workloads)
	return err == nil && w.Warmable()
}

// warmSpec is the run's spec as a warm pod of its shape is rendered from (policy.WarmSpec).
func (d *Dispatcher) warmSpec(plan lease.Plan) policy.RunSpec {
	spec := plan.RunSpec("")
	spec.SandboxdImage = d.opts.SandboxdImage
	return spec
}

// claimWarm claims a warm pod for the acquire: the one an earlier attempt of this dispatch
// claimed without recording it, or a Ready one of its pool; nil when there is none.
func (d *Dispatcher) claimWarm(ctx context.Context, m jetstream.Msg, plan lease.Plan) (*corev1.Pod, error) {
	if md, err := m.Metadata(); err == nil && md.NumDelivered > 1 {
		if pod, err := d.warm.boundTo(ctx, plan.Namespace, plan.Request.RunID); err != nil || pod != nil {
			return pod, err
		}
	}
	return d.warm.claim(ctx, d.warmSpec(plan))
}

// startWarm makes pod, the warm pod the lease record names (claimed by this dispatch, or read
// again on a redelivery), the run's workload: the bind call, with the run Secret's keys; the
// Secret itself is created once `created` is out (workload.StartBound).
func (d *Dispatcher) startWarm(ctx context.Context, rec lease.Record, secret *corev1.Secret, pod *corev1.Pod) (workload.Created, error) {
	if pod == nil {
		got, err := d.opts.Clientset.CoreV1().Pods(rec.Namespace).Get(ctx, rec.WorkloadName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return workload.Created{}, events.Terminalf(events.CodeInternal, "", "the warm pod %s the lease bound is gone before it served", rec.WorkloadName)
		}
		if err != nil {
			return workload.Created{}, fmt.Errorf("reading warm pod %s/%s: %w", rec.Namespace, rec.WorkloadName, err)
		}
		pod = got
	}
	if pod.Labels[policy.LabelRunID] != rec.RunID {
		return workload.Created{}, events.Terminalf(events.CodeInternal, "", "pod %s is not bound to run %s", rec.WorkloadName, rec.RunID)
	}
	if err := d.warm.bind(ctx, pod, secret); err != nil {
		return workload.Created{}, err
	}
	return workload.StartBound(d.opts.Clientset, secret, pod), nil
}

// afterWarmAcquire is an eligible acquire's bookkeeping once `created` is out: a bound pod's
// bind Secret deleted (its sandboxd read it long ago), the acquire recorded in its pool. Errors
// are logged; the run is created.
func (d *Dispatcher) afterWarmAcquire(ctx context.Context, log zerolog.Logger, plan lease.Plan, rec lease.Record) {
	if rec.Warm {
		if err := workload.DeleteWarmSecret(ctx, d.opts.Clientset, rec.Namespace, rec.WorkloadName); err != nil {
			log.Warn().Err(err).Msg("deleting a bound pod's bind Secret failed; the pod's deletion takes it")
		}
	}
	d.warm.noteAcquire(ctx, d.warmSpec(plan), rec.Warm)
}

// createEvictingWarm is a cold create the tenant's quota refused (err): the company's warm pods
// are evicted for it, and it is tried again until the quota takes the deletions into account
// (its controller recounts within a second or two), for at most warmQuotaRetry. Without warm
// pods to evict, err stands.
func (d *Dispatcher) createEvictingWarm(ctx context.Context, log zerolog.Logger, w workload.Workload, spec policy.RunSpec, secret *corev1.Secret, err error) (workload.Created, error) {
	evicted, eerr := d.warm.evictForQuota(ctx, log, spec.Namespace, spec.CompanyID)
	if eerr != nil {
		log.Warn().Err(eerr).Msg("evicting warm pods for a quota refusal failed in part")
	}
	if evicted == 0 {
		return workload.Created{}, err
	}
	deadline := d.opts.Now().Add(warmQuotaRetry)
	for {
		select {
		case <-ctx.Done():
			return workload.Created{}, errors.Join(err, context.Cause(ctx))
		case <-time.After(warmQuotaRetryEvery):
		}
		run, err := w.Create(ctx, spec, secret)
		if _, quota := k8s.QuotaRefusal(err); !quota || !d.opts.Now().Before(deadline) {
			return run, err
		}
	}
}
