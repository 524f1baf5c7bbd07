package perf

import (
	"fmt"
	"math"
	"time"

	"github.com/goroce/goroce"
)

// Result is one run of one measurement.
type Result struct {
	// Gbps is the payload throughput over the timed interval, 10^9 bits per second: goroce
	// messages completed at the sender, TCP bytes written, raw UDP datagrams the receiver
	// acknowledged (each counting the RoCE payload its packet would carry).
	Gbps     float64
	Bytes    uint64        // payload bytes counted in the interval
	Messages uint64        // messages (writes, datagrams) counted in the interval
	Elapsed  time.Duration // the interval

	// Round trips of a ping-pong: nearest-rank percentiles of Pings samples.
	RTTP50, RTTP99 time.Duration
	Pings          int
	// PacketsPerRTT is the goroce packets the pinging device sent and received per round trip, over
	// the whole run (warm-up included); NaN when not measured. A SEND and its ACK each way make 4.
	PacketsPerRTT float64

	// Allocs is this process's heap allocations per packet its goroce device sent or received in
	// the timed interval; PeerAllocs is the child's, from the mark to the stop. NaN when not
	// measured.
	Allocs, PeerAllocs float64

	// CPU is the CPU time, user and system, that the processes of the run used over its measured
	// part: this process's in the timed interval (or over the timed pings), plus the child's from
	// the interval's start to the stop. 0 when not measured (off Linux). It is the steadier
	// figure on a loaded machine: another tenant's load takes throughput away, not CPU time per
	// byte.
	CPU time.Duration
	// SelfCPU and PeerCPU are CPU's two parts: this process's, and the child's (0 in one process).
	SelfCPU, PeerCPU time.Duration

	// Retransmissions counts the go-back-N retransmissions goroce started, both sides.
	Retransmissions uint64

	// Notes are remarks on the run: loss, NAKs, timeouts, drops, offloads not used.
	Notes []string
}

// newResult returns a Result with nothing measured yet.
func newResult() Result {
	return Result{Allocs: math.NaN(), PeerAllocs: math.NaN(), PacketsPerRTT: math.NaN()}
}

// notef adds a note.
func (r *Result) notef(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

// noteStats adds notes for the events of one side's goroce counters that a clean run has none of.
func (r *Result) noteStats(side string, s goroce.Stats) {
	q := s.QP
	r.Retransmissions += q.CompleterRetryErr
	var naks uint64
	for _, n := range q.NAKsSent {
		naks += n
	}
	for _, e := range []struct {
		what string
		n    uint64
	}{
		{"ACK timeouts", q.Timeouts},
		{"tail-loss probes sent (the peer counts each whose packet it had as a duplicate request)", q.TailProbes},
		{"RNR NAKs received", q.RcvdRNRErr},
		{"PSN sequence NAKs received", q.RcvdSeqErr},
		{"NAKs sent", naks},
		{"duplicate requests", q.DuplicateRequest},
		{"out-of-sequence requests", q.OutOfSeqRequest},
		{"packets its QPs dropped in a state that takes none", q.DropState},
		{"responses dropped for PSNs never sent", q.DropGhostResponse},
		{"responses dropped for PSNs already acknowledged", q.DropStaleResponse},
		{"responses dropped of the wrong kind", q.DropBadResponse},
		{"requests dropped for a full response queue", q.DropResponseQueueFull},
		{"duplicates dropped with nothing to answer", q.DropDuplicate},
		{"packets its QPs dropped for other reasons", q.Dropped - min(q.Dropped, q.DropState+q.DropGhostResponse+q.DropStaleResponse+q.DropBadResponse+q.DropResponseQueueFull+q.DropDuplicate)},
		{"completions lost to a full CQ", q.CQOverflow},
		{"malformed packets dropped", s.DropMalformed},
		{"ICRC drops", s.DropICRC},
		{"unknown-QPN drops", s.DropUnknownQPN},
		{"wrong-peer drops", s.DropWrongPeer},
		{"truncated datagrams", s.DropTruncated},
		{"GSO writes refused", s.GSOFallback},
	} {
		if e.n > 0 {
			r.notef("%s: %d %s", side, e.n, e.what)
		}
	}
}

// window is the timed interval of a throughput run.
type window struct{ start, end time.Time }

// newWindow starts a run's interval after its warm-up from now.
func newWindow(s Spec) window {
	start := time.Now().Add(s.Warmup)
	return window{start: start, end: start.Add(s.Duration)}
}

// in reports whether t falls in the interval.
func (w window) in(t time.Time) bool { return !t.Before(w.start) && t.Before(w.end) }

// gbps is bytes over d in 10^9 bits per second.
func gbps(bytes uint64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(bytes) * 8 / d.Seconds() / 1e9
}

// cpuSpan measures this process's CPU time over part of a run. A span that was never begun, or
// where the clock could not be read, measures nothing.
type cpuSpan struct {
	t0, t1 time.Duration
	begun  bool
}

func (c *cpuSpan) begin() { c.t0, c.t1, c.begun = processCPU(), -1, true }

// beginAfter calls mark, if set (the child's mark: its CPU time counts from there), then begins.
func (c *cpuSpan) beginAfter(mark func() error) error {
	if mark != nil {
		if err := mark(); err != nil {
			return err
		}
	}
	c.begin()
	return nil
}

func (c *cpuSpan) end() {
	if c.begun && c.t1 < 0 {
		c.t1 = processCPU()
	}
}

// used returns the CPU time between begin and end, 0 if that is unknown.
func (c *cpuSpan) used() time.Duration {
	if !c.begun || c.t0 < 0 || c.t1 < c.t0 {
		return 0
	}
	return c.t1 - c.t0
}

// setCPU sets r.CPU to this process's CPU time over the measured part, plus the child's from its
// mark to its stop when peer reports it (nil: a run in one process). Where either is unknown the
// run has no CPU figure.
func (r *Result) setCPU(self *cpuSpan, peer *PeerReport) {
	r.CPU, r.SelfCPU, r.PeerCPU = 0, 0, 0
	used := self.used()
	if used <= 0 || (peer != nil && peer.CPU <= 0) {
		return
	}
	r.CPU, r.SelfCPU = used, used
	if peer != nil {
		r.PeerCPU = peer.CPU
		r.CPU += peer.CPU
	}
}
