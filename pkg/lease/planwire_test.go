package lease_test

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
)

// TestDecodeIsTheDecidedPlan: the plan the dispatcher decodes from a dispatch is the one the
// tenant-worker decided, field for field, for every shape of config the plan has; only the
// deadline is computed again, from the same inputs at the dispatcher's now.
func TestDecodeIsTheDecidedPlan(t *testing.T) {
	configs := map[string]func(*events.AcquireRequest){
		"defaults": nil,
		"job":      func(r *events.AcquireRequest) { r.Config = json.RawMessage(`{"backend":"job"}`) },
		"pod, everything set": func(r *events.AcquireRequest) {
			r.Config = json.RawMessage(`{"backend":"pod","namespacePrefix":"t-","companySlug":"widgets","imageRegistry":"registry.example.com/mirror/",
				"imagePullSecrets":["pull"],"egressAllowFqdns":["example.com"],"egressAllowCidrs":["203.0.113.0/24"],
				"defaultResources":{"requests":{"cpu":"250m"},"limits":{"memory":"1Gi"}},
				"jobTtlSecondsAfterFinished":60,"podActivityDeadlineSec":600,
				"adapters":[{"adapterType":"claude_local","enabled":true,"runtimeImage":"reg.example.com/claude:v3","envKeys":["ANTHROPIC_API_KEY"],"defaultEnv":{"X":"1"}}]}`)
			r.ExecutionWorkspaceSettings = json.RawMessage(`{"networkEgress":{"allowFqdns":["api.example.com"],"allowCidrs":[]}}`)
		},
		"registry adapter, per-run adapter and a bounded lease": func(r *events.AcquireRequest) {
			r.AdapterType = "mine"
			r.RequestedExpiresAt = "2026-08-24T11:30:00Z"
			r.Config = json.RawMessage(`{"adapterType":"mine","adapters":[{"adapterType":"mine","runtimeImage":"reg.example.com/mine:v2","probeCommand":["mine","--version"]}]}`)
		},
	}
	for name, mod := range configs {
		t.Run(name, func(t *testing.T) {
			req := acquire(mod)
			plan, err := lease.New(req, now, testOperator)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			data, err := plan.Encode()
			if err != nil {
				t.Fatal(err)
			}
			got, err := lease.Decode(req, data, now, testOperator)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if diff := cmp.Diff(plan, got); diff != "" {
				t.Errorf("decoded plan differs from the decided one (-decided +decoded):\n%s", diff)
			}
			// A dispatch an hour later (parked behind the agent's run) counts the deadline from
			// then: a requested expiry stays where it was, an activity deadline starts again.
			later, err := lease.Decode(req, data, now.Add(time.Hour), testOperator)
			if err != nil && req.RequestedExpiresAt == "" {
				t.Fatalf("Decode an hour later: %v", err)
			}
			if err == nil && plan.Deadline != nil && req.RequestedExpiresAt == "" && !later.Deadline.HardStopAt.Equal(plan.Deadline.HardStopAt.Add(time.Hour)) {
				t.Errorf("an hour later the hard stop is %s, want %s", later.Deadline.HardStopAt, plan.Deadline.HardStopAt.Add(time.Hour))
			}
		})
	}
}

func TestDecodeRefusesABrokenPlan(t *testing.T) {
	req := acquire(nil)
	for name, data := range map[string]string{
		"not JSON":     `{`,
		"no namespace": `{"image":"i","config":{"backend":"pod"}}`,
		"empty":        `{}`,
	} {
		t.Run(name, func(t *testing.T) {
			_, err := lease.Decode(req, json.RawMessage(data), now, testOperator)
			te, ok := events.AsTerminal(err)
			if !ok || te.Code != events.CodeInternal || te.Field != "plan" {
				t.Errorf("Decode(%s) = %v, want a terminal internal error on plan", data, err)
			}
		})
	}
}

// TestPlanIsDecidedOnce: the plan is decided where the acquire is accepted and nowhere else.
// Outside pkg/lease and pkg/policy, only the tenant-worker may call lease.New, and only the
// config validation service (pkg/api, what Paperclip's validateConfig asks) may parse a
// provider config: a second call to either in a worker would make a plan decision in two
// places, which can disagree after a rule changes in one.
func TestPlanIsDecidedOnce(t *testing.T) {
	allowed := map[string][]string{
		"lease.New":          {"pkg/tenant"},
		"policy.ParseConfig": {"pkg/api"},
	}
	root := filepath.Join("..", "..")
	found := map[string][]string{}
	for _, dir := range []string{"pkg", "cmd", "internal"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			rel, _ := filepath.Rel(root, path)
			pkg := filepath.ToSlash(filepath.Dir(rel))
			if pkg == "pkg/lease" || pkg == "pkg/policy" {
				return nil
			}
			f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			imports := map[string]string{} // local name → import path
			for _, imp := range f.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				name := p[strings.LastIndex(p, "/")+1:]
				if imp.Name != nil {
					name = imp.Name.Name
				}
				imports[name] = p
			}
			ast.Inspect(f, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				x, ok := sel.X.(*ast.Ident)
				if !ok {
					return true
				}
				switch {
				case imports[x.Name] == "github.com/kubeclip/kubeclip/pkg/lease" && sel.Sel.Name == "New":
					found["lease.New"] = append(found["lease.New"], rel)
				case imports[x.Name] == "github.com/kubeclip/kubeclip/pkg/policy" && sel.Sel.Name == "ParseConfig":
					found["policy.ParseConfig"] = append(found["policy.ParseConfig"], rel)
				}
				return true
			})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for fn, files := range found {
		for _, f := range files {
			if !slicesContainsDir(allowed[fn], f) {
				t.Errorf("%s calls %s: the plan is decided once, by the tenant-worker (lease.New); the dispatcher takes it from the dispatch (lease.Decode)", f, fn)
			}
		}
	}
	if len(found["lease.New"]) == 0 {
		t.Error("no call to lease.New found: the test no longer sees the tenant-worker's")
	}
}

func slicesContainsDir(dirs []string, file string) bool {
	for _, d := range dirs {
		if strings.HasPrefix(filepath.ToSlash(file), d+"/") {
			return true
		}
	}
	return false
}
