package main

import (
	"fmt"
	"testing"

	"github.com/goroce/goroce/internal/perf"
)

// TestRatioFormat checks that a ratio's printed median never contradicts its verdict: a median just
// short of its goal's bound gets the decimals that show it.
func TestRatioFormat(t *testing.T) {
	atLeast, atMost := perf.Goal{Min: 1}, perf.Goal{Max: 1.25}
	for _, c := range []struct {
		median float64
		g      perf.Goal
		want   string
	}{
		{0.9972, atLeast, "0.997"},
		{0.99996, atLeast, "1.0000"}, // four decimals at most
		{1.004, atLeast, "1.00"},     // met, and shown so
		{0.73, atLeast, "0.73"},
		{1.2531, atMost, "1.253"},
		{1.2469, atMost, "1.25"}, // met: 1.25 is within "at most 1.25"
		{0.9972, perf.Goal{}, "1.00"},
	} {
		got := fmt.Sprintf(ratioFormat(c.median, c.g), c.median)
		if got != c.want {
			t.Errorf("ratioFormat(%v, %v): printed %s, want %s", c.median, c.g, got, c.want)
		}
	}
}
