package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/kubeclip/kubeclip/internal/pipelinetest"
)

// metric is one row of the table and one panel of the plot: a figure of each size.
type metric struct {
	name, unit string
	goal       string
	value      func(sizeResult) float64
}

var (
	rw = pipelinetest.RunWatcher
	dp = pipelinetest.Dispatcher
	tw = pipelinetest.TenantWorker
)

func metrics() []metric {
	ms := []metric{
		{"acquire → created p50", "ms", "", func(r sizeResult) float64 { return r.CreatedP50Ms }},
		{"acquire → created p99", "ms", "≤ 1000 at 10k", func(r sizeResult) float64 { return r.CreatedP99Ms }},
		{"achieved rate at offered", "acq/s", "", func(r sizeResult) float64 { return r.AchievedRate }},
		{"saturation (burst at once)", "acq/s", "", func(r sizeResult) float64 { return r.SaturationRate }},
		{"run-watcher RSS per live lease", "KiB", "≤ 10", func(r sizeResult) float64 { return r.Workers[rw].RSSPerLeaseKiB }},
		{"dispatcher RSS per live lease", "KiB", "", func(r sizeResult) float64 { return r.Workers[dp].RSSPerLeaseKiB }},
		{"tenant-worker RSS per live lease", "KiB", "", func(r sizeResult) float64 { return r.Workers[tw].RSSPerLeaseKiB }},
		{"run-watcher RSS live", "MiB", "", func(r sizeResult) float64 { return r.Workers[rw].RSSLiveMiB }},
		{"dispatcher RSS live", "MiB", "", func(r sizeResult) float64 { return r.Workers[dp].RSSLiveMiB }},
		{"run-watcher CPU per acquire", "ms", "", func(r sizeResult) float64 { return r.Workers[rw].CPUPerAcquireMs }},
		{"dispatcher CPU per acquire", "ms", "", func(r sizeResult) float64 { return r.Workers[dp].CPUPerAcquireMs }},
		{"tenant-worker CPU per acquire", "ms", "", func(r sizeResult) float64 { return r.Workers[tw].CPUPerAcquireMs }},
		{"run-watcher idle CPU per live lease", "µs/s", "", func(r sizeResult) float64 { return r.Workers[rw].IdleCPUPerLeaseUs }},
		{"dispatcher idle CPU per live lease", "µs/s", "", func(r sizeResult) float64 { return r.Workers[dp].IdleCPUPerLeaseUs }},
		{"NATS consumers", "", "", func(r sizeResult) float64 { return float64(r.Consumers) }},
		{"run stream bytes per run", "B", "", func(r sizeResult) float64 { return r.RunStreamBytesPerRun }},
		{"API requests, drive", "req/s", "", func(r sizeResult) float64 { return r.APIDrivePerSec }},
		{"API requests, all live, idle", "req/s", "", func(r sizeResult) float64 { return r.APISteadyPerSec }},
		{"run-watcher restart → ready", "s", "≤ 30", func(r sizeResult) float64 { return r.RestartReadySec[rw] }},
		{"run-watcher restart → owns every run", "s", "", func(r sizeResult) float64 { return r.RunWatcherAdoptSec }},
		{"dispatcher restart → ready", "s", "≤ 30", func(r sizeResult) float64 { return r.RestartReadySec[dp] }},
		{"dispatcher reconcile pass, all live", "s", "", func(r sizeResult) float64 { return r.ReconcileSec }},
		{"dispatcher workloads listed by the pass", "", "", func(r sizeResult) float64 { return float64(r.ReconcileWorkloads) }},
		{"dispatcher peak RSS after the pass", "MiB", "", func(r sizeResult) float64 { return r.ReconcilePeakMiB }},
		{"tenant-worker restart → ready", "s", "≤ 30", func(r sizeResult) float64 { return r.RestartReadySec[tw] }},
		{"replay of the run stream", "events/s", "", func(r sizeResult) float64 { return r.ReplayPerSec }},
		{"lost + doubled + ended", "", "0", func(r sizeResult) float64 { return float64(r.Lost + r.Doubled + r.Ended) }},
		{"runs with a wrong log (job)", "", "0", func(r sizeResult) float64 { return float64(r.LogWrong) }},
		{"kubelet log requests (job)", "", "", func(r sizeResult) float64 { return float64(r.LogRequests) }},
		{"log follow streams open, all live (job)", "", "", func(r sizeResult) float64 { return float64(r.LogStreamsLive) }},
	}
	return append(ms, stepMetrics()...)
}

// backendOrder is the order of the table's column sets: the pod backend's sizes, then the job
// backend's.
var backendOrder = []string{"pod", "job"}

