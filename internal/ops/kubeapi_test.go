package ops_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kubeclip/kubeclip/internal/ops"
)

// TestKubernetesTransportCountsRequests: a clientset built on a config wrapped with
// KubernetesTransport counts every request by method and status code, and a request that got
// no answer as "error".
func TestKubernetesTransportCountsRequests(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/version":
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"major":"1","minor":"34","gitVersion":"v1.34.0"}`))
		case r.Method == http.MethodDelete:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusForbidden)
			_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Forbidden","code":403}`))
		default:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`))
		}
	}))
	defer api.Close()
	reg := prometheus.NewRegistry()
	m, err := ops.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	clientset := func(host string) kubernetes.Interface {
		cfg := &rest.Config{Host: host}
		cfg.Wrap(m.KubernetesTransport)
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return cs
	}
	cs := clientset(api.URL)
	ctx := t.Context()
	if _, err := cs.Discovery().ServerVersion(); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Pods("ns").Get(ctx, "p", metav1.GetOptions{}); err == nil {
		t.Fatal("get: want NotFound")
	}
	if err := cs.CoreV1().Pods("ns").Delete(ctx, "p", metav1.DeleteOptions{}); err == nil {
		t.Fatal("delete: want Forbidden")
	}
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close() // nothing listens there now
	if _, err := clientset(gone.URL).CoreV1().Pods("ns").Get(ctx, "p", metav1.GetOptions{}); err == nil {
		t.Fatal("get from a closed server: want an error")
	}

	want := `
# HELP kubeclip_kubernetes_requests_total Kubernetes API requests by HTTP method and status code ("error": no answer, such as a refused connection or a timeout); 429 is the API server's rate limit, 5xx its errors.
# TYPE kubeclip_kubernetes_requests_total counter
kubeclip_kubernetes_requests_total{code="200",method="GET"} 1
kubeclip_kubernetes_requests_total{code="403",method="DELETE"} 1
kubeclip_kubernetes_requests_total{code="404",method="GET"} 1
kubeclip_kubernetes_requests_total{code="error",method="GET"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kubeclip_kubernetes_requests_total"); err != nil {
		t.Error(err)
	}
}

// TestLifecycleMetrics: the acquire latencies and takeovers the dispatcher and run-watcher
// report land in their histograms and counter.
func TestLifecycleMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := ops.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.RunCreated(300 * time.Millisecond)
	m.RunReady(4 * time.Second)
	m.RunReady(40 * time.Second)
	m.RunTakenOver()
	if got := value(t, reg, "kubeclip_run_takeovers_total"); got != 1 {
		t.Errorf("takeovers = %v, want 1", got)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]uint64{}
	sums := map[string]float64{}
	for _, mf := range mfs {
		if h := mf.GetMetric(); len(h) == 1 && h[0].Histogram != nil {
			counts[mf.GetName()] = h[0].GetHistogram().GetSampleCount()
			sums[mf.GetName()] = h[0].GetHistogram().GetSampleSum()
		}
	}
	if counts["kubeclip_acquire_created_seconds"] != 1 || sums["kubeclip_acquire_created_seconds"] != 0.3 {
		t.Errorf("acquire_created: count %d sum %v, want 1 and 0.3", counts["kubeclip_acquire_created_seconds"], sums["kubeclip_acquire_created_seconds"])
	}
	if counts["kubeclip_acquire_ready_seconds"] != 2 || sums["kubeclip_acquire_ready_seconds"] != 44 {
		t.Errorf("acquire_ready: count %d sum %v, want 2 and 44", counts["kubeclip_acquire_ready_seconds"], sums["kubeclip_acquire_ready_seconds"])
	}
}
