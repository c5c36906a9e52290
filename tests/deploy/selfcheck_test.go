package deploy_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/kubeclip/kubeclip/internal/app"
	"github.com/kubeclip/kubeclip/internal/ops"
)

// selfCheckInterval is the workers' --self-check-interval in TestDevOverlayRunsALeaseInCluster.
const selfCheckInterval = "2s"

// revokedAccess is the access checkSelfCheck takes from the run-watcher: watching events (its
// informer of quota events). A worker without it still starts (the informer lists, and its
// watch keeps failing), so the self-check is what shows it.
var revokedAccess = app.Access{Verb: "watch", Resource: "events"}

// checkSelfCheck takes revokedAccess from the deployed run-watcher's ClusterRole (objs as
// applied) and restarts its pod: the new pod's /readyz fails its permissions check naming the
// access, its log has an error line naming it, and /metrics exports it. With the access given
// back, the same pod becomes ready without a restart.
//
// First it reports how long each worker's first self-check took (its log's took_ms): the cost
// the check adds to a worker's start.
func checkSelfCheck(t *testing.T, c *cluster, ns, suffix string, objs []*unstructured.Unstructured, pods map[string]*corev1.Pod) {
	ctx := t.Context()
	for _, w := range workers {
		logs, err := c.cs.CoreV1().Pods(ns).GetLogs(pods[w].Name, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for l := range strings.SplitSeq(string(logs), "\n") {
			if strings.Contains(l, "every permission is held") {
				t.Logf("%s: %s", w, l)
			}
		}
	}
	old := pods["run-watcher"]
	var role *unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "ClusterRole" && o.GetName() == "kubeclip-run-watcher"+suffix {
			role = o
		}
	}
	if role == nil {
		t.Fatalf("no ClusterRole kubeclip-run-watcher%s in the overlay", suffix)
	}
	cut := withoutVerb(t, role, revokedAccess)
	if err := c.apply(ctx, t, cut, false); err != nil {
		t.Fatal(err)
	}
	restored := false
	t.Cleanup(func() {
		if !restored {
			_ = c.apply(context.WithoutCancel(ctx), t, role, false)
		}
	})
	if err := c.cs.CoreV1().Pods(ns).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	name := revokedAccess.String()
	wantFail := "fail permissions: missing " + ops.PermissionKubernetes + ": " + name
	var pod *corev1.Pod
	eventually(t, 3*time.Minute, "a new run-watcher pod whose /readyz names "+name, func() error {
		list, err := c.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=run-watcher"})
		if err != nil {
			return err
		}
		for i := range list.Items {
			p := &list.Items[i]
			if p.Name == old.Name || p.Status.PodIP == "" || p.DeletionTimestamp != nil {
				continue
			}
			code, body, err := readyz(ctx, p)
			if err != nil {
				return err
			}
			if code != http.StatusServiceUnavailable || !strings.Contains(body, wantFail) {
				return fmt.Errorf("pod %s /readyz: %d %q, want 503 with %q", p.Name, code, body, wantFail)
			}
			pod = p
			return nil
		}
		return fmt.Errorf("no new pod yet: %s", podSummary(list.Items))
	})
	logs, err := c.cs.CoreV1().Pods(ns).GetLogs(pod.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for l := range strings.SplitSeq(string(logs), "\n") {
		if strings.Contains(l, `"level":"error"`) && strings.Contains(l, `"permission":"`+name+`"`) {
			lines = append(lines, l)
		}
	}
	if len(lines) != 1 {
		t.Errorf("%d error lines naming %q in the run-watcher's log, want 1:\n%s", len(lines), name, logs)
	}
	fams, err := scrape(ctx, opsURL(pod, "/metrics"))
	if err != nil {
		t.Fatal(err)
	}
	if got := sum(fams, ops.MetricPermissionMissing, map[string]string{"kind": ops.PermissionKubernetes, "permission": name}); got != 1 {
		t.Errorf("%s{permission=%q} = %v, want 1", ops.MetricPermissionMissing, name, got)
	}
	if fams[ops.MetricSelfCheckOK] == nil || sum(fams, ops.MetricSelfCheckOK, nil) != 0 {
		t.Errorf("%s is not 0 while a permission is missing", ops.MetricSelfCheckOK)
	}

	// Given back, the same pod becomes ready at its next round (selfCheckInterval).
	if err := c.apply(ctx, t, role, false); err != nil {
		t.Fatal(err)
	}
	restored = true
	eventually(t, 2*time.Minute, "the run-watcher ready once the access is back", func() error {
		code, body, err := readyz(ctx, pod)
		if err != nil {
			return err
		}
		if code != http.StatusOK || body != wantReady["run-watcher"] {
			return fmt.Errorf("/readyz: %d %q", code, body)
		}
		return nil
	})
	if fams, err = scrape(ctx, opsURL(pod, "/metrics")); err != nil {
		t.Fatal(err)
	}
	if fams[ops.MetricPermissionMissing] != nil && len(fams[ops.MetricPermissionMissing].GetMetric()) > 0 {
		t.Errorf("%s still has series once the access is back: %v", ops.MetricPermissionMissing, fams[ops.MetricPermissionMissing])
	}
	if sum(fams, ops.MetricSelfCheckOK, nil) != 1 {
		t.Errorf("%s is not 1 once every permission is held", ops.MetricSelfCheckOK)
	}
}

// withoutVerb returns a copy of the ClusterRole role whose rules no longer grant a.
func withoutVerb(t *testing.T, role *unstructured.Unstructured, a app.Access) *unstructured.Unstructured {
	t.Helper()
	cut := role.DeepCopy()
	rules, _, _ := unstructured.NestedSlice(cut.Object, "rules")
	found := false
	for _, r := range rules {
		rule := r.(map[string]any)
		if !contains(rule["apiGroups"], a.Group) || !contains(rule["resources"], a.Resource) {
			continue
		}
		var verbs []any
		for _, v := range rule["verbs"].([]any) {
			if v != a.Verb {
				verbs = append(verbs, v)
			}
		}
		found = found || len(verbs) < len(rule["verbs"].([]any))
		rule["verbs"] = verbs
	}
	if !found {
		t.Fatalf("ClusterRole %s grants no %s", role.GetName(), a)
	}
	if err := unstructured.SetNestedSlice(cut.Object, rules, "rules"); err != nil {
		t.Fatal(err)
	}
	return cut
}

func contains(list any, s string) bool {
	items, _ := list.([]any)
	for _, it := range items {
		if it == s {
			return true
		}
	}
	return false
}

// readyz asks p's /readyz, returning the status and body.
func readyz(ctx context.Context, p *corev1.Pod) (int, string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, opsURL(p, "/readyz"), nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}
