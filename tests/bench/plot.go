package main

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// The pictures: one SVG per phase, next to the JSON, with one panel per row that has samples.
// A panel draws each side's empirical distribution (the share of samples at or below a time) on a
// log time axis: kubeclip solid, its raw primitive dashed, so the two curves' gap is the overhead
// at every percentile, not only at p50 and p99.
const (
	plotWidth       = 760.0
	plotPanelHeight = 210.0
	plotLeft        = 64.0 // room for the y axis labels
	plotRight       = 24.0 // room for the last x label
	plotTop         = 58.0 // the panel's title and legend
	plotBottom      = 30.0 // the x axis labels
	plotTitleMax    = 110  // characters of a row's metric in its panel title
	colourKubeclip  = "#1f5fbf"
	colourRaw       = "#d9730d"
)

// dist is what a row's picture needs: both sides' successful samples. Rows without samples
// (rates computed elsewhere, CPU readings) are not drawn.
type dist struct {
	pipe, raw []time.Duration
}

// distOf keeps both sides' samples of a row.
func distOf(pipe, raw samples) dist {
	return dist{pipe: slices.Clone(pipe.d), raw: slices.Clone(raw.d)}
}

func (d dist) empty() bool { return len(d.pipe) == 0 && len(d.raw) == 0 }

// writePlots writes one picture per phase with samples beside the JSON at jsonPath
// (bench-results.json → bench-results-a.svg, …) and returns their paths.
func (r *report) writePlots(jsonPath string) ([]string, error) {
	base := strings.TrimSuffix(jsonPath, filepath.Ext(jsonPath))
	var paths []string
	for _, phase := range r.plotPhases() {
		var rows []row
		for _, rw := range r.Rows {
			if label(rw.Metric) == phase && !rw.dist.empty() {
				rows = append(rows, rw)
			}
		}
		path := base + "-" + phase + ".svg"
		if err := os.WriteFile(path, plotPhase(phase, r.Session, rows), 0o644); err != nil {
			return paths, fmt.Errorf("writing the picture of phase (%s): %w", phase, err)
		}
		paths = append(paths, path)
	}
	return paths, nil
}

// plotPhases are the phases with at least one row to draw, in the report's order.
func (r *report) plotPhases() []string {
	var phases []string
	for _, rw := range r.Rows {
		if p := label(rw.Metric); !rw.dist.empty() && !slices.Contains(phases, p) {
			phases = append(phases, p)
		}
	}
	return phases
}

// plotPhase renders one phase's rows as an SVG document.
func plotPhase(phase, session string, rows []row) []byte {
	var b bytes.Buffer
	height := 40 + plotPanelHeight*float64(len(rows))
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="11">`+"\n",
		plotWidth, height, plotWidth, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="8" y="18" font-size="14" font-weight="bold">kubeclip bench %s, phase (%s)</text>`+"\n", esc(session), esc(phase))
	fmt.Fprintf(&b, `<text x="8" y="33">share of samples at or below a time (log scale): kubeclip solid, its raw primitive dashed</text>`+"\n")
	for i, rw := range rows {
		plotPanel(&b, 40+plotPanelHeight*float64(i), rw)
	}
	b.WriteString("</svg>\n")
	return b.Bytes()
}

