package congestion_test

import (
	"testing"
	"time"

	"github.com/goroce/goroce/congestion"
)

// BenchmarkPacedSend is the requester's per-packet path at line rate: ask, then report the packet.
func BenchmarkPacedSend(b *testing.B) {
	c, _ := congestion.NewDCQCN(congestion.DefaultParams(40e9))
	now := t0
	b.ReportAllocs()
	for b.Loop() {
		now = c.NextSend(now, 4096)
		c.OnSent(now, 4112)
	}
}

// BenchmarkPacedSendRecovering is the same path after a cut, with the increase timer and byte counter
// running and NextSend playing timer events forward.
func BenchmarkPacedSendRecovering(b *testing.B) {
	c, _ := congestion.NewDCQCN(congestion.DefaultParams(40e9))
	now := t0
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if i%1000 == 0 {
			c.OnCNP(now) // keep it recovering: one cut per ~850 µs at ~20 Gb/s
		}
		i++
		now = c.NextSend(now, 4096)
		c.OnSent(now, 4112)
	}
}

// BenchmarkNextSendBlocked asks when a packet may go while the bucket is empty at MinRate, so NextSend
// plays several timer events forward on its copy.
func BenchmarkNextSendBlocked(b *testing.B) {
	c, _ := congestion.NewDCQCN(congestion.DefaultParams(40e9))
	for i := range 9 {
		c.OnCNP(t0.Add(time.Duration(i) * 50 * time.Microsecond))
	}
	now := t0.Add(400 * time.Microsecond)
	c.OnSent(now, 4112)
	b.ReportAllocs()
	for b.Loop() {
		_ = c.NextSend(now, 4096)
	}
}

func BenchmarkNPOnCE(b *testing.B) {
	np := congestion.NewNP(congestion.DefaultCNPInterval)
	now := t0
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(time.Microsecond)
		np.OnCE(now)
	}
}

func TestPacedSendAllocs(t *testing.T) {
	c := newRP(t, congestion.DefaultParams(40e9))
	c.OnCNP(t0)
	now := t0
	if a := testing.AllocsPerRun(1000, func() {
		now = c.NextSend(now, 4096)
		c.OnSent(now, 4112)
		c.OnTimer(now)
	}); a != 0 {
		t.Errorf("%v allocs per packet, want 0", a)
	}
}
