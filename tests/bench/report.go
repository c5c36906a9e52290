package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// report is the bench's result: one row per measurement, printed as a table and written as
// JSON.
type report struct {
	Session  string    `json:"session"`
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	Mode     string    `json:"mode"`
	Rows     []row     `json:"rows"`
	Notes    []string  `json:"notes,omitempty"`
	// Breakdown says where the time went: pipeline stages, and the workers' Kubernetes
	// requests per phase.
	Breakdown []breakdownRow `json:"breakdown,omitempty"`
	// Phases says how each phase after the set-up started: the wait for the node to be clear
	// of the phases before it, and the load average then.
	Phases []phaseStart `json:"phases,omitempty"`
	// Broker is (p)'s raw columns: each route's samples, what the broker added, its memory.
	Broker *brokerFigures `json:"broker,omitempty"`
	// Plots are the pictures of the phases' distributions written beside the JSON (file names).
	Plots []string `json:"plots,omitempty"`
}

// row is one measurement. Latencies are in milliseconds; a throughput row has its rate in P50
// and RawP50 (unit "acq/s") and no P99.
type row struct {
	Metric string   `json:"metric"`
	N      int      `json:"n"`
	Unit   string   `json:"unit"`
	P50    *float64 `json:"p50"`
	P99    *float64 `json:"p99"`
	RawN   int      `json:"rawN"`
	RawP50 *float64 `json:"rawP50"`
	RawP99 *float64 `json:"rawP99"`
	// Ratio is P50 / RawP50, when both sides measure the same thing.
	Ratio *float64 `json:"ratio,omitempty"`
	// Raw says what the raw columns measure.
	Raw    string `json:"raw"`
	Target string `json:"target"`
	// Met is nil for a row without a target.
	Met    *bool `json:"met"`
	Errors int   `json:"errors"`
	// dist keeps the samples behind the percentiles for the phase's picture.
	dist dist
}

func newReport(session string) *report {
	return &report{
		Session: session,
		Started: time.Now().UTC(),
		Mode: "in-process pipeline: embedded JetStream + tenant-worker, dispatcher, run-watcher " +
			"(own NATS connection and Kubernetes client each, binaries' defaults; (f) adds dispatchers the same way, " +
			"(g) runs run-watcher processes against the same JetStream); times are the bench's receive times",
	}
}

// latencyRow builds a latency row from both sides' samples.
func latencyRow(metric string, pipe, raw samples, rawWhat, target string, met func(p50, p99, rawP50 float64) bool) row {
	r := row{
		Metric: metric, N: len(pipe.d), Unit: "ms", P50: pipe.p50(), P99: pipe.p99(),
		RawN: len(raw.d), RawP50: raw.p50(), RawP99: raw.p99(), Raw: rawWhat,
		Target: target, Errors: pipe.errs + raw.errs, dist: distOf(pipe, raw),
	}
	if r.P50 != nil && r.RawP50 != nil {
		r.Ratio = ratio(*r.P50, *r.RawP50)
	}
	if met != nil && r.P50 != nil && r.P99 != nil {
		rawP50 := 0.0
		if r.RawP50 != nil {
			rawP50 = *r.RawP50
		}
		ok := met(*r.P50, *r.P99, rawP50)
		r.Met = &ok
	}
	return r
}

// ratio is a / b to two decimals, nil when b is not positive.
func ratio(a, b float64) *float64 {
	if b <= 0 {
		return nil
	}
	v := math.Round(100*a/b) / 100
	return &v
}

// add adds rows, keeping them in label order ((a), (b), ...; a primed row after its own).
func (r *report) add(rows ...row) {
	r.Rows = append(r.Rows, rows...)
	slices.SortStableFunc(r.Rows, func(x, y row) int { return strings.Compare(label(x.Metric), label(y.Metric)) })
}

// label is the metric's letter: "(d') ..." → "d".
func label(metric string) string {
	if len(metric) < 2 {
		return metric
	}
	return metric[1:2]
}

func (r *report) note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

// write prints the table to w and writes the JSON to path, with one picture per phase beside it.
func (r *report) write(w io.Writer, path string) error {
	r.Finished = time.Now().UTC()
	if err := r.printTable(w); err != nil {
		return err
	}
	// A picture that cannot be written does not cost the JSON: its error comes after it.
	plots, plotErr := r.writePlots(path)
	for _, p := range plots {
		r.Plots = append(r.Plots, filepath.Base(p))
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return errors.Join(fmt.Errorf("encoding the results: %w", err), plotErr)
	}
	if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
		return errors.Join(fmt.Errorf("writing the results: %w", err), plotErr)
	}
	fmt.Fprintf(w, "\nresults written to %s", path)
	if len(plots) > 0 {
		fmt.Fprintf(w, ", pictures of the distributions to %s", strings.Join(plots, ", "))
	}
	fmt.Fprintln(w)
	return plotErr
}

