package paperclip

import (
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	pt "github.com/kubeclip/kubeclip/internal/pipelinetest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// leaseIdleWindow is the suite's dispatcher --lease-idle-window (main_test.go): long enough for
// the agent's next run to resume a released lease's pod, short enough that
// TestPaperclipReusableLease sees one suspended. Only reusable leases have an idle window.
const leaseIdleWindow = 30 * time.Second

// suspendTimeout bounds the wait for a released lease's suspension: its idle window, then the
// dispatcher's lease sweep (every 30 s, dispatch.DefaultLeaseSweepInterval), then the pod's
// deletion.
const suspendTimeout = leaseIdleWindow + 30*time.Second + 2*time.Minute

// TestPaperclipReusableLease runs one agent's issue three times through the real host on an
// environment with reuseLease, as docs/reuse.md (the host's rules §9) says the host does: the first run
// acquires a reusable lease, the second (right after) resumes its pod, the third (after the idle
// window) resumes it suspended: a new pod on the same volume. Each run finds what the earlier
// ones left in the workspace and in $HOME, the stub's earlier sessions among it (the host asks
// for a fresh session on each new lease row: hostRefusedSession). Closing the issue destroys the
// lease: pod and volume.
func TestPaperclipReusableLease(t *testing.T) {
	cs := clustertest.Clientset(t)
	pc := startServer(t)
	pt.CleanupTenant(t, cs, pc.CompanyID)
	// The company's model key is brokered, and each run's agent calls the model through the
	// credential broker: the grants its executes mint name the run that acquired the lease, and
	// must be bound to the pod that serves the lease now, a new one after the suspend (the
	// dispatcher's resumed event names it; no status does).
	key := newAnthropicKey()
	up := serveModelUpstream(t, key)
	pc.configurePlugin(t, map[string]any{"natsUrl": env.NATS.URL(), "brokeredKeys": []string{brokeredKey}})

	// Without this instance setting the host drops an issue's workspace preference, and every
	// run gets a new execution workspace, so a new lease (docs/reuse.md, the host's rules §10).
	pc.must(t, http.MethodPatch, "/instance/settings/experimental", map[string]any{"enableIsolatedWorkspaces": true}, nil)
	cfg := environmentConfig("pod", false)
	cfg["reuseLease"] = true
	reuse := pc.createEnvironment(t, "kubeclip-reuse", cfg)
	if reuse.Config["reuseLease"] != true {
		t.Fatalf("the stored environment config lost reuseLease: %v", reuse.Config)
	}
	pc.useEnvironment(t, reuse.ID)
	pc.setAgentEnv(t, map[string]string{"KUBECLIP_STUB_STATE": "1", brokeredKey: key, stubModelCall: "1"})

	var project struct {
		ID string `json:"id"`
	}
	pc.must(t, http.MethodPost, "/companies/"+pc.CompanyID+"/projects", map[string]any{
		"name":                     "Reuse",
		"executionWorkspacePolicy": map[string]any{"enabled": true, "defaultMode": "shared_workspace"},
	}, &project)
	var issue struct {
		ID         string `json:"id"`
		Identifier string `json:"identifier"`
	}
	pc.must(t, http.MethodPost, "/companies/"+pc.CompanyID+"/issues", map[string]any{
		"title": "Keep your workspace", "projectId": project.ID, "assigneeAgentId": pc.AgentID, "status": "todo",
		"executionWorkspacePreference": "reuse_existing",
	}, &issue)
	runs := &issueRuns{pc: pc, issueID: issue.ID, seen: map[string]bool{}}

	// Run A: the assignment acquires the lease; its release keeps the pod (retained).
	a := runs.next(t)
	recA := pc.waitRun(t, a.id, runTimeout)
	a.check(t, pc, recA)
	sessionA := deref(recA.SessionIDAfter)
	a.wantState(t, pc, "new session "+sessionA+"; other sessions in $HOME: []; workspace runs before: []; home runs before: []")
	leaseA := pc.leaseOf(t, reuse.ID, a.id, runTimeout)
	k := leaseA.Metadata.Kubeclip
	if leaseA.Status != "released" || k.RunID != a.id {
		t.Fatalf("run A's lease: %+v, want released, kubeclip's run %s", leaseA, a.id)
	}
	p, ns, claim := leaseA.ProviderLeaseID, k.Namespace, policy.LeaseClaimName(k.WorkloadName)
	if pods := podsIn(t, cs, ns); len(pods) != 1 {
		t.Errorf("after run A's release: pods %v in %s, want its one pod kept", pods, ns)
	}
	checkClaim(t, cs, ns, claim)
	r := follow(t, pc, a.id) // a reusable lease's events go to the run that acquired it
	pc.waitIdle(t, runTimeout)

	// Run B, within the idle window: the host resumes the retained pod.
	runs.comment(t, "Once more, on the same workspace.")
	b := runs.next(t)
	recB := pc.waitRun(t, b.id, runTimeout)
	b.check(t, pc, recB)
	// The host starts a fresh Claude session on a resumed lease: claude_local resumes a session
	// only on the same host lease row (adapter-utils execution-target.js
	// adapterExecutionTargetSessionMatches compares leaseId, the row's id), and a resume makes a
	// new row (docs/reuse.md, the host's rules §4). The earlier session is kept under $HOME all the same.
	sessionB := deref(recB.SessionIDAfter)
	b.hostRefusedSession(t, pc, sessionA)
	b.wantState(t, pc, fmt.Sprintf("new session %s; other sessions in $HOME: [%s]; workspace runs before: [%s]; home runs before: [%s]", sessionB, sessionA, a.id, a.id))
	leaseB := pc.leaseOf(t, reuse.ID, b.id, runTimeout)
	checkResumedRow(t, leaseB, p, a.id)
	resumedB := pt.WaitKind[events.RunResumedEvent](r, runTimeout)
	if resumedB.From != events.ResumedFromRetained || resumedB.Generation != 0 || resumedB.Resumes != 1 {
		t.Errorf("run B's resume: %+v, want from retained, generation 0, the first resume", resumedB)
	}
	checkResumedExpiry(t, leaseB, resumedB)
	pc.waitIdle(t, runTimeout)

	// The idle window passes: kubeclip deletes the pod and keeps the volume.
	suspended := pt.WaitKind[events.RunSuspendedEvent](r, suspendTimeout)
	if suspended.ProviderLeaseID != p || suspended.VolumeClaim != claim {
		t.Errorf("suspended %+v, want lease %s keeping %s", suspended, p, claim)
	}
	pt.Eventually(t, time.Minute, "the suspended lease's pod gone", func() bool { return len(podsIn(t, cs, ns)) == 0 })
	checkClaim(t, cs, ns, claim)

	// Run C: the host resumes the suspended lease: a new pod on the same volume.
	runs.comment(t, "And once more, after a pause.")
	c := runs.next(t)
	recC := pc.waitRun(t, c.id, runTimeout)
	c.check(t, pc, recC)
	sessions := []string{sessionA, sessionB}
	slices.Sort(sessions)
	c.hostRefusedSession(t, pc, sessionB)
	c.wantState(t, pc, fmt.Sprintf("new session %s; other sessions in $HOME: [%s]; workspace runs before: [%s %s]; home runs before: [%s %s]", deref(recC.SessionIDAfter), strings.Join(sessions, " "), a.id, b.id, a.id, b.id))
	leaseC := pc.leaseOf(t, reuse.ID, c.id, runTimeout)
	checkResumedRow(t, leaseC, p, a.id)
	var resumedC events.RunResumedEvent
	pt.Eventually(t, runTimeout, "run C's resume in kubeclip's run stream", func() bool {
		for _, e := range r.Events() {
			if ev, ok := e.Event.(events.RunResumedEvent); ok && ev.Resumes == 2 {
				resumedC = ev
				return true
			}
		}
		return false
	})
	if resumedC.From != events.ResumedFromSuspended || resumedC.Generation != 1 {
		t.Errorf("run C's resume: %+v, want from suspended, generation 1", resumedC)
	}
	checkResumedExpiry(t, leaseC, resumedC)
	checkClaim(t, cs, ns, claim)
	pc.waitIdle(t, runTimeout)

	// Every run's model call went through the broker with the real key: run C's from the pod
	// the lease was resumed onto, with placeholders bound to it by the resumed event.
	calls := up.seen()
	realKey := 0
	for _, c := range calls {
		if c.RealKey && !c.Placeholder {
			realKey++
		}
	}
	t.Logf("model calls through the broker: %d, with the real key at the stand-in %d (runs A, B retained, C resumed onto pod generation %d)", len(calls), realKey, resumedC.Generation)
	if len(calls) != 3 || realKey != 3 {
		t.Errorf("the model API's stand-in saw %d calls, %d with the real key; want one per run, 3, each with the real key (run C's after the resume onto a new pod)", len(calls), realKey)
	}

	// What each run cost at the plugin's hooks: one line per release, in order, and the resumes.
	released := pc.pluginLog(t, "lease released", a.id)
	wantHooks := []map[string]float64{
		{"acquireLease": 1, "realizeWorkspace": 1, "releaseLease": 1},
		{"resumeLease": 1, "realizeWorkspace": 1, "releaseLease": 1},
		{"resumeLease": 1, "realizeWorkspace": 1, "releaseLease": 1},
	}
	if len(released) != len(wantHooks) {
		t.Fatalf("%d 'lease released' records of lease %s, want one per run", len(released), p)
	}
	for i, rec := range released {
		hooks, _ := rec["hooks"].(map[string]any)
		for h, n := range wantHooks[i] {
			if num(hooks[h]) != n {
				t.Errorf("run %c's hooks %v, want %s × %v", 'A'+i, hooks, h, n)
			}
		}
		for _, h := range []string{"acquireLease", "resumeLease"} {
			if _, want := wantHooks[i][h]; !want && hooks[h] != nil {
				t.Errorf("run %c's hooks %v, want no %s", 'A'+i, hooks, h)
			}
		}
		t.Logf("run %c: hooks %v, executes %v, sync execs %v, release %v ms", 'A'+i, hooks, rec["executes"], rec["syncExecs"], rec["releaseMs"])
	}
	for _, rec := range pc.pluginLog(t, "lease resumed", a.id) {
		t.Logf("resume from %v (generation %v): %v ms", rec["from"], rec["generation"], rec["resumeMs"])
	}

	// The issue closed (the stub closed it; reopened, then cancelled): the host destroys the
	// lease, and kubeclip removes its pod and its volume.
	pc.must(t, http.MethodPatch, "/issues/"+issue.ID, map[string]any{"status": "backlog"}, nil)
	pc.must(t, http.MethodPatch, "/issues/"+issue.ID, map[string]any{"status": "cancelled"}, nil)
	pt.Eventually(t, runTimeout, "the lease destroyed by the host", func() bool {
		return len(pc.pluginLog(t, "lease destroyed", a.id)) == 1
	})
	pt.Eventually(t, 2*time.Minute, "the lease's pod and volume claim gone", func() bool {
		_, err := cs.CoreV1().PersistentVolumeClaims(ns).Get(t.Context(), claim, metav1.GetOptions{})
		return len(podsIn(t, cs, ns)) == 0 && apierrors.IsNotFound(err)
	})
	var leases []leaseRecord
	pc.must(t, http.MethodGet, "/environments/"+reuse.ID+"/leases", nil, &leases)
	for _, l := range leases {
		if l.ProviderLeaseID == p && l.Status != "expired" {
			t.Errorf("host lease row %s of %s: %s after the destroy, want every row expired", l.ID, p, l.Status)
		}
	}
}

// issueRuns finds an issue's runs as they start.
type issueRuns struct {
	pc      *server
	issueID string
	seen    map[string]bool
}

// issueRun is one run of the issue.
type issueRun struct{ id string }

// next waits for a run of the issue it has not returned before.
func (ir *issueRuns) next(t *testing.T) issueRun {
	t.Helper()
	var id string
	pt.Eventually(t, time.Minute, "the issue's next run", func() bool {
		var runs []struct {
			RunID string `json:"runId"`
		}
		ir.pc.must(t, http.MethodGet, "/issues/"+ir.issueID+"/runs", nil, &runs)
		for _, r := range runs {
			if !ir.seen[r.RunID] {
				id = r.RunID
				return true
			}
		}
		return false
	})
	ir.seen[id] = true
	return issueRun{id: id}
}

// comment reopens the issue with a comment, which wakes its agent.
func (ir *issueRuns) comment(t *testing.T, body string) {
	t.Helper()
	ir.pc.must(t, http.MethodPost, "/issues/"+ir.issueID+"/comments", map[string]any{"body": body, "reopen": true}, nil)
}

func (r issueRun) check(t *testing.T, pc *server, rec runRecord) {
	t.Helper()
	if rec.Status != "succeeded" {
		t.Fatalf("run %s: %s (%s), want succeeded\nlog:\n%s", r.id, rec.Status, deref(rec.Error), logText(pc.runLog(t, r.id)))
	}
}

// stateLine is the stub's stderr line about what earlier runs left (KUBECLIP_STUB_STATE).
var stateLine = regexp.MustCompile(`claude-stub: (?:new|resumed|session) .*`)

// wantState checks the stub's line about what earlier runs left in the pod.
func (r issueRun) wantState(t *testing.T, pc *server, want string) {
	t.Helper()
	got := stateLine.FindAllString(stderrText(pc.runLog(t, r.id)), -1)
	if !slices.Equal(got, []string{"claude-stub: " + want}) {
		t.Errorf("run %s: the stub said %q, want %q", r.id, got, "claude-stub: "+want)
	}
}

// hostRefusedSession checks that Paperclip's claude_local adapter said it would not resume the
// previous run's session on this run's lease (a new host lease row).
func (r issueRun) hostRefusedSession(t *testing.T, pc *server, session string) {
	t.Helper()
	want := `[paperclip] Claude session "` + session + `" does not match the current remote execution identity`
	var out strings.Builder
	for _, e := range pc.runLog(t, r.id) {
		out.WriteString(e.Chunk)
	}
	if !strings.Contains(out.String(), want) {
		t.Errorf("run %s: the host's log lacks %q: does claude_local now resume a session on a resumed lease? Then the stub's resumed line is what to expect", r.id, want)
	}
}

// checkResumedRow checks a resumed run's host lease row: released, on lease p, resumed, and
// kubeclip's metadata still the first run's (the answer to the resume carried it back).
func checkResumedRow(t *testing.T, l leaseRecord, p, firstRun string) {
	t.Helper()
	if l.Status != "released" || l.ProviderLeaseID != p || l.Metadata.Kubeclip.RunID != firstRun {
		t.Errorf("lease row %s: %s on %s of kubeclip run %s, want released on %s of %s", l.ID, l.Status, l.ProviderLeaseID, l.Metadata.Kubeclip.RunID, p, firstRun)
	}
}

// checkResumedExpiry checks that the host's row of a resumed lease holds the expiry kubeclip's
// resume renewed (the plugin's answer), a fresh one: later than the row's previous run ended.
func checkResumedExpiry(t *testing.T, l leaseRecord, ev events.RunResumedEvent) {
	t.Helper()
	switch {
	case ev.ExpiresAt == nil:
		t.Errorf("resumed %+v carries no expiresAt", ev)
	case l.ExpiresAt == nil || !l.ExpiresAt.Equal(*ev.ExpiresAt):
		t.Errorf("lease row %s expires at %v, want the resume's %s", l.ID, l.ExpiresAt, ev.ExpiresAt)
	case !ev.ExpiresAt.After(ev.At):
		t.Errorf("resumed %+v: an expiry no later than the resume", ev)
	}
}

func podsIn(t *testing.T, cs kubernetes.Interface, ns string) []string {
	t.Helper()
	pods, err := cs.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			names = append(names, p.Name)
		}
	}
	return names
}

// checkClaim checks that the lease's volume claim is there, bound.
func checkClaim(t *testing.T, cs kubernetes.Interface, ns, name string) {
	t.Helper()
	pvc, err := cs.CoreV1().PersistentVolumeClaims(ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil || pvc.Status.Phase != "Bound" {
		t.Errorf("volume claim %s/%s: %v, want it kept, bound", ns, name, err)
	}
}
