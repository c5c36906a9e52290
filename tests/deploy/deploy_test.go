package deploy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	dto "github.com/prometheus/client_model/go"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	"github.com/kubeclip/kubeclip/internal/leasetest"
	"github.com/kubeclip/kubeclip/pkg/execclient"
	"github.com/kubeclip/kubeclip/pkg/inbox"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// workers are the Deployments of the overlay, before the test's name suffix.
var workers = []string{"tenant-worker", "dispatcher", "run-watcher", "exec-worker"}

// wantReady is each worker's /readyz body once it is connected to NATS and the API server
// answers, its self-check found every permission it needs (and, for the exec-worker, it takes
// exec requests).
var wantReady = map[string]string{
	"tenant-worker": "ok nats\nok kubernetes\nok permissions\n",
	"dispatcher":    "ok nats\nok kubernetes\nok permissions\n",
	"run-watcher":   "ok nats\nok kubernetes\nok permissions\n",
	"exec-worker":   "ok nats\nok kubernetes\nok permissions\nok exec\n",
}

// wantBrokerReady is the credential broker's /readyz body: NATS, its user's permissions (no
// Kubernetes: it has no client) and its grant cache.
const wantBrokerReady = "ok nats\nok permissions\nok grants\n"

// TestDevOverlayRunsALeaseInCluster deploys the dev overlay with images built here and random
// Secrets (hack/deploy/secrets.sh), then, as Paperclip's NATS user, runs a lease end to end
// through the workers running in the cluster under their own ServiceAccounts and a command in an
// exec-capable lease's pod through the exec-worker, and checks that every worker's /metrics
// counted it. NATS refuses clients without credentials, and Paperclip's user may not publish
// run events.
func TestDevOverlayRunsALeaseInCluster(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	importImages(t)
	id := shortID()
	ns := "kubeclip-e2e-" + id
	suffix := "-" + id

	// 1. The namespace and the installation's Secrets, then NATS: the workers are pointed at its
	// pod IP (no cluster DNS, no kube-proxy here).
	base := render(t, rendering{overlay: "dev", namespace: ns, suffix: suffix})
	c.deleteAtEnd(t, ns, base)
	ctx := t.Context()
	for _, o := range base {
		if o.GetKind() == "Namespace" {
			if err := c.apply(ctx, t, o, false); err != nil {
				t.Fatal(err)
			}
		}
	}
	passwords := installSecrets(t, c, ns)
	for _, o := range base {
		if isNATS(o) && o.GetKind() != "Namespace" {
			if err := c.apply(ctx, t, o, false); err != nil {
				t.Fatal(err)
			}
		}
	}
	natsPod := waitPodReady(t, c, ns, "app.kubernetes.io/name=nats", 3*time.Minute)
	natsURL := fmt.Sprintf("nats://%s:4222", natsPod.Status.PodIP)

	// 2. Everything, with the NATS URL merged into kubeclip-config.
	objs := render(t, rendering{overlay: "dev", namespace: ns, suffix: suffix, config: map[string]string{
		"KUBECLIP_NATS_URL": natsURL, "KUBECLIP_RBAC_NAME_SUFFIX": suffix,
		// Step 6 waits for a self-check round; the default 30 s would be most of its time.
		"KUBECLIP_SELF_CHECK_INTERVAL": selfCheckInterval,
	}})
	c.deleteAtEnd(t, "", objs)
	for _, o := range objs {
		if err := c.apply(ctx, t, o, false); err != nil {
			t.Fatal(err)
		}
	}
	if w := c.warn.take(); len(w) > 0 {
		t.Errorf("the API server warned: %v", w)
	}
	pods := map[string]*corev1.Pod{}
	for _, w := range workers {
		waitAvailable(t, c, ns, w+suffix)
		pods[w] = waitPodReady(t, c, ns, "app.kubernetes.io/name="+w, time.Minute)
	}
	t.Cleanup(func() {
		if t.Failed() {
			dumpPods(t, c, ns)
		}
	})

	// The credential broker (issue 27), which no lease here uses yet: it starts with the CA and
	// sealing key secrets.sh made (kubeclip-broker), as its own NATS user, with no API token,
	// and is Ready once its NATS self-check holds and its grant cache is loaded.
	waitAvailable(t, c, ns, "credential-broker"+suffix)
	brokerPod := waitPodReady(t, c, ns, "app.kubernetes.io/name=credential-broker", time.Minute)
	if body := get(t, opsURL(brokerPod, "/readyz")); body != wantBrokerReady {
		t.Errorf("credential-broker /readyz = %q, want %q", body, wantBrokerReady)
	}

	// The kubelet reached /readyz (the pods are Ready); so does anyone on the pod network.
	for w, p := range pods {
		if body := get(t, opsURL(p, "/readyz")); body != wantReady[w] {
			t.Errorf("%s /readyz = %q, want %q", w, body, wantReady[w])
		}
	}
	before := scrapeAll(t, pods)

	// 3. NATS users are on: no credentials, no connection; Paperclip's user publishes no run
	// event.
	t.Run("nats users", func(t *testing.T) {
		checkNATSUsers(t, natsURL, passwords)
	})

	// 4. A lease, end to end, through the in-cluster workers, as Paperclip.
	nc, err := nats.Connect(natsURL, nats.Name(t.Name()), nats.UserInfo("paperclip", passwords["paperclip"]), nats.CustomInboxPrefix(inbox.PaperclipPrefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stopSampling := sampleResources(t, pods)
	leases := 1
	if n, err := strconv.Atoi(os.Getenv("KUBECLIP_DEPLOY_LEASES")); err == nil && n > 1 {
		leases = n // a load run, to measure the workers (README, Deploy)
	}
	cs := clustertest.Clientset(t)
	t.Run("leases", func(t *testing.T) {
		for i := range leases {
			t.Run(fmt.Sprint(i), func(t *testing.T) {
				t.Parallel()
				res := leasetest.Run(t, js, cs)
				t.Logf("lease %s: %d log events, result %s, released %s", res.Created.ProviderLeaseID, len(res.Logs), res.Result.Outcome, res.Released.State)
			})
		}
	})
	// A command in an exec-capable lease's pod, through the deployed exec-worker; in a load run
	// also as many concurrent commands as leases, each printing execLoadBytes.
	t.Run("exec", func(t *testing.T) {
		ctx := t.Context()
		// The lease's pod is wired to the broker (issue 27) by the deployed tenant-worker and
		// dispatcher: the address they read from the Service's service-links variable.
		svc, err := c.cs.CoreV1().Services(ns).Get(ctx, "credential-broker"+suffix, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		load := []func(*testing.T, *execclient.Client, execclient.Lease){func(t *testing.T, ec *execclient.Client, l execclient.Lease) {
			checkBrokerWiring(t, c, ec, l, ns, svc.Spec.ClusterIP)
		}}
		if leases > 1 {
			load = append(load, func(t *testing.T, c *execclient.Client, l execclient.Lease) { execLoad(t, c, l, leases) })
		}
		res := leasetest.Exec(t, nc, js, cs, load...)
		if want := pods["exec-worker"].Name; res.Exec.Replica != want {
			t.Errorf("the exit came from replica %q, want the exec-worker pod %s", res.Exec.Replica, want)
		}
		t.Logf("exec in lease %s (pod %s/%s) through %s: %d bytes of output, released %s", res.Created.ProviderLeaseID,
			res.Created.Namespace, res.Created.WorkloadName, res.Exec.Replica, len(res.Exec.Stdout)+len(res.Exec.Stderr), res.Released.State)
	})
	stopSampling()
	if t.Failed() {
		return
	}

	// 5. The metrics moved.
	var after map[string]map[string]*dto.MetricFamily
	eventually(t, 30*time.Second, "metrics reflecting the lease", func() error {
		after = scrapeAll(t, pods)
		return checkMetrics(before, after)
	})
	reportResources(t, after)

	// 6. The self-check: a worker without one of its permissions is not ready and says which;
	// given it back, it becomes ready (last: it restarts the run-watcher).
	t.Run("self-check", func(t *testing.T) {
		checkSelfCheck(t, c, ns, suffix, objs, pods)
	})
	var varz struct {
		Mem int64   `json:"mem"`
		CPU float64 `json:"cpu"`
	}
	if err := json.Unmarshal([]byte(get(t, fmt.Sprintf("http://%s:8222/varz", natsPod.Status.PodIP))), &varz); err == nil {
		t.Logf("nats: RSS %.1f MiB, CPU %.1f%% (nats-server's /varz)", float64(varz.Mem)/(1<<20), varz.CPU)
	}
}

// execLoadBytes is what each command of a load run prints: enough for the exec-worker's flow
// control (an 8 MiB window per stream, acknowledged every 2 MiB) to matter.
const execLoadBytes = 16 << 20

// execLoad runs n commands at once in the lease, each printing execLoadBytes, and checks that
// every byte arrived.
func execLoad(t *testing.T, c *execclient.Client, l execclient.Lease, n int) {
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
			defer cancel()
			var stdout counter
			res, err := c.Run(ctx, execclient.Exec{Lease: l, Command: "head", Args: []string{"-c", fmt.Sprint(execLoadBytes), "/dev/zero"}, Stdout: &stdout})
			if err != nil || stdout != execLoadBytes || res.ExitCode == nil || *res.ExitCode != 0 {
				t.Errorf("load exec %d: %d bytes, exit %v, %v; want %d bytes, exit 0", i, stdout, res.ExitCode, err, execLoadBytes)
			}
		}()
	}
	wg.Wait()
	t.Logf("%d concurrent execs of %d MiB each through the exec-worker in %s", n, execLoadBytes>>20, time.Since(start).Round(time.Millisecond))
}

// checkBrokerWiring reads, through the exec-worker, what the lease's pod holds of the broker
// wiring: its /etc/hosts maps every bound host (the tenancy ConfigMap's) to the broker Service's
// ClusterIP, its commands' environment names the CA file to Node, and that file is the
// installation CA's certificate from the Secret kubeclip-broker.
func checkBrokerWiring(t *testing.T, c *cluster, ec *execclient.Client, l execclient.Lease, ns, clusterIP string) {
	t.Helper()
	cat := func(file string) string {
		var out bytes.Buffer
		res, err := ec.Run(t.Context(), execclient.Exec{Lease: l, Command: "cat", Args: []string{file}, Stdout: &out})
		if err != nil || res.ExitCode == nil || *res.ExitCode != 0 {
			t.Fatalf("cat %s in the lease's pod: exit %v, %v", file, res.ExitCode, err)
		}
		return out.String()
	}
	hosts := strings.Split(envFromConfigMap(t, c, ns, "kubeclip-tenancy", "KUBECLIP_BROKER_HOSTS"), ",")
	etcHosts := cat("/etc/hosts")
	for _, h := range hosts {
		found := false
		for _, line := range strings.Split(etcHosts, "\n") {
			f := strings.Fields(line)
			found = found || len(f) > 1 && f[0] == clusterIP && slices.Contains(f[1:], h)
		}
		if !found {
			t.Errorf("the pod's /etc/hosts does not map %s to the broker's ClusterIP %s:\n%s", h, clusterIP, etcHosts)
		}
	}
	env := strings.Split(cat("/proc/self/environ"), "\x00")
	for _, name := range policy.BrokerCAEnv() {
		if !slices.Contains(env, name+"="+policy.BrokerCAFile) {
			t.Errorf("the pod's commands run without %s=%s", name, policy.BrokerCAFile)
		}
	}
	secret, err := c.cs.CoreV1().Secrets(ns).Get(t.Context(), "kubeclip-broker", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := cat(policy.BrokerCAFile); got != string(secret.Data["ca.crt"]) || got == "" {
		t.Errorf("the pod's %s is not the installation CA's certificate (%d bytes)", policy.BrokerCAFile, len(got))
	}
	t.Logf("lease pod: %d bound hosts at the broker's ClusterIP %s, CA %d bytes", len(hosts), clusterIP, len(secret.Data["ca.crt"]))
}

// envFromConfigMap is key of the ConfigMap whose generated name starts with prefix.
func envFromConfigMap(t *testing.T, c *cluster, ns, prefix, key string) string {
	t.Helper()
	list, err := c.cs.CoreV1().ConfigMaps(ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cm := range list.Items {
		if strings.HasPrefix(cm.Name, prefix) && cm.Data[key] != "" {
			return cm.Data[key]
		}
	}
	t.Fatalf("no ConfigMap %s* with %s in %s", prefix, key, ns)
	return ""
}

// counter is an io.Writer that counts what it is written.
type counter int

func (c *counter) Write(b []byte) (int, error) {
	*c += counter(len(b))
	return len(b), nil
}

// checkMetrics compares two scrapes of every worker: each must have counted its part of one
// lease.
func checkMetrics(before, after map[string]map[string]*dto.MetricFamily) error {
	type want struct {
		worker, family string
		labels         map[string]string
		minDelta       float64
	}
	wants := []want{
		{"tenant-worker", "kubeclip_messages_consumed_total", map[string]string{"consumer": "tenant-worker", "subject": "paperclip.lease.*.acquire", "fate": "acked"}, 1},
		{"tenant-worker", "kubeclip_handler_duration_seconds", map[string]string{"consumer": "tenant-worker"}, 1},
		{"tenant-worker", "kubeclip_events_published_total", map[string]string{"subject": "kubeclip.dispatch.*.*", "outcome": "stored"}, 1},
		{"dispatcher", "kubeclip_messages_consumed_total", map[string]string{"consumer": "dispatcher", "fate": "acked"}, 1},
		{"dispatcher", "kubeclip_messages_consumed_total", map[string]string{"consumer": "dispatcher-release", "fate": "acked"}, 1},
		{"dispatcher", "kubeclip_events_published_total", map[string]string{"subject": "paperclip.run.*.*.created", "outcome": "stored"}, 1},
		{"dispatcher", "kubeclip_events_published_total", map[string]string{"subject": "paperclip.run.*.*.released", "outcome": "stored"}, 1},
		{"run-watcher", "kubeclip_events_published_total", map[string]string{"subject": "paperclip.run.*.*.log", "outcome": "stored"}, 1},
		{"run-watcher", "kubeclip_events_published_total", map[string]string{"subject": "paperclip.run.*.*.result", "outcome": "stored"}, 1},
		{"run-watcher", "kubeclip_log_lines_total", nil, leasetest.StubLines},
		{"run-watcher", "kubeclip_log_bytes_total", nil, 50 * leasetest.StubLines},
		{"exec-worker", "kubeclip_exec_requests_total", map[string]string{"op": "start", "code": "ok"}, 1},
		{"exec-worker", "kubeclip_exec_output_bytes_total", nil, 1},
	}
	var problems []string
	for _, w := range wants {
		d := sum(after[w.worker], w.family, w.labels) - sum(before[w.worker], w.family, w.labels)
		if d < w.minDelta {
			problems = append(problems, fmt.Sprintf("%s %s%v grew by %v, want at least %v", w.worker, w.family, w.labels, d, w.minDelta))
		}
	}
	if n := sum(after["run-watcher"], "kubeclip_runs_in_flight", nil); n != 0 {
		problems = append(problems, fmt.Sprintf("run-watcher kubeclip_runs_in_flight = %v after the run ended, want 0", n))
	}
	if n := sum(after["exec-worker"], "kubeclip_exec_streams", nil); n != 0 {
		problems = append(problems, fmt.Sprintf("exec-worker kubeclip_exec_streams = %v after the exec ended, want 0", n))
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s", strings.Join(problems, "; "))
	}
	return nil
}

// reportResources logs each worker's memory and CPU after the run: the numbers the
// Deployments' requests and limits are based on (README, Deploy).
func reportResources(t *testing.T, fams map[string]map[string]*dto.MetricFamily) {
	for _, w := range workers {
		rss := sum(fams[w], "process_resident_memory_bytes", nil)
		cpu := sum(fams[w], "process_cpu_seconds_total", nil)
		heap := sum(fams[w], "go_memstats_heap_inuse_bytes", nil)
		t.Logf("%s: RSS %.1f MiB, heap in use %.1f MiB, CPU %.2f s since start", w, rss/(1<<20), heap/(1<<20), cpu)
	}
}

func isNATS(o *unstructured.Unstructured) bool {
	switch o.GetKind() {
	case "Namespace":
		return true
	case "ConfigMap":
		return strings.HasPrefix(o.GetName(), "nats-config")
	}
	return o.GetLabels()["app.kubernetes.io/name"] == "nats"
}

// importImages builds the production images from this checkout and imports them into the
// local cluster's containerd.
func importImages(t *testing.T) {
	t.Helper()
	if p := os.Getenv(clustertest.KubeconfigEnv); p != "" {
		t.Fatalf("%s is set: this test imports its images into the local cluster's containerd; load bin/images/*.tar (make images-prod) into that cluster's nodes and unset it, or run against the local cluster", clustertest.KubeconfigEnv)
	}
	cmd := exec.Command("bash", filepath.Join(root, "hack/images/images.sh"), "import")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("hack/images/images.sh import: %v\n%s", err, out)
	}
}

func waitAvailable(t *testing.T, c *cluster, ns, name string) {
	t.Helper()
	eventually(t, 3*time.Minute, "Deployment "+name+" available", func() error {
		d, err := c.cs.AppsV1().Deployments(ns).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range d.Status.Conditions {
			if cond.Type == appsv1.DeploymentAvailable && cond.Status == corev1.ConditionTrue && d.Status.ReadyReplicas == *d.Spec.Replicas {
				return nil
			}
		}
		return fmt.Errorf("status %+v", d.Status)
	})
}

func waitPodReady(t *testing.T, c *cluster, ns, selector string, timeout time.Duration) *corev1.Pod {
	t.Helper()
	var ready *corev1.Pod
	eventually(t, timeout, "a Ready pod "+selector, func() error {
		list, err := c.cs.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return err
		}
		for i := range list.Items {
			p := &list.Items[i]
			for _, cond := range p.Status.Conditions {
				if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue && p.DeletionTimestamp == nil {
					ready = p
					return nil
				}
			}
		}
		return fmt.Errorf("%d pods, none Ready: %s", len(list.Items), podSummary(list.Items))
	})
	return ready
}

func podSummary(pods []corev1.Pod) string {
	var b strings.Builder
	for _, p := range pods {
		fmt.Fprintf(&b, "[%s %s", p.Name, p.Status.Phase)
		for _, cs := range p.Status.ContainerStatuses {
			if cs.State.Waiting != nil {
				fmt.Fprintf(&b, " %s: %s", cs.State.Waiting.Reason, cs.State.Waiting.Message)
			}
			fmt.Fprintf(&b, " restarts=%d", cs.RestartCount)
		}
		for _, cond := range p.Status.Conditions {
			if cond.Status != corev1.ConditionTrue && cond.Message != "" {
				fmt.Fprintf(&b, " %s: %s", cond.Type, cond.Message)
			}
		}
		b.WriteString("] ")
	}
	return b.String()
}

// dumpPods logs every pod's status and the end of its log, for a failed run.
func dumpPods(t *testing.T, c *cluster, ns string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	list, err := c.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Logf("listing pods: %v", err)
		return
	}
	t.Logf("pods: %s", podSummary(list.Items))
	tail := int64(40)
	for _, p := range list.Items {
		data, err := c.cs.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{TailLines: &tail}).DoRaw(ctx)
		t.Logf("---- %s (err %v) ----\n%s", p.Name, err, data)
	}
}

