package main

import (
	"encoding/xml"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestWritePlotsDrawsEachPhasesDistributions writes a report's pictures and reads them back as
// XML: one file per phase with samples, one panel per such row, each side's curve a step
// function with one rise per sample that ends at 100 %, kubeclip's curve to the right of a
// faster raw primitive's, and the rows' texts escaped.
func TestWritePlotsDrawsEachPhasesDistributions(t *testing.T) {
	ms := func(vs ...int) samples {
		var s samples
		for _, v := range vs {
			s.add(time.Duration(v)*time.Millisecond, nil)
		}
		return s
	}
	rep := newReport("plot-test")
	rep.add(
		latencyRow("(a) acquire → created <warm>", ms(30, 40, 50, 60, 400), ms(10, 12, 14), "create Secret & Job", "", nil),
		latencyRow("(a') only kubeclip", ms(5), samples{}, "", "", nil),
		row{Metric: "(e) acquisitions/s", Unit: "acq/s"}, // no samples: no picture of (e)
		latencyRow("(k) acquire → ready", ms(2000, 2500), ms(1900), "pod create → Ready", "", nil),
	)
	dir := t.TempDir()
	paths, err := rep.writePlots(filepath.Join(dir, "bench-results.json"))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Join(dir, "bench-results-a.svg"), filepath.Join(dir, "bench-results-k.svg")}
	if strings.Join(paths, " ") != strings.Join(want, " ") {
		t.Fatalf("pictures %q, want %q", paths, want)
	}

	svg := readSVG(t, paths[0])
	if len(svg.Panels) != 2 {
		t.Fatalf("phase (a): %d panels, want 2 (one per row with samples)", len(svg.Panels))
	}
	first := svg.Panels[0]
	if !strings.Contains(first.Texts[0], "(a) acquire → created <warm>") {
		t.Errorf("panel title %q does not name the row", first.Texts[0])
	}
	pipe, raw := first.path(t, "kubeclip"), first.path(t, "raw")
	if len(pipe.rises) != 5 || len(raw.rises) != 3 {
		t.Fatalf("rises: kubeclip %d, raw %d; want one per sample (5, 3)", len(pipe.rises), len(raw.rises))
	}
	for _, c := range []curve{pipe, raw} {
		for i := 1; i < len(c.rises); i++ {
			if c.rises[i].x < c.rises[i-1].x || c.rises[i].y >= c.rises[i-1].y {
				t.Fatalf("curve %v does not rise to the right", c.rises)
			}
		}
		if top := c.rises[len(c.rises)-1].y; top != first.top(t) {
			t.Errorf("curve ends at y %.1f, want the frame's top (100 %%) %.1f", top, first.top(t))
		}
	}
	if pipe.rises[2].x <= raw.rises[1].x {
		t.Errorf("kubeclip's median (50 ms) at x %.1f is not right of the raw median (12 ms) at %.1f", pipe.rises[2].x, raw.rises[1].x)
	}
	// The axis is logarithmic: 10 → 40 ms is log10(4) of the width of the decade 40 → 400 ms.
	decade := pipe.rises[4].x - pipe.rises[1].x
	if d, want := pipe.rises[1].x-raw.rises[0].x, decade*math.Log10(4); math.Abs(d-want) > 1 {
		t.Errorf("10 → 40 ms spans %.1f, want %.1f (log10(4) of the decade 40 → 400 ms, %.1f)", d, want, decade)
	}
	if svg.Panels[1].hasPath("raw") {
		t.Error("a row without raw samples draws a raw curve")
	}
}

// TestReportWriteNamesItsPictures checks the JSON lists the pictures written beside it.
func TestReportWriteNamesItsPictures(t *testing.T) {
	rep := newReport("plot-test")
	var s samples
	s.add(3*time.Millisecond, nil)
	rep.add(latencyRow("(c) container terminated → result", s, samples{}, "", "", nil))
	path := filepath.Join(t.TempDir(), "out.json")
	if err := rep.write(io.Discard, path); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `"plots": [`+"\n"+`    "out-c.svg"`) {
		t.Errorf("the JSON does not name out-c.svg:\n%s", data)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(path), "out-c.svg")); err != nil {
		t.Error(err)
	}
}

type svgDoc struct {
	Panels []svgPanel `xml:"g"`
}

type svgPanel struct {
	Texts []string  `xml:"text"`
	Rects []svgRect `xml:"rect"`
	Paths []svgPath `xml:"path"`
}

type svgRect struct {
	Y string `xml:"y,attr"`
}

type svgPath struct {
	Class string `xml:"class,attr"`
	D     string `xml:"d,attr"`
}

type point struct{ x, y float64 }

type curve struct{ rises []point }

func readSVG(t *testing.T, path string) svgDoc {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc svgDoc
	if err := xml.Unmarshal(data, &doc); err != nil {
		t.Fatalf("%s is not well-formed XML: %v", path, err)
	}
	return doc
}

func (p svgPanel) top(t *testing.T) float64 {
	t.Helper()
	y, err := strconv.ParseFloat(p.Rects[0].Y, 64)
	if err != nil {
		t.Fatal(err)
	}
	return y
}

func (p svgPanel) hasPath(class string) bool {
	for _, pa := range p.Paths {
		if pa.Class == class {
			return true
		}
	}
	return false
}

var step = regexp.MustCompile(`H([0-9.]+) V([0-9.]+)`)

// path reads a curve's rises: the points where it goes up by one sample.
func (p svgPanel) path(t *testing.T, class string) curve {
	t.Helper()
	for _, pa := range p.Paths {
		if pa.Class != class {
			continue
		}
		var c curve
		for _, m := range step.FindAllStringSubmatch(pa.D, -1) {
			x, _ := strconv.ParseFloat(m[1], 64)
			y, _ := strconv.ParseFloat(m[2], 64)
			c.rises = append(c.rises, point{x, y})
		}
		return c
	}
	t.Fatalf("no %s curve", class)
	return curve{}
}
