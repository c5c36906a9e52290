// Package storage_test checks, on the local cluster, the storage reusable leases stand on: the
// cluster's dynamic provisioner (hack/cluster/local-path.yaml) binds a claim rendered by
// policy.RenderLeaseClaim when a pod uses it, the data outlives the pod, deleting the claim
// removes the volume; and the tenant quota refuses claims beyond it with quota_exceeded naming the
// quota resource.
package storage_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	"github.com/kubeclip/kubeclip/pkg/k8s"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// client-go's shared HTTP/2 transport keeps its idle connection to the apiserver (and its
		// read loop) for the life of the process.
		goleak.IgnoreAnyFunction("golang.org/x/net/http2.(*ClientConn).readLoop"),
	)
}

const (
	// sandboxImage has a shell and coreutils, runs as uid 1000 (hack/cluster/sandbox-image.sh).
	sandboxImage = "kubeclip.local/sandbox:dev"
	// storageClass is the local cluster's default class (hack/cluster/local-path.yaml).
	storageClass = "kubeclip-local"
	// mountPath is where the test pods mount the lease's volume.
	mountPath = "/data"
)

func ptr[T any](v T) *T { return &v }

func shortID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// applyTenant applies a company's tenant objects, rendered by policy.RenderTenant under op, with
// the applier the tenant-worker uses, and deletes the namespace when the test ends. It returns
// the namespace and the company id.
func applyTenant(t testing.TB, cs kubernetes.Interface, op policy.Operator) (string, string) {
	t.Helper()
	company := "storage-test-" + shortID()
	ten, err := policy.RenderTenant(policy.DefaultConfig(), company, op)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := ten.Objects()
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(clustertest.Config(t))
	if err != nil {
		t.Fatal(err)
	}
	applier, err := k8s.NewApplier(k8s.ApplierOptions{Dynamic: dyn, Mapper: k8s.NewRESTMapper(cs.Discovery())})
	if err != nil {
		t.Fatal(err)
	}
	ns := ten.Namespace.Name
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting namespace %s: %v", ns, err)
		}
	})
	if err := applier.Apply(t.Context(), objs...); err != nil {
		t.Fatalf("applying tenant %s: %v", ns, err)
	}
	// The quota admits nothing it counts until its controller has filled in its status.
	eventually(t, 30*time.Second, "the tenant quota's status", func() error {
		q, err := cs.CoreV1().ResourceQuotas(ns).Get(t.Context(), policy.TenantResourceQuota, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for name := range q.Spec.Hard {
			if _, ok := q.Status.Hard[name]; !ok {
				return fmt.Errorf("status lacks %s", name)
			}
		}
		return nil
	})
	return ns, company
}

// eventually polls f every 100 ms until it returns nil, failing t with f's last error after
// timeout.
func eventually(t testing.TB, timeout time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		select {
		case <-t.Context().Done():
			t.Fatalf("waiting for %s: %v", what, errors.Join(t.Context().Err(), err))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// claimPod is a pod passing Pod Security "restricted" that mounts claim at mountPath and runs
// script with sh, then sleeps: it is Ready once its container started.
func claimPod(name, claim, script string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  ptr(false),
			TerminationGracePeriodSeconds: ptr(int64(0)),
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   ptr(true),
				RunAsUser:      ptr(int64(1000)),
				RunAsGroup:     ptr(int64(1000)),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:            "agent",
				Image:           sandboxImage,
				ImagePullPolicy: corev1.PullNever,
				Command:         []string{"/bin/sh", "-c", script + "; exec sleep 600"},
				VolumeMounts:    []corev1.VolumeMount{{Name: "lease", MountPath: mountPath}},
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr(false),
					ReadOnlyRootFilesystem:   ptr(true),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
			Volumes: []corev1.Volume{{
				Name: "lease",
				VolumeSource: corev1.VolumeSource{
					PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim},
				},
			}},
		},
	}
}

// startPod creates pod in ns and waits until it is Ready, returning how long that took from the
// create call.
func startPod(t testing.TB, cs kubernetes.Interface, ns string, pod *corev1.Pod) time.Duration {
	t.Helper()
	start := time.Now()
	createRetryingConflicts(t, "pod "+pod.Name, func() error {
		_, err := cs.CoreV1().Pods(ns).Create(t.Context(), pod, metav1.CreateOptions{})
		return err
	})
	eventually(t, 2*time.Minute, "pod "+pod.Name+" Ready", func() error {
		p, err := cs.CoreV1().Pods(ns).Get(t.Context(), pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
			t.Fatalf("pod %s ended %s: %+v", pod.Name, p.Status.Phase, p.Status)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("phase %s, conditions %v", p.Status.Phase, p.Status.Conditions)
	})
	return time.Since(start)
}

// deletePod deletes a pod and waits until it is gone, so its volume is free for the next.
func deletePod(t testing.TB, cs kubernetes.Interface, ns, name string) {
	t.Helper()
	if err := cs.CoreV1().Pods(ns).Delete(t.Context(), name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))}); err != nil {
		t.Fatalf("deleting pod %s: %v", name, err)
	}
	eventually(t, time.Minute, "pod "+name+" gone", func() error {
		_, err := cs.CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading it: %w", err)
		}
		return errors.New("still there")
	})
}