func opsURL(p *corev1.Pod, path string) string {
	return fmt.Sprintf("http://%s:8080%s", p.Status.PodIP, path)
}

func get(t *testing.T, url string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}

func scrapeAll(t *testing.T, pods map[string]*corev1.Pod) map[string]map[string]*dto.MetricFamily {
	t.Helper()
	out := map[string]map[string]*dto.MetricFamily{}
	for w, p := range pods {
		fams, err := scrape(t.Context(), opsURL(p, "/metrics"))
		if err != nil {
			t.Fatalf("scraping %s: %v", w, err)
		}
		out[w] = fams
	}
	return out
}

// sampleResources polls each worker's process metrics every second until stop is called, then
// logs the peak resident memory and the peak CPU use over one-second windows: the numbers
// behind the Deployments' requests and limits.
func sampleResources(t *testing.T, pods map[string]*corev1.Pod) (stop func()) {
	type peak struct{ rss, cpu, lastCPU float64 }
	peaks := map[string]*peak{}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			for w, p := range pods {
				fams, err := scrape(context.Background(), opsURL(p, "/metrics"))
				if err != nil {
					continue
				}
				pk := peaks[w]
				cpu := sum(fams, "process_cpu_seconds_total", nil)
				if pk == nil {
					pk = &peak{lastCPU: cpu}
					peaks[w] = pk
				}
				pk.rss = max(pk.rss, sum(fams, "process_resident_memory_bytes", nil))
				pk.cpu = max(pk.cpu, cpu-pk.lastCPU)
				pk.lastCPU = cpu
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	return func() {
		close(done)
		<-finished
		for _, w := range workers {
			if pk := peaks[w]; pk != nil {
				t.Logf("%s: peak RSS %.1f MiB, peak CPU %.0f millicores (1s windows)", w, pk.rss/(1<<20), pk.cpu*1000)
			}
		}
	}
}
