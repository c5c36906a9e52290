// Package monitoring_test checks deploy/kustomize/components/monitoring against the workers: the
// component renders on top of the production overlay, its dashboard ConfigMap carries
// dashboard.json unchanged, its rules load as a Prometheus rule file, and every PrometheusRule expr and dashboard panel query parses with
// Prometheus' own PromQL parser and names only metrics the workers export (taken from the
// registry every worker builds, app.Common.StartOps) or that Prometheus makes itself (up).
package monitoring_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/kubeclip/kubeclip/internal/app"
	"github.com/kubeclip/kubeclip/internal/clustertest"
	"github.com/kubeclip/kubeclip/internal/ops"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// root is the repository root, seen from this package.
const root = "../.."

const component = "deploy/kustomize/components/monitoring"

// TestRulesAndPanelsNameExportedMetrics is the check the issue asks for: a typo in a metric
// name, or a metric a worker stopped exporting, fails it.
func TestRulesAndPanelsNameExportedMetrics(t *testing.T) {
	exported := exportedMetrics(t)
	objs := render(t)
	queries := append(ruleExprs(t, objs), panelExprs(t, dashboardOf(t, objs))...)
	if len(queries) < 20 {
		t.Fatalf("found %d queries, want the component's rules and panels (20 or more)", len(queries))
	}
	for _, q := range queries {
		if err := checkQuery(q.expr, exported); err != nil {
			t.Errorf("%s: %v\n%s", q.where, err, q.expr)
		}
	}
}

// TestCheckQueryCatchesMistakes: the check fails a misspelt metric, a histogram suffix on a
// metric that is not a histogram, an unparsable query and a Grafana variable it does not know.
func TestCheckQueryCatchesMistakes(t *testing.T) {
	exported := exportedMetrics(t)
	tests := []struct {
		name, expr string
		wantErr    string // "" : valid
	}{
		{"exported gauge", `max(kubeclip_runs_in_flight) > 0`, ""},
		{"histogram bucket", `histogram_quantile(0.9, sum by (le) (rate(kubeclip_acquire_ready_seconds_bucket[$__rate_interval])))`, ""},
		{"prometheus-made up", `up{job="kubeclip"} == 0`, ""},
		{"go collector summary", `go_gc_duration_seconds_count`, ""},
		{"a typo", `max(kubeclip_runs_in_flihgt) > 0`, `"kubeclip_runs_in_flihgt" is not exported`},
		{"a typo in a range", `rate(kubeclip_leses[5m])`, `"kubeclip_leses" is not exported`},
		{"bucket of a gauge", `kubeclip_runs_in_flight_bucket`, `"kubeclip_runs_in_flight_bucket" is not exported`},
		{"by __name__", `{__name__="kubeclip_nope"}`, `"kubeclip_nope" is not exported`},
		{"no metric name", `{job="kubeclip"}`, "no metric name"},
		{"unparsable", `sum(rate(kubeclip_leases[5m])`, "parsing"},
		{"unknown variable", `rate(kubeclip_log_bytes_total[$window])`, "$window"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := checkQuery(tc.expr, exported)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("checkQuery(%q) = %v, want nil", tc.expr, err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("checkQuery(%q) = %v, want an error with %q", tc.expr, err, tc.wantErr)
			}
		})
	}
}

// TestRulesLoadInPrometheus: each PrometheusRule's groups load as Prometheus loads a rule file
// (rulefmt: alert names, durations, label and annotation templates, exprs).
func TestRulesLoadInPrometheus(t *testing.T) {
	n := 0
	for _, o := range render(t) {
		if o.GetKind() != "PrometheusRule" {
			continue
		}
		n++
		spec, _, _ := unstructured.NestedMap(o.Object, "spec")
		file, err := sigsyaml.Marshal(spec)
		if err != nil {
			t.Fatal(err)
		}
		groups, errs := rulefmt.Parse(file, false, model.UTF8Validation)
		for _, err := range errs {
			t.Errorf("PrometheusRule %s: %v", o.GetName(), err)
		}
		if len(errs) == 0 && len(groups.Groups) == 0 {
			t.Errorf("PrometheusRule %s has no groups", o.GetName())
		}
	}
	if n == 0 {
		t.Fatal("no PrometheusRule rendered")
	}
}

