package perf

import (
	"math"
	"testing"
	"time"
)

var nan = math.NaN()

func TestSummarize(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []float64
		want Summary
	}{
		{"one", []float64{7}, Summary{7, 7, 7, 1}},
		{"odd", []float64{3, 1, 2}, Summary{2, 1, 3, 3}},
		{"even: mean of the middle two", []float64{4, 1, 3, 2}, Summary{2.5, 1, 4, 4}},
		{"NaNs left out", []float64{nan, 5, nan, 1, 3}, Summary{3, 1, 5, 3}},
		{"spread", []float64{10, 11, 30}, Summary{11, 10, 30, 3}},
	} {
		if got := Summarize(tc.in); got != tc.want {
			t.Errorf("%s: Summarize(%v) = %+v, want %+v", tc.name, tc.in, got, tc.want)
		}
	}
	for _, in := range [][]float64{nil, {}, {nan, nan}} {
		s := Summarize(in)
		if s.N != 0 || !math.IsNaN(s.Median) || !math.IsNaN(s.Min) || !math.IsNaN(s.Max) {
			t.Errorf("Summarize(%v) = %+v, want N 0 and NaNs", in, s)
		}
	}
	if m := Median([]float64{1, 100, 2}); m != 2 {
		t.Errorf("Median = %v, want 2", m)
	}
}

// TestRatioMedians checks that a ratio is formed within each run and then summarized: here the
// median of the per-run ratios (1) differs from the ratio of the medians (20/10 = 2).
func TestRatioMedians(t *testing.T) {
	num := []float64{10, 30, 20}
	den := []float64{10, 10, 40}
	r := Ratios(num, den)
	want := []float64{1, 3, 0.5}
	for i := range want {
		if r[i] != want[i] {
			t.Fatalf("Ratios = %v, want %v", r, want)
		}
	}
	if s := Summarize(r); s != (Summary{1, 0.5, 3, 3}) {
		t.Errorf("ratio summary %+v, want median 1 [0.5-3] of 3", s)
	}
	if got := Median(num) / Median(den); got != 2 {
		t.Fatalf("ratio of medians %v; the example no longer tells them apart", got)
	}

	// A run where either figure is missing, or the denominator is zero, has no ratio.
	r = Ratios([]float64{2, nan, 6, 8}, []float64{1, 1, 0, nan})
	if r[0] != 2 || !math.IsNaN(r[1]) || !math.IsNaN(r[2]) || !math.IsNaN(r[3]) {
		t.Errorf("Ratios with gaps = %v, want [2 NaN NaN NaN]", r)
	}
	if s := Summarize(r); s.N != 1 || s.Median != 2 {
		t.Errorf("summary %+v, want median 2 of 1", s)
	}
	// Runs beyond the shorter slice have no ratio either.
	if r := Ratios([]float64{1, 2, 3}, []float64{1}); len(r) != 1 {
		t.Errorf("Ratios of unequal lengths = %v, want one ratio", r)
	}
}

func TestPercentile(t *testing.T) {
	var s []time.Duration
	for i := 1; i <= 100; i++ {
		s = append(s, time.Duration(i))
	}
	for _, tc := range []struct {
		p    float64
		want time.Duration
	}{{0.5, 50}, {0.99, 99}, {1, 100}, {0.001, 1}, {0.505, 51}} {
		if got := Percentile(s, tc.p); got != tc.want {
			t.Errorf("Percentile(1..100, %v) = %v, want %v", tc.p, got, tc.want)
		}
	}
	if got := Percentile([]time.Duration{42}, 0.99); got != 42 {
		t.Errorf("one sample: %v", got)
	}
	if got := Percentile(nil, 0.5); got != 0 {
		t.Errorf("no samples: %v", got)
	}
}

func TestGoal(t *testing.T) {
	for _, c := range []struct {
		g    Goal
		v    float64
		met  bool
		text string
	}{
		{Goal{Min: 0.7}, 0.54, false, "at least 0.70"},
		{Goal{Min: 0.7}, 0.7, true, "at least 0.70"},
		{Goal{Max: 1.25}, 1.45, false, "at most 1.25"},
		{Goal{Max: 1.25}, 1.1, true, "at most 1.25"},
		{Goal{Min: 0.85, Max: 1.15}, 0.87, true, "0.85 to 1.15"},
		{Goal{Min: 0.85, Max: 1.15}, 1.18, false, "0.85 to 1.15"},
		{Goal{Max: 2}, math.NaN(), false, "at most 2.00"},
		{Goal{}, 3, true, ""},
	} {
		if got := c.g.Met(c.v); got != c.met {
			t.Errorf("%+v.Met(%v) = %v, want %v", c.g, c.v, got, c.met)
		}
		if got := c.g.String(); got != c.text {
			t.Errorf("%+v.String() = %q, want %q", c.g, got, c.text)
		}
	}
}
