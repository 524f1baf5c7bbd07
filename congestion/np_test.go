package congestion_test

import (
	"testing"
	"time"

	"github.com/goroce/goroce/congestion"
)

// CE packets every 10 µs for 1 ms produce a CNP at 0, 50, 100, … 950 µs: one per N = 50 µs.
func TestNPOnePerInterval(t *testing.T) {
	np := congestion.NewNP(congestion.DefaultCNPInterval)
	var got []time.Duration
	for i := range 100 {
		now := us(10 * float64(i))
		if np.OnCE(now) {
			got = append(got, now.Sub(t0))
		}
	}
	if len(got) != 20 {
		t.Fatalf("%d CNPs, want 20: %v", len(got), got)
	}
	for i, d := range got {
		if want := time.Duration(i) * 50 * time.Microsecond; d != want {
			t.Fatalf("CNP %d at %v, want %v", i, d, want)
		}
	}
	if s := np.Stats(); s.CE != 100 || s.CNPs != 20 || s.Suppressed != 80 {
		t.Errorf("stats %+v", s)
	}
}

// The first CE packet of a flow gets a CNP at once; the next goes exactly N after the last one, not
// before; a CE packet after a quiet spell gets one at once again.
func TestNPBoundaries(t *testing.T) {
	np := congestion.NewNP(congestion.DefaultCNPInterval)
	for _, step := range []struct {
		at   float64
		want bool
	}{
		{500, true},
		{500, false},
		{549.999, false},
		{550, true},
		{560, false},
		{2000, true},
		{1990, false}, // an earlier now than the last CNP sends nothing
	} {
		if got := np.OnCE(us(step.at)); got != step.want {
			t.Errorf("OnCE at %v µs = %v, want %v", step.at, got, step.want)
		}
	}
	var zero congestion.NP
	for i := range 3 {
		if !zero.OnCE(t0) {
			t.Errorf("zero NP: CE %d produced no CNP", i)
		}
	}
}
