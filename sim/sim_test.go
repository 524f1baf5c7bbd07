package sim

import (
	"os"
	"testing"
	"time"
)

func TestBackToBackWrite(t *testing.T) {
	s := New(1)
	topo := BackToBack(s, LinkConfig{Rate: 100e9, Delay: time.Microsecond}, HostConfig{})
	f, err := s.AddFlow(FlowSpec{Src: topo.Hosts[0], Dst: topo.Hosts[1], Op: OpWrite, Size: 10 << 20})
	if err != nil {
		t.Fatal(err)
	}
	s.Run(Second)
	if testing.Verbose() {
		WriteSummary(os.Stdout, s.Summary())
		WritePorts(os.Stdout, s.Ports())
	}
	if !f.Done() || f.Stats.Err != 0 {
		t.Fatalf("flow not done: %+v", f.Stats)
	}
	// 10 MiB at 100 Gb/s is 839 us of payload; headers and ACK turnarounds cost a few percent.
	if g := f.Goodput(s.Now()); g < 90e9 || g > 100e9 {
		t.Errorf("goodput %.2f Gb/s, want 90..100", g/1e9)
	}
}
