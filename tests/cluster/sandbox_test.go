package cluster_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	"github.com/kubeclip/kubeclip/pkg/streamjson"
)

// sandboxImage is Paperclip's sandbox as hack/cluster/sandbox-image.sh builds it: a Debian
// userland, node and the claude stub.
const sandboxImage = "kubeclip.local/sandbox:dev"

// sandboxPod is a pod that passes Pod Security "restricted" and runs script with sh in the
// sandbox image as kubeclip runs a lease's sandbox: uid/gid 1000, read-only root filesystem, no
// capabilities, emptyDirs for the workspace, the home directory, its cache and /tmp.
func sandboxPod(name, script string) *corev1.Pod {
	mounts := map[string]string{
		"workspace": "/workspace",
		"home":      "/home/paperclip",
		"cache":     "/home/paperclip/.cache",
		"tmp":       "/tmp",
	}
	var volumes []corev1.Volume
	var volumeMounts []corev1.VolumeMount
	for _, v := range []string{"workspace", "home", "cache", "tmp"} {
		volumes = append(volumes, corev1.Volume{Name: v, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
		volumeMounts = append(volumeMounts, corev1.VolumeMount{Name: v, MountPath: mounts[v]})
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			RestartPolicy:                corev1.RestartPolicyNever,
			AutomountServiceAccountToken: ptr(false),
			ActiveDeadlineSeconds:        ptr(int64(120)),
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   ptr(true),
				RunAsUser:      ptr(int64(1000)),
				RunAsGroup:     ptr(int64(1000)),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Volumes: volumes,
			Containers: []corev1.Container{{
				Name:            "sandbox",
				Image:           sandboxImage,
				ImagePullPolicy: corev1.PullNever,
				Command:         []string{"sh", "-c", script},
				WorkingDir:      "/workspace",
				VolumeMounts:    volumeMounts,
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
	}
}

// runPod creates pod in ns, waits until it has Succeeded or Failed and returns it with its log.
func runPod(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns string, pod *corev1.Pod) (*corev1.Pod, string) {
	t.Helper()
	pods := cs.CoreV1().Pods(ns)
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating pod %s/%s: %v", ns, pod.Name, err)
	}
	selector := fields.OneTermEqualSelector("metadata.name", pod.Name).String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = selector
			return pods.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = selector
			return pods.Watch(ctx, o)
		},
	}
	ev, err := watchtools.UntilWithSync(ctx, lw, &corev1.Pod{}, nil, func(ev watch.Event) (bool, error) {
		p, ok := ev.Object.(*corev1.Pod)
		return ok && (p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed), nil
	})
	if err != nil {
		t.Fatalf("waiting for pod %s/%s to finish: %v", ns, pod.Name, err)
	}
	done, ok := ev.Object.(*corev1.Pod)
	if !ok {
		t.Fatalf("watch of pod %s/%s ended on a %T", ns, pod.Name, ev.Object)
	}
	stream, err := pods.GetLogs(pod.Name, &corev1.PodLogOptions{}).Stream(ctx)
	if err != nil {
		t.Fatalf("reading logs of %s/%s: %v", ns, pod.Name, err)
	}
	defer stream.Close()
	logs, err := io.ReadAll(stream)
	if err != nil {
		t.Fatalf("reading logs of %s/%s: %v", ns, pod.Name, err)
	}
	return done, string(logs)
}

func TestSandboxImageRunsPaperclipsCommands(t *testing.T) {
	cs := clustertest.Clientset(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	ns := restrictedNamespace(t, cs)

	// The commands Paperclip's host runs in a sandbox (its contract, §3.3 and §3.5), then the
	// user and the emptyDirs the host writes to.
	script := `echo hi | base64 | base64 -d; printf x | sha256sum; node -e "console.log(process.version)"; claude --version
id -un; id -gn; echo "$HOME"
for d in /workspace /tmp "$HOME" "$HOME/.cache"; do printf data > "$d/f" && tar -cf - -C "$d" f | tar -tf -; done
if touch /etc/f 2>/dev/null; then echo root filesystem writable; fi`
	pod, logs := runPod(ctx, t, cs, ns, sandboxPod("sandbox-tools", script))
	if pod.Status.Phase != corev1.PodSucceeded {
		t.Fatalf("pod %s: %s, want Succeeded; logs:\n%s\nstatus: %+v", pod.Name, pod.Status.Phase, logs, pod.Status)
	}
	want := regexp.MustCompile(`^hi
2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881  -
v24\.\d+\.\d+
\d+\.\d+\.\d+ \(Claude Code stub\)
paperclip
paperclip
/home/paperclip
f
f
f
f
$`)
	if !want.MatchString(logs) {
		t.Errorf("logs:\n%s\nwant them to match:\n%s", logs, want)
	}
}

func TestSandboxClaudeStubThroughABridge(t *testing.T) {
	cs := clustertest.Clientset(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	ns := restrictedNamespace(t, cs)

	// A stand-in for Paperclip's bridge server (node, on the pod's loopback) answers the stub's
	// API calls; the stub streams its run as Paperclip's claude_local adapter runs it.
	bridge := `const http = require("http"), fs = require("fs");
const s = http.createServer((req, res) => {
  let body = "";
  req.on("data", d => body += d);
  req.on("end", () => {
    const ok = req.headers.authorization === "Bearer bridge-token";
    res.writeHead(ok ? 200 : 401, {"content-type": "application/json"});
    res.end(req.url === "/api/agents/me" ? JSON.stringify({id: "ag-1", name: "CEO"}) : body);
  });
});
s.listen(0, "127.0.0.1", () => fs.writeFileSync("/tmp/bridge-port", String(s.address().port)));`
	script := fmt.Sprintf(`node -e '%s' &
i=0; while [ ! -s /tmp/bridge-port ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
export PAPERCLIP_API_URL="http://127.0.0.1:$(cat /tmp/bridge-port)" PAPERCLIP_API_KEY=bridge-token PAPERCLIP_TASK_ID=issue-1 CLAUDE_STUB_INTERVAL=100ms
printf '## Paperclip Wake Payload\nSay hello.\n' | claude --print --output-format stream-json --verbose --model claude-opus-5
rc=$?; kill $!; exit $rc`, bridge)
	pod, logs := runPod(ctx, t, cs, ns, sandboxPod("sandbox-claude", script))
	if pod.Status.Phase != corev1.PodSucceeded {
		t.Fatalf("pod %s: %s, want Succeeded; logs:\n%s", pod.Name, pod.Status.Phase, logs)
	}

	// The log is what the run-watcher feeds kubeclip's port of Paperclip's parser.
	var p streamjson.Parser
	sc := bufio.NewScanner(strings.NewReader(logs))
	for sc.Scan() {
		p.Feed(sc.Bytes())
	}
	res := p.ResultWithExitCode(0)
	if res.IsError || res.Usage == nil || res.Usage.InputTokens == 0 || res.CostUSD == nil || *res.CostUSD <= 0 || res.Model != "claude-opus-5" {
		t.Errorf("parsed result %+v, want a success of claude-opus-5 with usage and cost; logs:\n%s", res, logs)
	}
	for _, want := range []string{
		`GET /api/agents/me: 200, agent \"CEO\" (ag-1)`,
		`PATCH /api/issues/issue-1 {\"status\":\"done\"}: 200`,
		"claude-stub: working on a prompt of 37 bytes",
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs do not contain %q:\n%s", want, logs)
		}
	}
}
