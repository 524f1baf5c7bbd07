package capture

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/goroce/goroce/sim"
	"github.com/goroce/goroce/wire"
)

// simRun is one captured simulator run and the events the tracer after the capture's counted.
type simRun struct {
	path    string
	recs    []Record
	kinds   map[sim.TraceKind]int
	drops   map[sim.DropReason]int
	dups    map[uint64]bool // IDs of packets a link copied
	firstAt sim.Time
}

// captureSimRun runs four DCQCN senders into one receiver through a switch that marks CE and has a
// small buffer, over links that lose, corrupt and duplicate packets, and captures it.
func captureSimRun(t *testing.T, seed uint64) *simRun {
	t.Helper()
	r := &simRun{path: filepath.Join(t.TempDir(), "sim.pcapng"), kinds: map[sim.TraceKind]int{},
		drops: map[sim.DropReason]int{}, dups: map[uint64]bool{}, firstAt: -1}
	cw, err := Create(r.path, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := sim.New(seed)
	s.SetTracer(cw.SimTracer(time.Time{}, func(e *sim.TraceEvent) {
		r.kinds[e.Kind]++
		if e.Kind == sim.TraceDrop {
			r.drops[e.Reason]++
		}
		if e.Dup {
			r.dups[e.ID] = true
		}
		if r.firstAt < 0 {
			r.firstAt = e.At
		}
	}))
	link := sim.LinkConfig{Rate: 10e9, Delay: time.Microsecond,
		Faults: sim.Faults{Loss: 0.01, Duplicate: 0.01, Corrupt: 0.01}}
	sw := sim.SwitchConfig{Buffer: 48 << 10, ECN: sim.ECNConfig{Enabled: true, Kmin: 8 << 10, Kmax: 32 << 10, Pmax: 0.2}}
	top := sim.Incast(s, 4, link, sw, sim.WithDCQCN(sim.HostConfig{}, sim.DCQCNConfig{}))
	for i := range 4 {
		_, err := s.AddFlow(sim.FlowSpec{Src: top.Hosts[i], Dst: top.Hosts[4], Op: sim.OpWrite, Size: 128 << 10, MsgSize: 32 << 10,
			QP: sim.QPOptions{MTU: wire.MTU1024, Timeout: 8, ECN: true}})
		if err != nil {
			t.Fatal(err)
		}
	}
	s.Run(sim.FromDuration(20 * time.Millisecond))
	if err := cw.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(r.path)
	if err != nil {
		t.Fatal(err)
	}
	r.recs = readAll(t, data)
	return r
}

// A simulated run's capture has one record per packet a host sent and one per copy a link made, in
// virtual time; every loss, drop, CE mark and bit flip is a comment on its packet; every ICRC verifies
// but those of corrupted copies.
func TestSimTracer(t *testing.T) {
	const seed = 3
	r := captureSimRun(t, seed)
	t.Logf("seed %d: events %v, drops %v, %d packets copied; %d records", seed, r.kinds, r.drops, len(r.dups), len(r.recs))
	if r.kinds[sim.TraceMark] == 0 || r.kinds[sim.TraceCorrupt] == 0 || len(r.dups) == 0 || r.drops[sim.DropLoss] == 0 ||
		r.drops[sim.DropICRC] == 0 {
		t.Fatalf("seed %d: the run exercised too little", seed)
	}
	if want := r.kinds[sim.TraceSend] + len(r.dups); len(r.recs) != want {
		t.Errorf("%d records, want %d: %d sent and %d copies", len(r.recs), want, r.kinds[sim.TraceSend], len(r.dups))
	}
	for _, c := range []struct {
		prefix string
		want   int
	}{
		{"lost: link loss", r.drops[sim.DropLoss]},
		{"dropped: bad ICRC", r.drops[sim.DropICRC]},
		{"dropped: queue-full", r.drops[sim.DropQueueFull]},
		{"marked: ECN CE", r.kinds[sim.TraceMark]},
		{"corrupted: a bit flipped", r.kinds[sim.TraceCorrupt]},
		{"duplicate: copied by the network", len(r.dups)},
	} {
		if n := countComments(r.recs, c.prefix); n != c.want {
			t.Errorf("%d comments %q, want %d", n, c.prefix, c.want)
		}
	}
	cnps, bad := 0, 0
	for i, rec := range r.recs {
		f, err := checkFrameChecksums(t, rec.Data, false)
		if err != nil {
			// Only a link's copy of a packet after a bit flipped in it is written with a bad ICRC.
			if !slices.Contains(rec.Comments, "duplicate: copied by the network") {
				t.Errorf("record %d: %v; comments %q", i+1, err, rec.Comments)
			}
			bad++
			continue
		}
		if f.Opcode() == wire.CNP {
			cnps++
		}
	}
	if cnps == 0 {
		t.Error("no CNP in the capture")
	}
	if bad > len(r.dups) {
		t.Errorf("%d records with a bad ICRC, more than the %d copies", bad, len(r.dups))
	}
	if want := time.Unix(0, 0).Add(r.firstAt.Duration()); !r.recs[0].At.Equal(want) {
		t.Errorf("first record at %v, want %v (virtual time from the Unix epoch)", r.recs[0].At, want)
	}
}
