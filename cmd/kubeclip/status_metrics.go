package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The metrics status reads from a worker's /metrics page.
const (
	// metricExecStreams is the exec-worker's live exec sessions (internal/ops).
	metricExecStreams = "kubeclip_exec_streams"
	// metricPermissionMissing {kind="kubernetes"|"nats", permission} is 1 for each permission the
	// worker's start-up self-check found missing; metricSelfCheckOK is 1 when it found none.
	metricPermissionMissing = "kubeclip_permission_missing"
	metricSelfCheckOK       = "kubeclip_self_check_ok"
	// maxMetricsPageBytes bounds what one scrape reads: a worker's page is tens of KiB (its
	// histograms by subject pattern), so a bigger one is not a worker's.
	maxMetricsPageBytes = 8 << 20
)

// workerStatus is what one worker's /metrics page says, or why it could not be read.
type workerStatus struct {
	// URL is the page's address without any user information.
	URL         string  `json:"url"`
	Reachable   bool    `json:"reachable"`
	Error       string  `json:"error,omitempty"`
	ExecStreams float64 `json:"execStreams"`
	// SelfCheckOK is the worker's kubeclip_self_check_ok (nil: the page has none).
	SelfCheckOK        *bool               `json:"selfCheckOk,omitempty"`
	MissingPermissions []missingPermission `json:"missingPermissions"`
}

// missingPermission is one permission a worker's self-check found missing.
type missingPermission struct {
	Kind       string `json:"kind"`
	Permission string `json:"permission"`
}

// validateMetricsURL accepts an http or https URL with a host.
func validateMetricsURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%q is not a URL", redactURL(raw))
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q is not an http(s) URL with a host", redactURL(raw))
	}
	return nil
}

// redactURL drops a URL's user information, which may hold a password.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	u.User = nil
	return u.String()
}

// scrapeWorkers reads every page at once, in the order given sorted by URL. A page that cannot
// be read makes its worker unreachable, never the command fail.
func scrapeWorkers(ctx context.Context, client *http.Client, urls []string) []workerStatus {
	out := make([]workerStatus, len(urls))
	var wg sync.WaitGroup
	for i, u := range urls {
		wg.Go(func() { out[i] = scrapeWorker(ctx, client, u) })
	}
	wg.Wait()
	slices.SortFunc(out, func(a, b workerStatus) int { return strings.Compare(a.URL, b.URL) })
	return out
}

func scrapeWorker(ctx context.Context, client *http.Client, raw string) workerStatus {
	w := workerStatus{URL: redactURL(raw), MissingPermissions: []missingPermission{}}
	families, err := fetchMetrics(ctx, client, raw)
	if err != nil {
		w.Error = fmt.Sprintf("scraping %s: %v", w.URL, err)
		return w
	}
	w.Reachable = true
	if f := families[metricExecStreams]; f != nil {
		for _, m := range f.GetMetric() {
			w.ExecStreams += m.GetGauge().GetValue()
		}
	}
	if f := families[metricSelfCheckOK]; f != nil && len(f.GetMetric()) > 0 {
		ok := f.GetMetric()[0].GetGauge().GetValue() == 1
		w.SelfCheckOK = &ok
	}
	if f := families[metricPermissionMissing]; f != nil {
		for _, m := range f.GetMetric() {
			if m.GetGauge().GetValue() != 1 {
				continue
			}
			p := missingPermission{}
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "kind":
					p.Kind = l.GetValue()
				case "permission":
					p.Permission = l.GetValue()
				}
			}
			w.MissingPermissions = append(w.MissingPermissions, p)
		}
	}
	slices.SortFunc(w.MissingPermissions, func(a, b missingPermission) int {
		if c := strings.Compare(a.Kind, b.Kind); c != 0 {
			return c
		}
		return strings.Compare(a.Permission, b.Permission)
	})
	return w
}

// errPageTooLarge: the page is over maxMetricsPageBytes.
var errPageTooLarge = fmt.Errorf("the page is over %d bytes", maxMetricsPageBytes)

// fetchMetrics GETs a page in Prometheus' text format and parses it.
func fetchMetrics(ctx context.Context, client *http.Client, raw string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, raw, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
	resp, err := client.Do(req)
	if err != nil {
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err // url.Error repeats the URL, user information included
		}
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %s", resp.Status)
	}
	body := io.LimitReader(resp.Body, maxMetricsPageBytes+1)
	counted := &countingReader{r: body}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(counted)
	if counted.n > maxMetricsPageBytes {
		return nil, errPageTooLarge
	}
	if err != nil {
		return nil, fmt.Errorf("parsing the page: %w", err)
	}
	return families, nil
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