func (r *report) printTable(w io.Writer) error {
	fmt.Fprintf(w, "\nkubeclip bench %s (%s)\n\n", r.Session, r.Mode)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight|tabwriter.Debug)
	fmt.Fprintln(tw, "metric\tn\tp50\tp99\traw n\traw p50\traw p99\tp50/raw\ttarget\tmet\t")
	for _, row := range r.Rows {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t\n", row.Metric, row.N,
			num(row.P50, row.Unit), num(row.P99, row.Unit), row.RawN, num(row.RawP50, row.Unit), num(row.RawP99, row.Unit),
			num(row.Ratio, "×"), row.Target, verdict(row.Met))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("printing the table: %w", err)
	}
	fmt.Fprintln(w, "\nraw columns:")
	for _, row := range r.Rows {
		if row.Raw != "" {
			fmt.Fprintf(w, "  %s: %s\n", row.Metric, row.Raw)
		}
	}
	for _, row := range r.Rows {
		if row.Errors > 0 {
			fmt.Fprintf(w, "  %s: %d sample(s) failed (see stderr)\n", row.Metric, row.Errors)
		}
	}
	if len(r.Notes) > 0 {
		fmt.Fprintln(w, "\nnotes:")
		for _, n := range r.Notes {
			fmt.Fprintf(w, "  - %s\n", n)
		}
	}
	if r.Broker != nil {
		if err := r.Broker.print(w); err != nil {
			return err
		}
	}
	if err := r.printPhases(w); err != nil {
		return err
	}
	return r.printBreakdown(w)
}

// printPhases prints how each phase started: the wait for a clear node and the load then.
func (r *report) printPhases(w io.Writer) error {
	if len(r.Phases) == 0 {
		return nil
	}
	fmt.Fprintln(w, "\nphase starts (settle: earlier runs ended, their pods and namespaces deleted and gone):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight|tabwriter.Debug)
	fmt.Fprintln(tw, "phase\tsettle s\truns waited for\tof them unended\tpods deleted\tnamespaces deleted\tload 1/5/15 min\t")
	for _, p := range r.Phases {
		fmt.Fprintf(tw, "%s\t%.1f\t%d\t%d\t%d\t%d\t%s\t\n", p.Phase, p.SettleSeconds, p.Runs, p.Unended, p.Pods, p.Namespaces, p.Load)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("printing the phase starts: %w", err)
	}
	return nil
}

// minPrintedOps is the fewest operations of a kind the printed breakdown shows.
const minPrintedOps = 5

// printBreakdown prints the stages and the Kubernetes and rate limiter rows, and sums the NATS
// rows up per phase (the JSON has them one by one).
func (r *report) printBreakdown(w io.Writer) error {
	if len(r.Breakdown) == 0 {
		return nil
	}
	fmt.Fprintln(w, "\nbreakdown: pipeline stages; per worker, API = a Kubernetes request (send → response headers),")
	fmt.Fprintln(w, "throttle = wait for the client-side rate limiter (shown when ≥ 1 ms at p99), NATS = JetStream publishes and KV operations:")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight|tabwriter.Debug)
	fmt.Fprintln(tw, "phase\twhat\tn\tp50\tp99\ttotal\t")
	var nats breakdownRow
	flushNATS := func() {
		if nats.N > 0 {
			fmt.Fprintf(tw, "%s\t%s\t%d\t-\t%s (max)\t%s\t\n", nats.Phase, "NATS, all workers, all kinds", nats.N, num(nats.P99, "ms"), num(nats.Total, "ms"))
		}
		nats = breakdownRow{}
	}
	for _, b := range r.Breakdown {
		if b.Phase != nats.Phase {
			flushNATS()
		}
		switch {
		case strings.HasPrefix(b.What, "NATS "):
			nats = sumRows(nats, b)
		case b.N >= minPrintedOps || strings.HasPrefix(b.What, "stage "):
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t\n", b.Phase, b.What, b.N, num(b.P50, "ms"), num(b.P99, "ms"), num(b.Total, "ms"))
		}
	}
	flushNATS()
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("printing the breakdown: %w", err)
	}
	return nil
}

// sumRows adds b to acc: counts and totals add up, the p99 is the larger.
func sumRows(acc, b breakdownRow) breakdownRow {
	acc.Phase = b.Phase
	acc.N += b.N
	acc.Total = addMS(acc.Total, b.Total)
	if acc.P99 == nil || (b.P99 != nil && *b.P99 > *acc.P99) {
		acc.P99 = b.P99
	}
	return acc
}

func addMS(a, b *float64) *float64 {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	}
	v := math.Round(1000*(*a+*b)) / 1000
	return &v
}

func num(v *float64, unit string) string {
	if v == nil {
		return "-"
	}
	switch unit {
	case "ms":
		return fmt.Sprintf("%.1f ms", *v)
	case "×":
		return fmt.Sprintf("%.2f×", *v)
	case "cores":
		return fmt.Sprintf("%.2f cores", *v)
	}
	return fmt.Sprintf("%.1f %s", *v, unit)
}

func verdict(met *bool) string {
	switch {
	case met == nil:
		return "-"
	case *met:
		return "met"
	default:
		return "NOT MET"
	}
}
