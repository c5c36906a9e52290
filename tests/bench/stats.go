package main

import (
	"math"
	"slices"
	"time"
)

// samples is one side of a measurement: the durations and how many samples failed.
type samples struct {
	d        []time.Duration
	errs     int
	firstErr error
}

func (s *samples) add(d time.Duration, err error) {
	if err != nil {
		s.errs++
		if s.firstErr == nil {
			s.firstErr = err
		}
		return
	}
	s.d = append(s.d, d)
}

// merge adds o's samples and failures to s.
func (s *samples) merge(o samples) {
	s.d = append(s.d, o.d...)
	s.errs += o.errs
	if s.firstErr == nil {
		s.firstErr = o.firstErr
	}
}

// percentile is the nearest-rank percentile (p in (0, 1]) in milliseconds, or nil without
// samples. With n samples, p99 is the ⌈0.99·n⌉-th smallest: the maximum for n ≤ 100.
func (s samples) percentile(p float64) *float64 {
	if len(s.d) == 0 {
		return nil
	}
	sorted := slices.Clone(s.d)
	slices.Sort(sorted)
	rank := int(math.Ceil(p*float64(len(sorted)))) - 1
	rank = max(0, min(rank, len(sorted)-1))
	return ms(sorted[rank])
}

// total is the sum of the durations in milliseconds.
func (s samples) total() *float64 {
	var sum time.Duration
	for _, d := range s.d {
		sum += d
	}
	return ms(sum)
}

func (s samples) p50() *float64 { return s.percentile(0.50) }
func (s samples) p99() *float64 { return s.percentile(0.99) }

func ms(d time.Duration) *float64 {
	v := math.Round(float64(d)/float64(time.Microsecond)) / 1000
	return &v
}

func round2(v float64) *float64 {
	r := math.Round(100*v) / 100
	return &r
}
