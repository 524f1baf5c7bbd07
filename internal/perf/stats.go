package perf

import (
	"math"
	"slices"
	"time"
)

// Summary is a measurement's figure over several runs: the median and the range. Runs that
// produced no figure (NaN) are left out; N counts those kept.
type Summary struct {
	Median, Min, Max float64
	N                int
}

// Summarize returns the median and range of the figures in xs that are not NaN. With none, every
// field but N is NaN.
func Summarize(xs []float64) Summary {
	v := make([]float64, 0, len(xs))
	for _, x := range xs {
		if !math.IsNaN(x) {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		return Summary{Median: math.NaN(), Min: math.NaN(), Max: math.NaN()}
	}
	slices.Sort(v)
	return Summary{Median: medianSorted(v), Min: v[0], Max: v[len(v)-1], N: len(v)}
}

// Median returns the median of xs, NaNs left out: the middle figure, or the mean of the two middle
// ones for an even count. It is NaN when nothing is left.
func Median(xs []float64) float64 { return Summarize(xs).Median }

func medianSorted(v []float64) float64 {
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

// Ratios divides num[i] by den[i], the figures of the same run, for each run i. A run where either
// figure is missing (NaN), or the denominator is not positive, gives NaN, which Summarize leaves out:
// a ratio is only ever formed from two figures measured in the same run.
func Ratios(num, den []float64) []float64 {
	out := make([]float64, min(len(num), len(den)))
	for i := range out {
		if math.IsNaN(num[i]) || math.IsNaN(den[i]) || den[i] <= 0 {
			out[i] = math.NaN()
			continue
		}
		out[i] = num[i] / den[i]
	}
	return out
}

// Percentile returns the nearest-rank p-quantile (0 < p <= 1) of sorted: the smallest sample with
// at least a fraction p of the samples at or below it. It is 0 for no samples.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(float64(len(sorted))*p)) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}