// plotPanel draws one row at vertical offset top.
func plotPanel(b *bytes.Buffer, top float64, rw row) {
	x0, x1 := plotLeft, plotWidth-plotRight
	y0, y1 := top+plotTop, top+plotPanelHeight-plotBottom // y0: 100 %, y1: 0 %
	lo, hi := logRange(rw.dist.pipe, rw.dist.raw)
	xOf := func(d time.Duration) float64 {
		v := math.Log10(math.Max(msOf(d), lo))
		return x0 + (x1-x0)*(v-math.Log10(lo))/(math.Log10(hi)-math.Log10(lo))
	}
	yOf := func(share float64) float64 { return y1 - (y1-y0)*share }

	title := rw.Metric
	if rw.Unit != "ms" {
		title = "times behind the rate: " + title
	}
	if r := []rune(title); len(r) > plotTitleMax {
		title = string(r[:plotTitleMax-1]) + "…"
	}
	fmt.Fprintf(b, `<g class="panel"><text x="8" y="%.1f" font-weight="bold">%s</text>`+"\n", top+16, esc(title))
	fmt.Fprintf(b, `<text x="8" y="%.1f" fill="%s">%s</text>`+"\n", top+32, colourKubeclip, esc("━ kubeclip: "+sideLegend(rw.dist.pipe)))
	raw := "╌ raw: none measured"
	if len(rw.dist.raw) > 0 {
		raw = "╌ raw: " + sideLegend(rw.dist.raw) + "; " + rw.Raw
		if r := []rune(raw); len(r) > plotTitleMax+10 {
			raw = string(r[:plotTitleMax+9]) + "…"
		}
	}
	fmt.Fprintf(b, `<text x="8" y="%.1f" fill="%s">%s</text>`+"\n", top+46, colourRaw, esc(raw))

	// The frame, the 50 % and 99 % lines, and the time ticks (1, 2, 5 × 10^k ms).
	fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#888"/>`+"\n", x0, y0, x1-x0, y1-y0)
	for _, share := range []float64{0.5, 0.99} {
		y := yOf(share)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ccc" stroke-dasharray="2,3"/>`, x0, y, x1, y)
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f">p%.0f</text>`+"\n", x1+4, y+4, share*100)
	}
	for _, share := range []float64{0, 0.5, 1} {
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="end">%.0f %%</text>`, x0-6, yOf(share)+4, share*100)
	}
	b.WriteString("\n")
	for _, t := range logTicks(lo, hi) {
		x := x0 + (x1-x0)*(math.Log10(t)-math.Log10(lo))/(math.Log10(hi)-math.Log10(lo))
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#eee"/>`, x, y0, x, y1)
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", x, y1+14, tickLabel(t))
	}
	if len(rw.dist.raw) > 0 {
		fmt.Fprintf(b, `<path class="raw" d="%s" fill="none" stroke="%s" stroke-width="1.6" stroke-dasharray="6,3"/>`+"\n", ecdfPath(rw.dist.raw, xOf, yOf), colourRaw)
	}
	if len(rw.dist.pipe) > 0 {
		fmt.Fprintf(b, `<path class="kubeclip" d="%s" fill="none" stroke="%s" stroke-width="1.8"/>`+"\n", ecdfPath(rw.dist.pipe, xOf, yOf), colourKubeclip)
	}
	b.WriteString("</g>\n")
}

// ecdfPath is the step function of the samples' empirical distribution: from 0 at the smallest
// sample, up by 1/n at each sample, along the x axis in between.
func ecdfPath(ds []time.Duration, xOf func(time.Duration) float64, yOf func(float64) float64) string {
	sorted := slices.Clone(ds)
	slices.Sort(sorted)
	var p strings.Builder
	fmt.Fprintf(&p, "M%.1f,%.1f", xOf(sorted[0]), yOf(0))
	for i, d := range sorted {
		x := xOf(d)
		fmt.Fprintf(&p, " H%.1f V%.1f", x, yOf(float64(i+1)/float64(len(sorted))))
	}
	return p.String()
}

// logRange is the time axis in milliseconds: from the decade-ish below the smallest sample to the
// one above the largest, at least one decade wide.
func logRange(sides ...[]time.Duration) (lo, hi float64) {
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, ds := range sides {
		for _, d := range ds {
			v := math.Max(msOf(d), 0.001)
			lo, hi = math.Min(lo, v), math.Max(hi, v)
		}
	}
	lo = niceBelow(lo)
	hi = niceAbove(hi)
	if hi/lo < 10 {
		hi = lo * 10
	}
	return lo, hi
}

// niceBelow and niceAbove round to 1, 2 or 5 × 10^k.
func niceBelow(v float64) float64 {
	e := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{5, 2, 1} {
		if m*e <= v {
			return m * e
		}
	}
	return e
}

func niceAbove(v float64) float64 {
	e := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*e >= v {
			return m * e
		}
	}
	return 10 * e
}

// logTicks are the 1, 2, 5 × 10^k values in [lo, hi].
func logTicks(lo, hi float64) []float64 {
	var ticks []float64
	for e := math.Pow(10, math.Floor(math.Log10(lo))); e <= hi; e *= 10 {
		for _, m := range []float64{1, 2, 5} {
			if t := m * e; t >= lo*(1-1e-9) && t <= hi*(1+1e-9) {
				ticks = append(ticks, t)
			}
		}
	}
	return ticks
}

func tickLabel(ms float64) string {
	switch {
	case ms >= 1000:
		return fmt.Sprintf("%g s", ms/1000)
	default:
		return fmt.Sprintf("%g ms", ms)
	}
}

func sideLegend(ds []time.Duration) string {
	s := samples{d: ds}
	return fmt.Sprintf("n %d, p50 %s, p99 %s", len(ds), num(s.p50(), "ms"), num(s.p99(), "ms"))
}

func msOf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// esc escapes text for an SVG text node.
func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s)) // a strings.Builder never fails a write
	return b.String()
}
