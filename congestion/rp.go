package congestion

import (
	"math"
	"time"
)

// snapRate is the gap, in bits per second, under which fast recovery's halving RC ← (RT+RC)/2 is taken to
// have reached RT. Halving a float64 gap converges to within an ulp of RT and may then stall there, which
// would keep the increase timer armed forever at line rate.
const snapRate = 1.0

// tokenSlack absorbs float rounding in the token bucket, in bytes.
const tokenSlack = 1e-6

// DCQCNStats counts what a reaction point did.
type DCQCNStats struct {
	CNPs        uint64 // CNPs received
	CNPsIgnored uint64 // CNPs within DecreaseInterval of the last cut, dropped
	Cuts        uint64 // rate decreases
	TimerEvents uint64 // rate-increase events from the timer T
	ByteEvents  uint64 // rate-increase events from the byte counter B
	Sent        uint64 // packets reported by OnSent
	SentBytes   uint64 // wire bytes of those packets
}

// DCQCN is the reaction point of DCQCN [P §3] for one QP, with a token-bucket pacer. It starts at
// LineRate; a CNP cuts the current rate RC by α/2 and remembers it as the target RT; timer and byte-counter
// events then bring RC back towards RT (fast recovery) and raise RT (additive, then hyper increase).
//
// A DCQCN is owned by the goroutine that owns its QP; it is not safe for concurrent use. It allocates
// nothing after NewDCQCN.
type DCQCN struct {
	p Params

	started bool
	rc, rt  float64 // current and target rate, bits/s; MinRate ≤ RC ≤ RT ≤ LineRate
	alpha   float64

	// Recovery after a cut: the increase timer and the byte counter run while recovering, and stop once
	// RC is back at line rate.
	recovering bool
	tc, bc     int           // T_c and B_c: timer and byte events since the last cut
	incAt      time.Duration // next increase-timer event
	byteLeft   int64         // wire bytes until the next byte-counter event

	// α decay is applied lazily: α only matters at the next CNP, so it needs no wake-up of its own.
	alphaArmed bool
	alphaAt    time.Duration // next decay

	cut     bool // a cut has happened
	lastCut time.Duration

	tokens float64       // wire bytes that may leave now; at most Burst, negative after an oversized packet
	tokAt  time.Duration // when tokens was last brought up to date

	// Times inside are offsets from epoch, the first now seen: integer arithmetic on the per-packet path
	// instead of time.Time's.
	epoch time.Time
	last  time.Duration // latest now seen; an earlier now is treated as this one

	stats DCQCNStats
}

// NewDCQCN returns a reaction point at line rate with a full token bucket.
func NewDCQCN(p Params) (*DCQCN, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return &DCQCN{p: p, rc: p.LineRate, rt: p.LineRate, alpha: p.InitialAlpha, tokens: float64(p.Burst)}, nil
}

// Params returns the parameters the controller runs with.
func (c *DCQCN) Params() Params { return c.p }

// Rate returns RC, the current sending rate in wire bits per second.
func (c *DCQCN) Rate() float64 { return c.rc }

// TargetRate returns RT, the rate fast recovery converges to.
func (c *DCQCN) TargetRate() float64 { return c.rt }

// Alpha returns α as of the latest call that took a now.
func (c *DCQCN) Alpha() float64 { return c.alpha }

// Stats returns the event counters.
func (c *DCQCN) Stats() DCQCNStats { return c.stats }

// NextDeadline returns when the rate-increase timer next fires, or the zero time when the controller is at
// line rate and has nothing to do. α decay needs no deadline (see DCQCN).
func (c *DCQCN) NextDeadline() time.Time {
	if !c.recovering {
		return time.Time{}
	}
	return c.epoch.Add(c.incAt)
}

// OnTimer fires the increase-timer events due at or before now.
func (c *DCQCN) OnTimer(now time.Time) { c.advance(now) }

// NextSend returns when a packet of n payload bytes may leave: now if the bucket holds its estimated wire
// size (n + HeaderBytes + WireOverhead, capped at Burst), otherwise the time the bucket fills to that at
// the current rate, including the timer increases due in between.
func (c *DCQCN) NextSend(now time.Time, n int) time.Time {
	t := c.advance(now)
	need := min(float64(n+c.p.HeaderBytes+c.p.WireOverhead), float64(c.p.Burst))
	if c.ready(need) {
		return c.epoch.Add(t)
	}
	fill := t + floorDuration((need-c.tokens)*8/c.rc)
	if !c.recovering || c.incAt >= fill {
		return c.epoch.Add(fill)
	}
	// A timer event comes first: play the controller forward on a copy (with no CNP and no sends, only
	// the timer changes the rate).
	s := *c
	for {
		t = s.incAt
		s.advanceTo(t)
		if s.ready(need) {
			return c.epoch.Add(t)
		}
		fill = t + floorDuration((need-s.tokens)*8/s.rc)
		if !s.recovering || s.incAt >= fill {
			return c.epoch.Add(fill)
		}
	}
}

// ready reports whether the bucket holds need bytes, short by at most what one nanosecond at the current
// rate adds. NextSend rounds its answer down to the nanosecond so the rounding is carried in the bucket
// (a negative balance after the send) rather than lost to the Burst cap, which would lower the long-run
// rate; the bucket may therefore release up to one nanosecond of bytes early.
func (c *DCQCN) ready(need float64) bool {
	return c.tokens+c.rc/8*1e-9+tokenSlack >= need
}