// TestDashboardConfigMapIsTheFile: the ConfigMap the Grafana sidecar loads is generated from
// dashboard.json, the one source, and carries the sidecar's label.
func TestDashboardConfigMapIsTheFile(t *testing.T) {
	objs := render(t)
	cm := find(t, objs, "ConfigMap", "kubeclip-dashboard")
	if got := cm.GetLabels()["grafana_dashboard"]; got != "1" {
		t.Errorf("label grafana_dashboard = %q, want \"1\"", got)
	}
	file, err := os.ReadFile(filepath.Join(root, component, "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	if got := dashboardOf(t, objs); got != string(file) {
		t.Error("the ConfigMap's kubeclip.json is not dashboard.json")
	}
	for _, kind := range []string{"PrometheusRule", "PodMonitor"} {
		for _, o := range objs {
			if o.GetKind() == kind && o.GetNamespace() != "kubeclip" {
				t.Errorf("%s %s in namespace %q, want kubeclip's", kind, o.GetName(), o.GetNamespace())
			}
		}
	}
}

// TestPodMonitorScrapesEveryWorker: the PodMonitor's selector matches the pods of all five
// worker Deployments, each of which names the port it scrapes, and it sets the job and worker
// labels the rules and panels select on.
func TestPodMonitorScrapesEveryWorker(t *testing.T) {
	objs := render(t)
	pm := find(t, objs, "PodMonitor", "kubeclip-workers")
	selector, _, _ := unstructured.NestedStringMap(pm.Object, "spec", "selector", "matchLabels")
	endpoints, _, _ := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
	if len(endpoints) != 1 {
		t.Fatalf("%d podMetricsEndpoints, want 1", len(endpoints))
	}
	endpoint, _ := endpoints[0].(map[string]any)
	port, _ := endpoint["port"].(string)
	relabeled := map[string]bool{}
	relabelings, _ := endpoint["relabelings"].([]any)
	for _, r := range relabelings {
		if rl, ok := r.(map[string]any); ok {
			relabeled[fmt.Sprint(rl["targetLabel"])] = true
		}
	}
	if !relabeled["job"] || !relabeled["worker"] {
		t.Errorf("relabelings set %v, want job and worker", relabeled)
	}
	var scraped []string
	for _, o := range objs {
		if o.GetKind() != "Deployment" {
			continue
		}
		podLabels, _, _ := unstructured.NestedStringMap(o.Object, "spec", "template", "metadata", "labels")
		matches := true
		for k, v := range selector {
			matches = matches && podLabels[k] == v
		}
		if !matches {
			continue
		}
		containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		named := false
		for _, c := range containers {
			ports, _, _ := unstructured.NestedSlice(c.(map[string]any), "ports")
			for _, p := range ports {
				named = named || p.(map[string]any)["name"] == port
			}
		}
		if !named {
			t.Errorf("Deployment %s has no container port %q to scrape", o.GetName(), port)
		}
		scraped = append(scraped, o.GetName())
	}
	slices.Sort(scraped)
	if want := []string{"credential-broker", "dispatcher", "exec-worker", "run-watcher", "tenant-worker"}; !slices.Equal(scraped, want) {
		t.Errorf("the PodMonitor selects the pods of %v, want %v", scraped, want)
	}
}

// exportedMetrics is every metric a worker's registry describes (app.Common.StartOps builds it
// for every worker), with its kind. The ops server is on, on a free port, so what it registers
// (kubeclip_ready) is in too.
func exportedMetrics(t *testing.T) map[string]ops.Kind {
	t.Helper()
	c := app.Common{OpsAddr: "127.0.0.1:0"}
	log := zerolog.New(zerolog.NewTestWriter(t))
	o, err := c.StartOps(t.Context(), log)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close(log)
	return o.Registry.Exported()
}

// prometheusMade are the series Prometheus adds to every scrape target.
var prometheusMade = []string{"up", "scrape_duration_seconds", "scrape_samples_scraped", "scrape_samples_post_metric_relabeling", "scrape_series_added"}

// grafanaVariables are the Grafana macros the panels may use, each replaced by a duration so
// the query parses as Prometheus will receive it.
var grafanaVariables = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h")

var variable = regexp.MustCompile(`\$\{?\w+`)

// checkQuery parses expr and checks every metric it selects is exported (a histogram's _bucket,
// _sum and _count and a summary's _sum and _count are its own).
func checkQuery(expr string, exported map[string]ops.Kind) error {
	expr = grafanaVariables.Replace(expr)
	if v := variable.FindString(expr); v != "" {
		return fmt.Errorf("unknown Grafana variable %s", v)
	}
	parsed, err := parser.ParseExpr(expr)
	if err != nil {
		return fmt.Errorf("parsing: %w", err)
	}
	var errs []error
	parser.Inspect(parsed, func(node parser.Node, _ []parser.Node) error {
		vs, ok := node.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if m.Name == model.MetricNameLabel && m.Type == labels.MatchEqual {
				name = m.Value
			}
		}
		switch {
		case name == "":
			errs = append(errs, fmt.Errorf("selector %s has no metric name", vs))
		case !isExported(name, exported):
			errs = append(errs, fmt.Errorf("%q is not exported by the workers", name))
		}
		return nil
	})
	return errors.Join(errs...)
}

