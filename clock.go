package goroce

import (
	"sync"
	"time"
)

// Clock is where a device gets the time. The protocol engines never read a clock: the device reads
// this one and hands them the time, so the same engines run on the real clock, on a manual clock in
// tests and on the simulator's virtual clock.
type Clock interface {
	Now() time.Time
	// NewTimer returns a timer that fires once, d from now, unless stopped or reset.
	NewTimer(d time.Duration) Timer
}

// Timer is a one-shot timer of a Clock.
type Timer interface {
	C() <-chan time.Time
	Reset(d time.Duration)
	Stop()
}

// RealClock is the system's monotonic clock.
type RealClock struct{}

// Now returns time.Now().
func (RealClock) Now() time.Time { return time.Now() }

// NewTimer returns a time.Timer.
func (RealClock) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time   { return r.t.C }
func (r realTimer) Reset(d time.Duration) { r.t.Reset(d) }
func (r realTimer) Stop()                 { r.t.Stop() }

// ManualClock is a clock that moves only when Advance is called; its timers fire then. It is for tests
// that want time under control.
type ManualClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*manualTimer
}

// NewManualClock returns a manual clock reading start.
func NewManualClock(start time.Time) *ManualClock { return &ManualClock{now: start} }

// Now returns the clock's time.
func (m *ManualClock) Now() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.now
}

// Advance moves the clock forward by d and fires the timers that come due.
func (m *ManualClock) Advance(d time.Duration) {
	m.mu.Lock()
	m.now = m.now.Add(d)
	now := m.now
	var due []*manualTimer
	for _, t := range m.timers {
		if t.armed && !t.at.After(now) {
			t.armed = false
			due = append(due, t)
		}
	}
	m.mu.Unlock()
	for _, t := range due {
		select {
		case t.c <- now:
		default:
		}
	}
}

// NewTimer returns a timer that fires when the clock has advanced by d.
func (m *ManualClock) NewTimer(d time.Duration) Timer {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := &manualTimer{clock: m, c: make(chan time.Time, 1), at: m.now.Add(d), armed: true}
	m.timers = append(m.timers, t)
	return t
}

type manualTimer struct {
	clock *ManualClock
	c     chan time.Time
	at    time.Time
	armed bool
}

func (t *manualTimer) C() <-chan time.Time { return t.c }

func (t *manualTimer) Reset(d time.Duration) {
	t.clock.mu.Lock()
	t.at, t.armed = t.clock.now.Add(d), true
	t.clock.mu.Unlock()
}

func (t *manualTimer) Stop() {
	t.clock.mu.Lock()
	t.armed = false
	t.clock.mu.Unlock()
}
