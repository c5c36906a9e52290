package main

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// The proxy forwards every request and counts it by verb, a watch as WATCH. A client built from
// the kubeconfig it writes reaches it over TLS and speaks HTTP/2, as to the API server: its
// requests share a connection instead of holding one each.
func TestAPIProxyCountsByVerb(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, r.Method+" "+r.URL.Path)
	}))
	defer upstream.Close()
	pki, _ := testCA(t)
	p, err := startAPIProxy(&rest.Config{Host: upstream.URL}, pki)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	kubeconfig, err := p.writeKubeconfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	transport, err := rest.TransportFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: transport}
	before := p.snapshot()
	for _, req := range []struct{ method, path string }{
		{http.MethodGet, "/api/v1/pods?watch=true"}, {http.MethodGet, "/api/v1/pods"},
		{http.MethodPost, "/api/v1/namespaces/x/pods"}, {http.MethodPost, "/api/v1/namespaces/x/secrets"},
	} {
		r, _ := http.NewRequest(req.method, cfg.Host+req.path, strings.NewReader("{}"))
		resp, err := client.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := req.method + " " + strings.Split(req.path, "?")[0]; string(body) != want {
			t.Errorf("%s %s: upstream answered %q, want %q", req.method, req.path, body, want)
		}
		if resp.Proto != "HTTP/2.0" {
			t.Errorf("%s %s: the client spoke %s to the proxy, want HTTP/2.0", req.method, req.path, resp.Proto)
		}
	}
	got := p.snapshot().since(before)
	if got.String() != "GET 1, POST 2, WATCH 1" || got.total() != 4 {
		t.Errorf("counts = %q (total %d), want GET 1, POST 2, WATCH 1", got, got.total())
	}
}

func TestPercentile(t *testing.T) {
	ms := []float64{5, 1, 4, 2, 3, 6, 7, 8, 9, 10}
	for _, c := range []struct{ p, want float64 }{{50, 5}, {99, 10}, {100, 10}, {1, 1}} {
		if got := percentile(ms, c.p); got != c.want {
			t.Errorf("p%v = %v, want %v", c.p, got, c.want)
		}
	}
	if got := percentile(nil, 99); got != 0 {
		t.Errorf("p99 of nothing = %v, want 0", got)
	}
}

// The report orders the sizes, writes a row per metric and an SVG that parses.
func TestWriteReport(t *testing.T) {
	dir := t.TempDir()
	results := []sizeResult{
		{Leases: 10000, CreatedP99Ms: 900, Workers: map[string]workerCost{rw: {RSSPerLeaseKiB: 12}}},
		{Leases: 1000, CreatedP99Ms: 100.5, Workers: map[string]workerCost{rw: {RSSPerLeaseKiB: 8}}},
	}
	var out strings.Builder
	if err := writeReport(&out, dir, results); err != nil {
		t.Fatal(err)
	}
	table := out.String()
	if i, j := strings.Index(table, "1000 pod"), strings.Index(table, "10000 pod"); i < 0 || j < 0 || i > j {
		t.Errorf("sizes not in order in:\n%s", table)
	}
	if !strings.Contains(table, "acquire → created p99|        ms|    100.50|        900|") {
		t.Errorf("no p99 row with both sizes in:\n%s", table)
	}
	svg, err := os.ReadFile(filepath.Join(dir, "scale.svg"))
	if err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(bytes.NewReader(svg))
	for {
		if _, err := dec.Token(); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("scale.svg does not parse: %v", err)
		}
	}
}

// Each backend gets its own column set, the pod backend's first, each in size order; a result
// from before the backend was recorded is the pod backend's.
func TestWriteReportOneColumnSetPerBackend(t *testing.T) {
	var out strings.Builder
	results := []sizeResult{{Leases: 3000, Backend: "job"}, {Leases: 1000, Backend: "job"}, {Leases: 3000}, {Leases: 1000, Backend: "pod"}}
	if err := writeReport(&out, t.TempDir(), results); err != nil {
		t.Fatal(err)
	}
	header := strings.SplitN(out.String(), "\n", 2)[0]
	var cols []string
	for f := range strings.SplitSeq(header, "|") {
		if f = strings.TrimSpace(f); strings.HasSuffix(f, " pod") || strings.HasSuffix(f, " job") {
			cols = append(cols, f)
		}
	}
	if got, want := strings.Join(cols, ", "), "1000 pod, 3000 pod, 1000 job, 3000 job"; got != want {
		t.Errorf("columns = %q, want %q (header %q)", got, want, header)
	}
}

func TestParseSettingsBackends(t *testing.T) {
	base := []string{"--kubeconfig", "k", "--kwok", "w", "--cluster-pki", "/p"}
	for _, tc := range []struct {
		args    []string
		want    string
		wantErr string
	}{
		{args: nil, want: "pod"},
		{args: []string{"--backends", "pod,job"}, want: "pod,job"},
		{args: []string{"--backends", "sandbox"}, wantErr: `"sandbox" is neither pod nor job`},
		{args: []string{"--backends", "pod,pod"}, wantErr: `"pod" twice`},
	} {
		s, err := parseSettings(append(slices.Clone(base), tc.args...), io.Discard)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%v: error = %v, want %q", tc.args, err, tc.wantErr)
			}
			continue
		}
		if err != nil || strings.Join(s.backends, ",") != tc.want {
			t.Errorf("%v: backends = %v, %v; want %s", tc.args, s.backends, err, tc.want)
		}
	}
	if _, err := parseSettings([]string{"--kubeconfig", "k", "--kwok", "w"}, io.Discard); err == nil || !strings.Contains(err.Error(), "--cluster-pki are required") {
		t.Errorf("without --cluster-pki: error = %v, want it required", err)
	}
}

// waitFor gives up when the tally stands still for its stall time, not after it in total: runs
// created one after the other, each within the stall time, are waited for however long they
// take together.
func TestWaitForTimesOutOnAStallOnly(t *testing.T) {
	r := &runs{byID: map[string]*runSeen{}, changed: make(chan struct{})}
	ids := []string{"a", "b", "c", "d", "e"}
	const stall = 300 * time.Millisecond
	go func() {
		for _, id := range ids {
			time.Sleep(stall / 3) // progress, each step well within the stall time
			r.record(events.RunCreatedEvent{RunID: id}, time.Now())
		}
	}()
	start := time.Now()
	if _, err := r.waitFor(context.Background(), ids, stall, func(t tally) bool { return t.created == len(ids) }); err != nil {
		t.Fatalf("steady progress: %v", err)
	}
	if took := time.Since(start); took < stall {
		t.Fatalf("the runs came in %s, before one stall time: the test proves nothing", took)
	}
	_, err := r.waitFor(context.Background(), append(ids, "never"), stall, func(t tally) bool { return t.created == len(ids)+1 })
	if err == nil || !strings.Contains(err.Error(), "no progress for 300ms (created 5,") {
		t.Errorf("no progress: error = %v, want one naming the stall and the counts", err)
	}
}
