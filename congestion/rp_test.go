package congestion_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/goroce/goroce/congestion"
	"github.com/goroce/goroce/qp"
)

// The requester's hook and the controller interface have the same method sets; qp must not import
// congestion, so the check lives here.
var (
	_ qp.Pacer              = (*congestion.DCQCN)(nil)
	_ qp.CNPReceiver        = (*congestion.DCQCN)(nil)
	_ congestion.Controller = (*congestion.DCQCN)(nil)
	_ qp.Pacer              = congestion.Controller(nil)
)

var t0 = time.Unix(1_000, 0)

func us(n float64) time.Time { return t0.Add(time.Duration(n * float64(time.Microsecond))) }

const g = 1.0 / 256

func newRP(t *testing.T, p congestion.Params) *congestion.DCQCN {
	t.Helper()
	c, err := congestion.NewDCQCN(p)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// near asserts got is within a relative 1e-12 of want.
func near(t *testing.T, what string, got, want float64) {
	t.Helper()
	if math.Abs(got-want) > 1e-12*math.Max(1, math.Abs(want)) {
		t.Errorf("%s = %.17g, want %.17g", what, got, want)
	}
}

func checkRates(t *testing.T, c *congestion.DCQCN, step string, rc, rt float64) {
	t.Helper()
	near(t, step+": RC", c.Rate(), rc)
	near(t, step+": RT", c.TargetRate(), rt)
}

func TestDefaultParams(t *testing.T) {
	p := congestion.DefaultParams(40e9)
	want := congestion.Params{
		LineRate: 40e9, MinRate: 100e6, G: 1.0 / 256, InitialAlpha: 1,
		AlphaInterval: 55 * time.Microsecond, IncreaseInterval: 55 * time.Microsecond,
		ByteCounter: 10_000_000, FastRecovery: 5, RateAI: 40e6, RateHAI: 200e6,
		DecreaseInterval: 4 * time.Microsecond, ClampTarget: true,
		WireOverhead: 66, HeaderBytes: 16, Burst: 4096 + 16 + 66,
	}
	if p != want {
		t.Errorf("DefaultParams(40e9) = %+v\nwant %+v", p, want)
	}
	if err := p.Validate(); err != nil {
		t.Error(err)
	}
	p10 := congestion.DefaultParams(10e9)
	near(t, "RateAI at 10G", p10.RateAI, 10e6)
	near(t, "RateHAI at 10G", p10.RateHAI, 50e6)
	if p := congestion.DefaultParams(50e6); p.MinRate != 50e6 {
		t.Errorf("MinRate at 50 Mb/s line = %v, want the line rate", p.MinRate)
	}
	for name, mod := range map[string]func(*congestion.Params){
		"LineRate":         func(p *congestion.Params) { p.LineRate = 0 },
		"MinRate":          func(p *congestion.Params) { p.MinRate = 50e9 },
		"G":                func(p *congestion.Params) { p.G = math.NaN() },
		"InitialAlpha":     func(p *congestion.Params) { p.InitialAlpha = 1.5 },
		"AlphaInterval":    func(p *congestion.Params) { p.AlphaInterval = 0 },
		"IncreaseInterval": func(p *congestion.Params) { p.IncreaseInterval = 0 },
		"ByteCounter":      func(p *congestion.Params) { p.ByteCounter = -1 },
		"Burst":            func(p *congestion.Params) { p.Burst = 0 },
	} {
		p := congestion.DefaultParams(40e9)
		mod(&p)
		if _, err := congestion.NewDCQCN(p); !errors.Is(err, congestion.ErrParams) {
			t.Errorf("bad %s: err = %v, want ErrParams", name, err)
		}
	}
}

// A CNP at line rate with α = 1 halves the rate; α stays 1 − g + g = 1; the timer arms T later.
func TestCutOnCNP(t *testing.T) {
	c := newRP(t, congestion.DefaultParams(40e9))
	if c.Rate() != 40e9 || c.NextDeadline() != (time.Time{}) {
		t.Fatalf("initial rate %v deadline %v, want line rate and no deadline", c.Rate(), c.NextDeadline())
	}
	c.OnCNP(t0)
	checkRates(t, c, "first CNP", 20e9, 40e9)
	near(t, "alpha", c.Alpha(), 1)
	if d := c.NextDeadline(); !d.Equal(us(55)) {
		t.Errorf("NextDeadline = %v, want t0+55µs", d.Sub(t0))
	}
	// 50 µs later (the NP's spacing), no increase or decay has happened yet: RT ← 20G, RC ← 10G.
	c.OnCNP(us(50))
	checkRates(t, c, "second CNP", 10e9, 20e9)
	near(t, "alpha", c.Alpha(), 1)
	if d := c.NextDeadline(); !d.Equal(us(105)) {
		t.Errorf("NextDeadline = %v, want the timer restarted at t0+105µs", d.Sub(t0))
	}
	if s := c.Stats(); s.CNPs != 2 || s.Cuts != 2 || s.TimerEvents != 0 {
		t.Errorf("stats %+v", s)
	}
}

// α decays by (1−g) once per K = 55 µs without a CNP, counted from the last CNP; the cut after three
// decays and three fast-recovery steps uses the decayed α.
func TestAlphaDecay(t *testing.T) {
	c := newRP(t, congestion.DefaultParams(40e9))
	c.OnTimer(us(500)) // no CNP yet: α does not decay ([S] arms the α timer on a CNP)
	near(t, "alpha before any CNP", c.Alpha(), 1)
	c.OnCNP(us(1000))
	for _, step := range []struct {
		at    float64
		alpha float64
	}{
		{1054.999, 1},
		{1055, 1 - g},
		{1109.999, 1 - g},
		{1110, (1 - g) * (1 - g)},
		{1164.999, (1 - g) * (1 - g)},
	} {
		c.OnTimer(us(step.at))
		near(t, "alpha at t0+"+time.Duration(step.at*1e3).String(), c.Alpha(), step.alpha)
	}
	// Timer events at +55, +110, +165: fast recovery 20 → 30 → 35 → 37.5 Gb/s. The decay at +165 is
	// the third. Then a CNP at +200 µs.
	c.OnCNP(us(1200))
	a3 := math.Pow(1-g, 3)
	checkRates(t, c, "cut with decayed alpha", 37.5e9*(1-a3/2), 37.5e9)
	near(t, "alpha after CNP", c.Alpha(), (1-g)*a3+g)
	near(t, "RC literal", c.Rate(), 18968869373.202324)

	// A CNP restarts the α timer: CNPs 50 µs apart never let α decay.
	c2 := newRP(t, congestion.DefaultParams(40e9))
	for i := range 10 {
		c2.OnCNP(us(float64(i) * 50))
	}
	c2.OnTimer(us(504))
	near(t, "alpha with CNPs every 50µs", c2.Alpha(), 1)
	c2.OnTimer(us(505))
	near(t, "alpha 55µs after the last CNP", c2.Alpha(), 1-g)

	// A long idle period applies all its decays at once.
	c2.OnTimer(us(450 + 55*100))
	near(t, "alpha after 100 periods", c2.Alpha(), math.Pow(1-g, 100))
}

// Timer-only recovery: the first F = 5 events are fast recovery, then additive increase (the byte count
// stays 0, so hyper increase never starts).
func TestFastRecoveryThenAdditive(t *testing.T) {
	c := newRP(t, congestion.DefaultParams(40e9))
	c.OnCNP(t0)
	c.OnCNP(us(50)) // RT 20G, RC 10G
	want := []struct{ rt, rc float64 }{
		{20e9, 15e9}, {20e9, 17.5e9}, {20e9, 18.75e9}, {20e9, 19.375e9}, {20e9, 19.6875e9}, // fast recovery
		{20.04e9, 19.86375e9}, {20.08e9, 19.971875e9}, {20.12e9, 20.0459375e9}, // additive, R_AI 40 Mb/s
	}
	for i, w := range want {
		d := c.NextDeadline()
		if wantD := us(50 + 55*float64(i+1)); !d.Equal(wantD) {
			t.Fatalf("event %d: deadline %v, want %v", i+1, d.Sub(t0), wantD.Sub(t0))
		}
		c.OnTimer(d.Add(-time.Nanosecond))
		if c.Stats().TimerEvents != uint64(i) {
			t.Fatalf("event %d fired early", i+1)
		}
		c.OnTimer(d)
		checkRates(t, c, "timer event "+string(rune('1'+i)), w.rc, w.rt)
	}
}

// Both counters past F: hyper increase adds (min(T_c, B_c) − F)·R_HAI; the byte counter fires every B
// wire bytes.
func TestByteCounterAndHyper(t *testing.T) {
	p := congestion.DefaultParams(40e9)
	p.IncreaseInterval = 10 * time.Microsecond
	p.ByteCounter = 1000
	p.WireOverhead, p.HeaderBytes = 0, 0
	p.DecreaseInterval = 0
	c := newRP(t, p)
	c.OnSent(t0, 1_000_000) // at line rate nothing is recovering: no byte events
	if s := c.Stats(); s.ByteEvents != 0 {
		t.Fatalf("byte events at line rate: %d", s.ByteEvents)
	}
	c.OnCNP(t0)
	c.OnCNP(us(5)) // RT 20G, RC 10G
	c.OnTimer(us(65))
	checkRates(t, c, "six timer events", 19.86375e9, 20.04e9) // T_c = 6, B_c = 0
	c.OnSent(us(66), 999)
	if s := c.Stats(); s.ByteEvents != 0 {
		t.Fatalf("byte event after 999 of 1000 bytes")
	}
	c.OnSent(us(66), 1)
	checkRates(t, c, "B_c 1 (additive)", 19.971875e9, 20.08e9)
	c.OnSent(us(66), 5000) // B_c 2..6: four additive steps, then hyper with i = 1
	checkRates(t, c, "B_c 6 (hyper i=1)", 20317871093.75, 20.44e9)
	c.OnTimer(us(75)) // T_c 7, B_c 6: i = 1
	checkRates(t, c, "T_c 7 (hyper i=1)", 20478935546.875, 20.64e9)
	c.OnSent(us(76), 1000) // B_c 7: i = 2
	checkRates(t, c, "B_c 7 (hyper i=2)", 20759467773.4375, 21.04e9)
	if s := c.Stats(); s.TimerEvents != 7 || s.ByteEvents != 7 {
		t.Errorf("stats %+v, want 7 timer and 7 byte events", s)
	}
}

// HyperHalving ([S]): after an event taken in hyper increase the timer period and byte threshold halve.
func TestHyperHalving(t *testing.T) {
	p := congestion.DefaultParams(40e9)
	p.IncreaseInterval, p.ByteCounter, p.FastRecovery = 10*time.Microsecond, 1000, 0
	p.WireOverhead, p.HyperHalving = 0, true
	// CNPs at 0 and 5 µs; B_c 1 at 6 µs (additive, F = 0). Timer events: 15 (T_c 1, taken while not yet
	// in hyper: next +10 → 25), 25 (taken in hyper: next +5 → 30), 30, 35.
	c2 := newRP(t, p)
	c2.OnCNP(t0)
	c2.OnCNP(us(5))
	c2.OnSent(us(6), 1000)
	var got []time.Duration
	for range 4 {
		d := c2.NextDeadline()
		got = append(got, d.Sub(t0))
		c2.OnTimer(d)
	}
	want := []time.Duration{15 * time.Microsecond, 25 * time.Microsecond, 30 * time.Microsecond, 35 * time.Microsecond}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("deadlines %v, want %v", got, want)
		}
	}
	c2.OnSent(us(36), 1000) // a byte event taken in hyper increase: the next threshold is 500
	before := c2.Stats().ByteEvents
	c2.OnSent(us(37), 499)
	c2.OnSent(us(37), 1)
	if got := c2.Stats().ByteEvents; got != before+1 {
		t.Errorf("byte events after 500 more bytes: %d, want %d", got, before+1)
	}
}