func isExported(name string, exported map[string]ops.Kind) bool {
	if _, ok := exported[name]; ok || slices.Contains(prometheusMade, name) {
		return true
	}
	for suffix, kinds := range map[string][]ops.Kind{
		"_bucket": {ops.KindHistogram},
		"_sum":    {ops.KindHistogram, ops.KindSummary},
		"_count":  {ops.KindHistogram, ops.KindSummary},
	} {
		if base, ok := strings.CutSuffix(name, suffix); ok && slices.Contains(kinds, exported[base]) {
			return true
		}
	}
	return false
}

type query struct{ where, expr string }

// ruleExprs are the exprs of every PrometheusRule's rules.
func ruleExprs(t *testing.T, objs []*unstructured.Unstructured) []query {
	t.Helper()
	var out []query
	for _, o := range objs {
		if o.GetKind() != "PrometheusRule" {
			continue
		}
		groups, _, _ := unstructured.NestedSlice(o.Object, "spec", "groups")
		for _, g := range groups {
			group, _ := g.(map[string]any)
			rules, _ := group["rules"].([]any)
			for _, r := range rules {
				rule, _ := r.(map[string]any)
				expr, _ := rule["expr"].(string)
				name, _ := rule["alert"].(string)
				if name == "" {
					name, _ = rule["record"].(string)
				}
				if expr == "" {
					t.Errorf("rule %s of %s has no expr", name, o.GetName())
				}
				out = append(out, query{where: "rule " + name, expr: expr})
			}
		}
	}
	if len(out) == 0 {
		t.Fatal("no PrometheusRule rules rendered")
	}
	return out
}

// panelExprs are the target exprs of every panel of the dashboard, rows' panels included.
func panelExprs(t *testing.T, dashboard string) []query {
	t.Helper()
	type panel struct {
		Title   string  `json:"title"`
		Panels  []panel `json:"panels"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	}
	var d struct {
		Panels []panel `json:"panels"`
	}
	if err := json.Unmarshal([]byte(dashboard), &d); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	var out []query
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				out = append(out, query{where: "panel " + p.Title, expr: tg.Expr})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

func dashboardOf(t *testing.T, objs []*unstructured.Unstructured) string {
	t.Helper()
	cm := find(t, objs, "ConfigMap", "kubeclip-dashboard")
	s, _, _ := unstructured.NestedString(cm.Object, "data", "kubeclip.json")
	return s
}

func find(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	t.Fatalf("no %s %s rendered", kind, name)
	return nil
}

// render builds the production overlay with the monitoring component, as an operator's
// overlay does (the component's kustomization.yaml).
func render(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	dir := t.TempDir()
	rel := func(p string) string {
		abs, err := filepath.Abs(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		r, err := filepath.Rel(dir, abs)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	k := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - %s\ncomponents:\n  - %s\n",
		rel("deploy/kustomize/overlays/production"), rel(component))
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd := exec.Command(kubectl(t), "kustomize", dir)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl kustomize: %v\n%s", err, stderr.String())
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	var objs []*unstructured.Unstructured
	for {
		var o unstructured.Unstructured
		if err := dec.Decode(&o.Object); errors.Is(err, io.EOF) {
			return objs
		} else if err != nil {
			t.Fatal(err)
		}
		if len(o.Object) > 0 {
			objs = append(objs, &o)
		}
	}
}

// kubectl returns the path of kubectl (clustertest.Kubectl).
func kubectl(t *testing.T) string { return clustertest.Kubectl(t, root) }