// writeReport prints the table to stdout and writes it, the JSON and the plot into dir.
func writeReport(stdout io.Writer, dir string, results []sizeResult) error {
	// An earlier run's sizes (--previous) may come in any order, and from before the backend was
	// recorded (the pod backend's).
	results = slices.Clone(results)
	for i := range results {
		if results[i].Backend == "" {
			results[i].Backend = "pod"
		}
	}
	slices.SortStableFunc(results, func(a, b sizeResult) int {
		if a.Backend != b.Backend {
			return slices.Index(backendOrder, a.Backend) - slices.Index(backendOrder, b.Backend)
		}
		return a.Leases - b.Leases
	})
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight|tabwriter.Debug)
	fmt.Fprint(tw, "metric\tunit\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%d %s\t", r.Leases, r.Backend)
	}
	fmt.Fprintln(tw, "goal\t")
	for _, m := range metrics() {
		fmt.Fprintf(tw, "%s\t%s\t", m.name, m.unit)
		for _, r := range results {
			fmt.Fprintf(tw, "%s\t", format(m.value(r)))
		}
		fmt.Fprintf(tw, "%s\t\n", m.goal)
	}
	_ = tw.Flush()
	for _, r := range results {
		fmt.Fprintf(&b, "%d leases (%s backend, %d companies): %.0f s; load average %s at start, %s at end; API requests during the drive: %s (mean ms: %v); idle: %s\n",
			r.Leases, r.Backend, r.Companies, r.DurationSec, r.LoadStart, r.LoadEnd, r.APIDrive, r.APIDriveMeanMs, r.APISteady)
		if r.FirstEnded != "" {
			fmt.Fprintf(&b, "  first ended run: %s\n", r.FirstEnded)
		}
		if r.FirstLogWrong != "" {
			fmt.Fprintf(&b, "  first wrong log: %s\n", r.FirstLogWrong)
		}
		if r.Error != "" {
			fmt.Fprintf(&b, "  stopped: %s\n", r.Error)
		}
	}
	fmt.Fprint(stdout, b.String())
	if err := os.WriteFile(filepath.Join(dir, "scale.txt"), []byte(b.String()), 0o644); err != nil {
		return err
	}
	data, err := json.MarshalIndent(results, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "scale.json"), data, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "scale.svg"), []byte(plot(results)), 0o644)
}

func format(v float64) string {
	if v == math.Trunc(v) {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// plot draws one small panel per metric: the figure against the number of live leases (both
// axes linear from 0), with a dashed line through the origin and the smallest size's point, so
// a curve above it grows worse than linearly (for totals) or a rising curve (for per-lease
// figures) shows the same.
func plot(results []sizeResult) string {
	const (
		cols, panelW, panelH, pad = 4, 300, 190, 40
	)
	ms := metrics()
	rows := (len(ms) + cols - 1) / cols
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", cols*panelW, rows*panelH+30)
	fmt.Fprintf(&b, `<text x="10" y="18" font-size="14">kubeclip cost curves on a kwok fleet (x: live leases, 0 to %d;%s)</text>`+"\n", maxLeases(results), legend(results))
	xmax := float64(maxLeases(results))
	for i, m := range ms {
		ox, oy := float64(i%cols*panelW), float64(30+i/cols*panelH)
		w, h := float64(panelW-2*pad), float64(panelH-2*pad)
		ymax := 0.0
		for _, r := range results {
			ymax = max(ymax, m.value(r))
		}
		if ymax == 0 {
			ymax = 1
		}
		x := func(n int) float64 { return ox + pad + float64(n)/xmax*w }
		y := func(v float64) float64 { return oy + pad + h - v/ymax*h }
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f">%s (%s)</text>`+"\n", ox+10, oy+20, escape(m.name), escape(m.unit))
		fmt.Fprintf(&b, `<path d="M%.0f %.0f V%.0f H%.0f" fill="none" stroke="#888"/>`+"\n", ox+pad, oy+pad, oy+pad+h, ox+pad+w)
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" fill="#555">max %s</text>`+"\n", ox+pad+4, oy+pad-4, format(round(ymax)))
		// One curve per backend (results are ordered by backend, then size).
		for k, group := range byBackend(results) {
			color := curveColors[k%len(curveColors)]
			var pts []string
			for _, r := range group {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(r.Leases), y(m.value(r))))
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", x(r.Leases), y(m.value(r)), color)
				fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle" fill="#555">%d</text>`+"\n", x(r.Leases), oy+pad+h+14, r.Leases)
			}
			if first := group[0]; first.Leases > 0 && m.value(first) > 0 {
				// The linear reference through the origin and the backend's first point.
				// It ends where it leaves the panel.
				slope := m.value(first) / float64(first.Leases)
				end := xmax
				if slope*xmax > ymax {
					end = ymax / slope
				}
				fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-opacity="0.4" stroke-dasharray="4 3"/>`+"\n",
					x(0), y(0), x(int(end)), y(slope*end), color)
			}
			fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s"/>`+"\n", strings.Join(pts, " "), color)
		}
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// curveColors are the backends' curve colours, in the order of byBackend.
var curveColors = []string{"#c33", "#36c"}

// byBackend splits results, ordered by backend, into one group per backend.
func byBackend(results []sizeResult) [][]sizeResult {
	var groups [][]sizeResult
	for i, r := range results {
		if i == 0 || r.Backend != results[i-1].Backend {
			groups = append(groups, nil)
		}
		groups[len(groups)-1] = append(groups[len(groups)-1], r)
	}
	return groups
}

// legend names each backend's curve colour.
func legend(results []sizeResult) string {
	var b strings.Builder
	for k, group := range byBackend(results) {
		fmt.Fprintf(&b, ` <tspan fill="%s">%s</tspan>`, curveColors[k%len(curveColors)], escape(group[0].Backend))
	}
	return b.String()
}

func maxLeases(results []sizeResult) int {
	n := 1
	for _, r := range results {
		n = max(n, r.Leases)
	}
	return n
}

func escape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}
