package congestion_test

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/goroce/goroce/congestion"
)

// Cuts 50 µs apart halve the rate (α stays 1) until MinRate holds it.
func TestClampAtMinRate(t *testing.T) {
	c := newRP(t, congestion.DefaultParams(40e9))
	for i := range 8 {
		c.OnCNP(us(50 * float64(i)))
	}
	near(t, "RC after 8 cuts", c.Rate(), 40e9/256) // 156.25 Mb/s
	c.OnCNP(us(400))
	near(t, "RC after 9 cuts", c.Rate(), 100e6) // 78.125 Mb/s floored
	near(t, "RT after 9 cuts", c.TargetRate(), 40e9/256)
	c.OnCNP(us(450))
	checkRates(t, c, "cut at the floor", 100e6, 100e6)
}

// Recovery ends exactly at line rate: RC never exceeds it, RT is capped there and the timer disarms.
func TestClampAtLineRate(t *testing.T) {
	c := newRP(t, congestion.DefaultParams(40e9))
	c.OnCNP(t0)
	n := 0
	for d := c.NextDeadline(); !d.IsZero(); d = c.NextDeadline() {
		c.OnTimer(d)
		if c.Rate() > 40e9 || c.TargetRate() > 40e9 || c.Rate() > c.TargetRate() {
			t.Fatalf("event %d: RC %v RT %v beyond line rate or target", n, c.Rate(), c.TargetRate())
		}
		if n++; n > 100 {
			t.Fatal("still recovering after 100 timer events")
		}
	}
	checkRates(t, c, "recovered", 40e9, 40e9)
	if n != 35 { // fast recovery halves a 20 Gb/s gap until it is under 1 b/s: 20e9/2^35 < 1 < 20e9/2^34
		t.Errorf("recovered after %d events, want 35", n)
	}
	c.OnSent(us(1e6), 100_000_000)
	if s := c.Stats(); s.ByteEvents != 0 {
		t.Errorf("byte events at line rate: %d", s.ByteEvents)
	}
}

// At most one cut per DecreaseInterval ([NV] rate_reduce_monitor_period); an ignored CNP leaves α alone.
func TestDecreaseInterval(t *testing.T) {
	c := newRP(t, congestion.DefaultParams(40e9))
	c.OnCNP(t0)
	c.OnCNP(us(3.999))
	checkRates(t, c, "CNP inside the interval", 20e9, 40e9)
	c.OnCNP(us(4))
	checkRates(t, c, "CNP at the interval", 10e9, 20e9)
	if s := c.Stats(); s.CNPs != 3 || s.Cuts != 2 || s.CNPsIgnored != 1 {
		t.Errorf("stats %+v", s)
	}
}

// ClampTarget false (QCN rule): RT follows RC only if an increase event happened since the last cut.
func TestNoClampTarget(t *testing.T) {
	p := congestion.DefaultParams(40e9)
	p.ClampTarget = false
	c := newRP(t, p)
	c.OnCNP(t0)
	c.OnCNP(us(50))
	checkRates(t, c, "second cut without an increase", 10e9, 40e9)
	c.OnTimer(us(105)) // fast recovery: (40 + 10)/2
	checkRates(t, c, "after one event", 25e9, 40e9)
	c.OnCNP(us(110)) // α decayed once, at 105 µs
	checkRates(t, c, "cut after an event", 25e9*(1-(1-g)/2), 25e9)
}

// The cut uses α before its update ([P] eq. (1) order) unless CutWithNewAlpha ([S] order).
func TestAlphaOrder(t *testing.T) {
	for _, tc := range []struct {
		newAlpha bool
		rc       float64
	}{
		{false, 40e9 * (1 - 0.5/2)},
		{true, 40e9 * (1 - (0.5*(1-g)+g)/2)},
	} {
		p := congestion.DefaultParams(40e9)
		p.InitialAlpha, p.CutWithNewAlpha = 0.5, tc.newAlpha
		c := newRP(t, p)
		c.OnCNP(t0)
		near(t, "RC", c.Rate(), tc.rc)
		near(t, "alpha", c.Alpha(), 0.501953125)
	}
}

// At 10 Gb/s a 4096-byte payload costs 4096 + 16 + 66 = 4178 wire bytes: one every 3342.4 ns.
func TestPacerSpacing(t *testing.T) {
	c := newRP(t, congestion.DefaultParams(10e9))
	const spacing = 4178 * 8 / 10e9 * 1e9 // ns
	now := t0
	for k := range 1000 {
		at := c.NextSend(now, 4096)
		if k == 0 && !at.Equal(t0) {
			t.Fatalf("first packet held until %v", at.Sub(t0))
		}
		if again := c.NextSend(at, 4096); !again.Equal(at) {
			t.Fatalf("packet %d: NextSend(%v) = %v, not accepted at its own answer", k, at.Sub(t0), again.Sub(t0))
		}
		if math.Abs(float64(at.Sub(t0))-float64(k)*spacing) > 1 {
			t.Fatalf("packet %d at %v, want %.1f ns", k, at.Sub(t0), float64(k)*spacing)
		}
		c.OnSent(at, 4096+16)
		now = at
	}
	if s := c.Stats(); s.Sent != 1000 || s.SentBytes != 1000*4178 {
		t.Errorf("stats %+v", s)
	}
}

