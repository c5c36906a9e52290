// Package cluster_test checks the local test cluster end to end: the agent-stub image runs as a
// Job that passes Pod Security "restricted", exactly as the Jobs kubeclip renders will.
package cluster_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/kubeclip/kubeclip/internal/clustertest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// client-go's shared HTTP/2 transport keeps its idle connection to the apiserver (and its
		// read loop) for the life of the process.
		goleak.IgnoreAnyFunction("golang.org/x/net/http2.(*ClientConn).readLoop"),
	)
}

const (
	stubImage = "kubeclip.local/agent-stub:dev"
	// The Job pkg/policy renders starts the agent like Paperclip's runtime images do.
	tini = "/usr/bin/tini"
	shim = "/usr/local/bin/paperclip-agent-shim"
)

func ptr[T any](v T) *T { return &v }

// restrictedNamespace creates a namespace that enforces Pod Security "restricted" and deletes it
// when the test ends.
func restrictedNamespace(t *testing.T, cs kubernetes.Interface) string {
	t.Helper()
	ns, err := cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: "kubeclip-test-stubjob-",
			Labels:       map[string]string{"pod-security.kubernetes.io/enforce": "restricted"},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating namespace: %v", err)
	}
	t.Cleanup(func() {
		// t.Context is already cancelled when cleanups run.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := cs.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("deleting namespace %s: %v", ns.Name, err)
		}
	})
	return ns.Name
}

// stubJob is a Job whose pod passes Pod Security "restricted" and runs the agent stub with env.
func stubJob(name string, env map[string]string) *batchv1.Job {
	var vars []corev1.EnvVar
	for k, v := range env {
		vars = append(vars, corev1.EnvVar{Name: k, Value: v})
	}
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: batchv1.JobSpec{
			BackoffLimit:          ptr(int32(0)),
			ActiveDeadlineSeconds: ptr(int64(120)),
			Template: corev1.PodTemplateSpec{
				Spec: corev1.PodSpec{
					RestartPolicy:                corev1.RestartPolicyNever,
					AutomountServiceAccountToken: ptr(false),
					SecurityContext: &corev1.PodSecurityContext{
						RunAsNonRoot:   ptr(true),
						RunAsUser:      ptr(int64(1000)),
						RunAsGroup:     ptr(int64(1000)),
						SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
					},
					Containers: []corev1.Container{{
						Name:            "agent",
						Image:           stubImage,
						ImagePullPolicy: corev1.PullNever,
						Command:         []string{tini, "--", shim},
						Env:             vars,
						SecurityContext: &corev1.SecurityContext{
							RunAsNonRoot:             ptr(true),
							RunAsUser:                ptr(int64(1000)),
							AllowPrivilegeEscalation: ptr(false),
							ReadOnlyRootFilesystem:   ptr(true),
							Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
							SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
						},
					}},
				},
			},
		},
	}
}

// runJob creates job in ns and watches it until it is Complete or Failed, returning its last state.
func runJob(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns string, job *batchv1.Job) *batchv1.Job {
	t.Helper()
	jobs := cs.BatchV1().Jobs(ns)
	if _, err := jobs.Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating job %s/%s: %v", ns, job.Name, err)
	}
	selector := fields.OneTermEqualSelector("metadata.name", job.Name).String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = selector
			return jobs.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = selector
			return jobs.Watch(ctx, o)
		},
	}
	ev, err := watchtools.UntilWithSync(ctx, lw, &batchv1.Job{}, nil, func(ev watch.Event) (bool, error) {
		j, ok := ev.Object.(*batchv1.Job)
		if !ok {
			return false, nil
		}
		return jobFinished(j) != "", nil
	})
	if err != nil {
		t.Fatalf("waiting for job %s/%s to finish: %v", ns, job.Name, err)
	}
	finished, ok := ev.Object.(*batchv1.Job)
	if !ok {
		t.Fatalf("watch of job %s/%s ended on a %T", ns, job.Name, ev.Object)
	}
	return finished
}

// jobFinished returns the Job's terminal condition type (Complete or Failed), or "".
func jobFinished(j *batchv1.Job) batchv1.JobConditionType {
	for _, c := range j.Status.Conditions {
		if (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) && c.Status == corev1.ConditionTrue {
			return c.Type
		}
	}
	return ""
}

