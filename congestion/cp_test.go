package congestion_test

import (
	"math/rand/v2"
	"testing"

	"github.com/goroce/goroce/congestion"
)

func TestMarkingProbability(t *testing.T) {
	m := congestion.DefaultMarking()
	if m != (congestion.Marking{Kmin: 5000, Kmax: 200_000, Pmax: 0.01}) {
		t.Fatalf("DefaultMarking = %+v", m)
	}
	for _, tc := range []struct {
		q    int
		want float64
	}{
		{0, 0},
		{5000, 0},                           // at Kmin: never
		{5001, 0.01 / 195_000},              // just above: the ramp starts
		{102_500, 0.005},                    // halfway: Pmax/2
		{150_000, 0.01 * 145_000 / 195_000}, // linear in between
		{200_000, 0.01},                     // at Kmax: Pmax
		{200_001, 1},                        // above: always
		{1 << 30, 1},
	} {
		near(t, "p", m.Probability(tc.q), tc.want)
	}
	for _, tc := range []struct {
		q    int
		u    float64
		want bool
	}{
		{5000, 0, false},
		{5001, 0, true},
		{102_500, 0.004999, true},
		{102_500, 0.005, false},
		{200_000, 0.0099, true},
		{200_000, 0.01, false},
		{200_001, 0.999999, true},
	} {
		if got := m.Mark(tc.q, tc.u); got != tc.want {
			t.Errorf("Mark(%d, %v) = %v, want %v", tc.q, tc.u, got, tc.want)
		}
	}
	step := congestion.Marking{Kmin: 40_000, Kmax: 40_000, Pmax: 1} // DCTCP-style
	if step.Probability(40_000) != 0 || step.Probability(40_001) != 1 {
		t.Errorf("step marking: p(K) = %v, p(K+1) = %v", step.Probability(40_000), step.Probability(40_001))
	}
}

// Over many draws the marked fraction matches the probability (seeded, so it cannot flake).
func TestMarkingFrequency(t *testing.T) {
	m := congestion.Marking{Kmin: 5000, Kmax: 200_000, Pmax: 0.2}
	rng := rand.New(rand.NewPCG(1, 2))
	const n = 200_000
	marked := 0
	for range n {
		if m.Mark(102_500, rng.Float64()) {
			marked++
		}
	}
	if f := float64(marked) / n; f < 0.098 || f > 0.102 { // p = 0.1, σ ≈ 0.00067
		t.Errorf("marked fraction %v, want 0.1", f)
	}
}