// After an idle period the bucket lets Burst bytes go back-to-back and no more; a packet larger than the
// bucket waits for a full one.
func TestPacerBurst(t *testing.T) {
	c := newRP(t, congestion.DefaultParams(10e9)) // Burst 4178
	n := 0
	for c.NextSend(t0, 1024).Equal(t0) {
		c.OnSent(t0, 1024+16)
		n++
	}
	if n != 3 { // 3 × 1106 = 3318 ≤ 4178 < 4 × 1106
		t.Errorf("%d packets of 1106 wire bytes left at once, want 3", n)
	}
	if got, want := c.NextSend(t0, 1024).Sub(t0), time.Duration(196); got != want { // 246 bytes at 1.25 B/ns = 196.8 ns, rounded down
		t.Errorf("fourth packet waits %v, want %v", got, want)
	}

	p := congestion.DefaultParams(10e9)
	p.Burst = 1000
	c = newRP(t, p)
	if !c.NextSend(t0, 4096).Equal(t0) {
		t.Fatal("oversized packet held with a full bucket")
	}
	c.OnSent(t0, 4112)                                                               // tokens 1000 − 4178
	if got, want := c.NextSend(t0, 4096).Sub(t0), time.Duration(3342); got != want { // 4178 bytes = 3342.4 ns, rounded down
		t.Errorf("next oversized packet waits %v, want %v (a full bucket)", got, want)
	}
}

// Whatever the sizes and gaps, the bytes sent in any window [a, b] never exceed Burst + rate·(b−a).
func TestPacerNeverExceedsBurst(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 7))
	p := congestion.DefaultParams(10e9)
	p.Burst = 3 * 4178 // at least the largest packet: an oversized one may overdraw by design
	c := newRP(t, p)
	type sent struct {
		at time.Time
		w  int
	}
	var log []sent
	now := t0
	for range 400 {
		n := rng.IntN(4097)
		if rng.IntN(8) == 0 {
			now = now.Add(time.Duration(rng.IntN(20_000))) // idle up to 20 µs
		}
		at := c.NextSend(now, n)
		if at.Before(now) {
			t.Fatalf("seed %d: NextSend answered %v before now", seed, now.Sub(at))
		}
		c.OnSent(at, n+16)
		log = append(log, sent{at, n + 16 + 66})
		now = at
	}
	for i := range log {
		bytes := 0
		for j := i; j < len(log); j++ {
			bytes += log[j].w
			// Burst + 1.25 bytes/ns over the window and one ns more (NextSend rounds down to the ns), in
			// quarter bytes so that no float rounding decides: seed 1796165227889840851 put 31944 bytes
			// against a float limit of 31943.99999999999.
			ns := int64(log[j].at.Sub(log[i].at))
			if limit4 := 4*int64(p.Burst) + 5*(ns+1); 4*int64(bytes) > limit4 {
				t.Fatalf("seed %d: %d bytes in [%v, %v], limit %.2f", seed, bytes, log[i].at.Sub(t0), log[j].at.Sub(t0), float64(limit4)/4)
			}
		}
	}
}

// NextSend accounts for the rate increases the timer will make before the packet may go, whether or not
// the owner calls OnTimer in between, and asking does not change the answer.
func TestNextSendSeesTimerIncreases(t *testing.T) {
	c := newRP(t, congestion.DefaultParams(40e9))
	for i := range 9 {
		c.OnCNP(us(50 * float64(i))) // down to MinRate, 100 Mb/s, at t = 400 µs
	}
	now := us(400)
	c.OnSent(now, 4096+16) // the bucket is ~empty: 4178 bytes at 100 Mb/s would take 334 µs
	at := c.NextSend(now, 4096)
	if again := c.NextSend(now, 4096); !again.Equal(at) {
		t.Fatalf("NextSend not idempotent: %v then %v", at.Sub(t0), again.Sub(t0))
	}
	naive := now.Add(334 * time.Microsecond) // 4178 bytes at 100 Mb/s: 334.24 µs
	if !at.Before(naive) || !at.After(us(455)) {
		t.Fatalf("NextSend = %v, want after the first increase at 455 µs and before %v", at.Sub(t0), naive.Sub(t0))
	}
	// An owner that fires every timer sees the same time; one that only asks sees it too.
	d := newRP(t, congestion.DefaultParams(40e9))
	for i := range 9 {
		d.OnCNP(us(50 * float64(i)))
	}
	d.OnSent(now, 4096+16)
	for dl := d.NextDeadline(); dl.Before(at); dl = d.NextDeadline() {
		d.OnTimer(dl)
	}
	if got := d.NextSend(at.Add(-time.Nanosecond), 4096); !got.Equal(at) {
		t.Errorf("after firing the timers NextSend = %v, want %v", got.Sub(t0), at.Sub(t0))
	}
	if got := d.NextSend(at, 4096); !got.Equal(at) {
		t.Errorf("at its time NextSend = %v, want %v", got.Sub(t0), at.Sub(t0))
	}
	if got := c.NextSend(at, 4096); !got.Equal(at) {
		t.Errorf("without OnTimer NextSend(at) = %v, want %v", got.Sub(t0), at.Sub(t0))
	}
}

// A now earlier than one already seen is treated as the latest: nothing goes backwards.
func TestTimeNeverGoesBack(t *testing.T) {
	c := newRP(t, congestion.DefaultParams(40e9))
	c.OnCNP(us(100))
	c.OnTimer(us(155))
	rc := c.Rate()
	c.OnCNP(us(50)) // treated as 155 µs: a cut, with α decayed once
	near(t, "RC", c.Rate(), rc*(1-(1-g)/2))
	if at := c.NextSend(us(0), 0); at.Before(us(155)) {
		t.Errorf("NextSend with an old now answered %v", at.Sub(t0))
	}
}