func jobPod(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, job string) *corev1.Pod {
	t.Helper()
	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + job})
	if err != nil {
		t.Fatalf("listing pods of job %s/%s: %v", ns, job, err)
	}
	if len(pods.Items) != 1 {
		t.Fatalf("job %s/%s has %d pods, want 1", ns, job, len(pods.Items))
	}
	return &pods.Items[0]
}

// streamEvent is the part of a stream-json line the test checks.
type streamEvent struct {
	Type    string `json:"type"`
	Subtype string `json:"subtype"`
	Message struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
	} `json:"message"`
}

func TestStubJobCompletesUnderRestrictedPodSecurity(t *testing.T) {
	cs := clustertest.Clientset(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	ns := restrictedNamespace(t, cs)

	const lines = 12
	job := runJob(ctx, t, cs, ns, stubJob("stub-ok", map[string]string{
		"STUB_LINES":    fmt.Sprint(lines),
		"STUB_BURST":    "4", // lines of one burst share a timestamp (to the log's resolution)
		"STUB_INTERVAL": "100ms",
	}))
	pod := jobPod(ctx, t, cs, ns, job.Name)
	if got := jobFinished(job); got != batchv1.JobComplete {
		t.Fatalf("job finished %q, want Complete; pod status: %+v", got, pod.Status)
	}

	stream, err := cs.CoreV1().Pods(ns).GetLogs(pod.Name, &corev1.PodLogOptions{Timestamps: true}).Stream(ctx)
	if err != nil {
		t.Fatalf("reading logs of %s/%s: %v", ns, pod.Name, err)
	}
	defer stream.Close()

	var types, texts []string
	var last time.Time
	sc := bufio.NewScanner(stream)
	for sc.Scan() {
		ts, body, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			t.Fatalf("log line without timestamp: %q", sc.Text())
		}
		at, err := time.Parse(time.RFC3339Nano, ts)
		if err != nil {
			t.Fatalf("log line timestamp %q: %v", ts, err)
		}
		if at.Before(last) {
			t.Errorf("timestamps go backwards: %s after %s", at, last)
		}
		last = at
		var ev streamEvent
		if err := json.Unmarshal([]byte(body), &ev); err != nil {
			t.Fatalf("log line is not stream-json: %q: %v", body, err)
		}
		types = append(types, ev.Type)
		if ev.Type == "assistant" {
			if len(ev.Message.Content) != 1 {
				t.Fatalf("assistant line with %d content blocks: %q", len(ev.Message.Content), body)
			}
			texts = append(texts, ev.Message.Content[0].Text)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("reading logs: %v", err)
	}

	// Every stub line exactly once, in order, between the init and the result line.
	if len(texts) != lines {
		t.Fatalf("got %d assistant lines, want %d: %q", len(texts), lines, texts)
	}
	for i, text := range texts {
		if want := fmt.Sprintf("stub line %d", i+1); text != want {
			t.Errorf("assistant line %d = %q, want %q", i+1, text, want)
		}
	}
	if len(types) != lines+2 || types[0] != "system" || types[len(types)-1] != "result" {
		t.Errorf("event types = %q, want system, %d × assistant, result", types, lines)
	}
}

func TestStubJobExitCodeFailsJob(t *testing.T) {
	cs := clustertest.Clientset(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	ns := restrictedNamespace(t, cs)

	job := runJob(ctx, t, cs, ns, stubJob("stub-exit3", map[string]string{
		"STUB_EXIT_CODE": "3",
		"STUB_IS_ERROR":  "true",
	}))
	if got := jobFinished(job); got != batchv1.JobFailed {
		t.Fatalf("job finished %q, want Failed", got)
	}
	pod := jobPod(ctx, t, cs, ns, job.Name)
	if len(pod.Status.ContainerStatuses) != 1 {
		t.Fatalf("pod %s has %d container statuses, want 1", pod.Name, len(pod.Status.ContainerStatuses))
	}
	term := pod.Status.ContainerStatuses[0].State.Terminated
	if term == nil {
		t.Fatalf("container of %s is not terminated: %+v", pod.Name, pod.Status.ContainerStatuses[0].State)
	}
	if term.ExitCode != 3 {
		t.Errorf("container exit code = %d, want 3", term.ExitCode)
	}
}
