package sim

import (
	"testing"
	"time"
)

// BenchmarkIncast16x100G runs the yardstick: 16 senders writing to one receiver through one
// switch at 100 Gb/s, for 10 ms of simulated time. It reports simulated events per second and the wall
// time of one run.
func BenchmarkIncast16x100G(b *testing.B) {
	p, _ := DefaultParams("incast")
	p.Flows, p.Rate, p.Duration = 16, 100, 10*time.Millisecond
	b.ReportAllocs()
	var events uint64
	start := time.Now()
	for i := 0; i < b.N; i++ {
		r, err := RunScenario("incast", p)
		if err != nil {
			b.Fatal(err)
		}
		events += r.Sim.Processed
	}
	el := time.Since(start)
	b.ReportMetric(float64(events)/el.Seconds(), "events/s")
	b.ReportMetric(el.Seconds()/float64(b.N), "s/run")
}

// BenchmarkIncast16x100GPFC is the same incast made lossless by PFC: every packet crosses the switch.
func BenchmarkIncast16x100GPFC(b *testing.B) {
	p, _ := DefaultParams("incast")
	p.Flows, p.Rate, p.Duration, p.PFC = 16, 100, 10*time.Millisecond, true
	b.ReportAllocs()
	var events uint64
	start := time.Now()
	for i := 0; i < b.N; i++ {
		r, err := RunScenario("incast", p)
		if err != nil {
			b.Fatal(err)
		}
		events += r.Sim.Processed
	}
	el := time.Since(start)
	b.ReportMetric(float64(events)/el.Seconds(), "events/s")
	b.ReportMetric(el.Seconds()/float64(b.N), "s/run")
}

// BenchmarkPacketEvent measures the steady-state cost of one event on a back-to-back link, and checks
// that the per-packet path does not allocate.
func BenchmarkPacketEvent(b *testing.B) {
	s := New(1)
	t := BackToBack(s, LinkConfig{Rate: 100e9, Delay: time.Microsecond}, HostConfig{})
	if _, err := s.AddFlow(FlowSpec{Src: t.Hosts[0], Dst: t.Hosts[1], Op: OpWrite}); err != nil {
		b.Fatal(err)
	}
	s.Run(100 * Microsecond) // warm up: pools, queues and the heap reach their size
	b.ReportAllocs()
	b.ResetTimer()
	start := s.Processed
	for s.Processed-start < uint64(b.N) {
		s.Run(s.Now() + 10*Microsecond)
	}
}