// OnSent charges a packet of n bytes (as qp reports it: transport headers included) plus WireOverhead to
// the token bucket and the byte counter.
func (c *DCQCN) OnSent(now time.Time, n int) {
	c.advance(now)
	w := int64(n + c.p.WireOverhead)
	c.tokens -= float64(w)
	c.stats.Sent++
	c.stats.SentBytes += uint64(w)
	if !c.recovering || c.p.ByteCounter == 0 {
		return
	}
	c.byteLeft -= w
	for c.recovering && c.byteLeft <= 0 {
		c.byteLeft += c.byteThreshold()
		c.increase(false)
	}
}

// OnCNP cuts the rate [P §3 eq. (1)]: RT ← RC, RC ← RC·(1 − α/2), α ← (1 − g)·α + g, and restarts the
// increase timer, the byte counter, both event counts and the α timer.
func (c *DCQCN) OnCNP(now time.Time) {
	t := c.advance(now)
	c.stats.CNPs++
	if c.cut && c.p.DecreaseInterval > 0 && t-c.lastCut < c.p.DecreaseInterval {
		c.stats.CNPsIgnored++
		return
	}
	if c.p.ClampTarget || c.tc > 0 || c.bc > 0 {
		c.rt = c.rc
	}
	if c.p.CutWithNewAlpha {
		c.alpha = (1-c.p.G)*c.alpha + c.p.G
		c.rc = max(c.p.MinRate, c.rc*(1-c.alpha/2))
	} else {
		c.rc = max(c.p.MinRate, c.rc*(1-c.alpha/2))
		c.alpha = (1-c.p.G)*c.alpha + c.p.G
	}
	c.stats.Cuts++
	c.cut, c.lastCut = true, t
	c.tc, c.bc = 0, 0
	c.recovering = true
	c.incAt = t + c.p.IncreaseInterval
	c.byteLeft = c.p.ByteCounter
	c.alphaArmed, c.alphaAt = true, t+c.p.AlphaInterval
}

// advance brings the controller up to now and returns now as an offset from the epoch; a now earlier than
// one already seen is taken as the latest seen.
func (c *DCQCN) advance(now time.Time) time.Duration {
	if !c.started {
		c.started, c.epoch = true, now
		return 0
	}
	t := max(now.Sub(c.epoch), c.last)
	c.advanceTo(t)
	return t
}

// advanceTo fires the increase-timer events due at or before t at their own times, so the token bucket
// fills at the rate in force over each stretch, and applies the α decays due.
func (c *DCQCN) advanceTo(t time.Duration) {
	c.last = t
	for c.recovering && c.incAt <= t {
		at := c.incAt
		c.accrue(at)
		c.incAt = at + c.timerPeriod()
		c.increase(true)
	}
	c.accrue(t)
	if c.alphaArmed && t >= c.alphaAt {
		k := 1 + (t-c.alphaAt)/c.p.AlphaInterval
		c.alpha *= math.Pow(1-c.p.G, float64(k))
		c.alphaAt += k * c.p.AlphaInterval
	}
}

// accrue fills the bucket at the current rate up to t.
func (c *DCQCN) accrue(t time.Duration) {
	if d := t - c.tokAt; d > 0 {
		c.tokens = min(float64(c.p.Burst), c.tokens+c.rc/8*d.Seconds())
		c.tokAt = t
	}
}

// hyper reports whether both event counts are past F.
func (c *DCQCN) hyper() bool { return min(c.tc, c.bc) > c.p.FastRecovery }

// timerPeriod is the time to the next timer event, read before the event that is firing is counted.
func (c *DCQCN) timerPeriod() time.Duration {
	if c.p.HyperHalving && c.hyper() {
		return c.p.IncreaseInterval / 2
	}
	return c.p.IncreaseInterval
}

// byteThreshold is the bytes to the next byte event, read before the event that is firing is counted.
func (c *DCQCN) byteThreshold() int64 {
	if c.p.HyperHalving && c.hyper() {
		return c.p.ByteCounter / 2
	}
	return c.p.ByteCounter
}

// increase runs one rate-increase event [P §3 Fig. 7, eqs. (3)-(4)]: fast recovery while neither count is
// past F, additive increase while one is, hyper increase once both are; then RC ← (RT + RC)/2.
func (c *DCQCN) increase(timer bool) {
	if timer {
		c.tc++
		c.stats.TimerEvents++
	} else {
		c.bc++
		c.stats.ByteEvents++
	}
	f := c.p.FastRecovery
	switch lo, hi := min(c.tc, c.bc), max(c.tc, c.bc); {
	case hi <= f: // fast recovery: RT unchanged
	case lo <= f:
		c.rt += c.p.RateAI
	default:
		c.rt += float64(lo-f) * c.p.RateHAI
	}
	c.rt = min(c.rt, c.p.LineRate)
	c.rc = (c.rt + c.rc) / 2
	if c.rt-c.rc < snapRate {
		c.rc = c.rt
	}
	if c.rc >= c.p.LineRate {
		c.rc = c.p.LineRate
		c.recovering = false
	}
}

// floorDuration converts seconds to a Duration rounded down to the nanosecond, at least 1 ns.
func floorDuration(sec float64) time.Duration {
	ns := math.Floor(sec * 1e9)
	if ns < 1 {
		return 1
	}
	if ns > math.MaxInt64/2 {
		return math.MaxInt64 / 2
	}
	return time.Duration(ns)
}
