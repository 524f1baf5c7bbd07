package monotime

import (
	"testing"
	"time"
)

// TestNowFollowsTimeNow checks that Now agrees with time.Now on both clocks, and that its readings
// carry a monotonic reading: a deadline built from one means what time.Now's would.
func TestNowFollowsTimeNow(t *testing.T) {
	for i := 0; i < 1000; i++ {
		before := time.Now()
		now := Now()
		after := time.Now()
		if now.Before(before) || now.After(after) {
			t.Fatalf("Now %v is outside [%v, %v] on the monotonic clock", now, before, after)
		}
		// The wall clock may lag a step of the system's clock; without one it is within a
		// millisecond of time.Now's (the base's two readings are nanoseconds apart).
		if w := now.Round(0).Sub(before.Round(0)); w < -time.Millisecond || w > after.Round(0).Sub(before.Round(0))+time.Millisecond {
			t.Fatalf("Now's wall clock %v is %v from time.Now's %v", now.Round(0), w, before.Round(0))
		}
		if now.Round(0) == now {
			t.Fatal("Now's reading has no monotonic clock reading")
		}
	}
}

// TestNowReanchors checks that Now takes a fresh base once the old one is older than reanchor, so that
// its wall clock follows the system's.
func TestNowReanchors(t *testing.T) {
	old := time.Now().Add(-2 * reanchor)
	base.Store(&old)
	now := Now()
	if b := base.Load(); b == &old || !b.Equal(now) {
		t.Fatalf("Now did not take a new base: base %v, now %v", *b, now)
	}
	if d := now.Sub(old); d < 2*reanchor {
		t.Fatalf("Now is %v after a base %v old", d, 2*reanchor)
	}
}

func BenchmarkNow(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		_ = Now()
	}
}

func BenchmarkTimeNow(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		_ = time.Now()
	}
}
