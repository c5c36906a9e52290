package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
)

// The proxy forwards every request and counts it by verb, a watch as WATCH.
func TestAPIProxyCountsByVerb(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, r.Method+" "+r.URL.Path)
	}))
	defer upstream.Close()
	p, err := startAPIProxy(&rest.Config{Host: upstream.URL})
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	base := "http://" + p.ln.Addr().String()
	before := p.snapshot()
	for _, req := range []struct{ method, path string }{
		{http.MethodGet, "/api/v1/pods?watch=true"}, {http.MethodGet, "/api/v1/pods"},
		{http.MethodPost, "/api/v1/namespaces/x/pods"}, {http.MethodPost, "/api/v1/namespaces/x/secrets"},
	} {
		r, _ := http.NewRequest(req.method, base+req.path, strings.NewReader("{}"))
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := req.method + " " + strings.Split(req.path, "?")[0]; string(body) != want {
			t.Errorf("%s %s: upstream answered %q, want %q", req.method, req.path, body, want)
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
