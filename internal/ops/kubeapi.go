package ops

import (
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// newKubeRequests is kubeclip_kubernetes_requests_total{method, code}: every request a worker's
// Kubernetes clients sent, by HTTP method and the answer's status code ("error" when none came:
// a connection refused, a timeout). Both labels are bounded (a few methods, the status codes the
// API server uses); paths are not a label: they hold namespaces and object names.
func newKubeRequests(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kubeclip_kubernetes_requests_total",
		Help: "Kubernetes API requests by HTTP method and status code (\"error\": no answer, such as a refused connection or a timeout); 429 is the API server's rate limit, 5xx its errors.",
	}, []string{"method", "code"})
	return c, reg.Register(c)
}

// KubernetesTransport wraps the transport of a worker's Kubernetes clients (rest.Config.Wrap) so
// every request is counted in kubeclip_kubernetes_requests_total. It is done at the transport,
// not with client-go's global metrics hook (k8s.io/client-go/tools/metrics), so each process's
// registry holds its own count and nothing is registered globally.
func (m *Metrics) KubernetesTransport(rt http.RoundTripper) http.RoundTripper {
	return kubeCounting{next: rt, requests: m.kubeRequests}
}

type kubeCounting struct {
	next     http.RoundTripper
	requests *prometheus.CounterVec
}

// knownMethods keep the method label bounded whatever a client sends.
var knownMethods = map[string]bool{
	http.MethodGet: true, http.MethodPost: true, http.MethodPut: true, http.MethodPatch: true,
	http.MethodDelete: true, http.MethodHead: true, http.MethodOptions: true,
}

func (k kubeCounting) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := k.next.RoundTrip(req)
	method := req.Method
	if !knownMethods[method] {
		method = "other"
	}
	code := "error"
	if err == nil {
		code = strconv.Itoa(resp.StatusCode)
	}
	k.requests.WithLabelValues(method, code).Inc()
	return resp, err
}
