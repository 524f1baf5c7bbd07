package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/goroce/goroce"
)

// perftestLine is perftest's RESULT_LINE.
var perftestLine = strings.Repeat("-", 87)

// The result tables' header lines (RESULT_FMT and RESULT_FMT_LAT).
const (
	perftestBWHeader  = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n"
	perftestLatHeader = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n"
)

// perftestMB is perftest's MB: bandwidths are in 2^20 bytes per second.
const perftestMB = 1 << 20

// cAltHex formats v as C's "%#0<width>x": zero-padded to width including the "0x", and a zero
// without the prefix.
func cAltHex(v uint64, width int) string {
	if v == 0 {
		return fmt.Sprintf("%0*x", width, 0)
	}
	return fmt.Sprintf("0x%0*x", max(width-2, 0), v)
}

// printInfo prints ctx_print_test_info's block.
func (p *perftestPeer) printInfo(w io.Writer, h perftestHello, client bool) {
	t, o := p.t, p.o
	title := t.title(o.atomicCAS)
	fmt.Fprintln(w, perftestLine)
	fmt.Fprintf(w, "%s%s\n", strings.Repeat(" ", 20), title)
	fmt.Fprintf(w, " Dual-port       : OFF\t\tDevice         : goroce\n")
	fmt.Fprintf(w, " Number of qps   : 1\t\tTransport type : IB\n")
	fmt.Fprintf(w, " Connection type : RC\t\tUsing SRQ      : OFF\n")
	switch {
	case client && t.lat:
		fmt.Fprintf(w, " TX depth        : 1\n")
	case client:
		fmt.Fprintf(w, " TX depth        : %d\n", min(o.txDepth, o.iters))
	case t.verb == perftestSend:
		fmt.Fprintf(w, " RX depth        : %d\n", min(o.rxDepth, o.iters))
	}
	if !t.lat {
		fmt.Fprintf(w, " CQ Moderation   : %d\n", min(o.cqMod, o.txDepth, o.iters))
	}
	fmt.Fprintf(w, " Mtu             : %d[B]\n", h.mtu.Bytes())
	fmt.Fprintf(w, " Link type       : Ethernet\n")
	if o.gidx >= 0 {
		fmt.Fprintf(w, " GID index       : %d\n", o.gidx)
	}
	if t.verb == perftestRead || t.verb == perftestAtomic {
		fmt.Fprintf(w, " Outstand reads  : %d\n", p.local.outReads)
	} else {
		fmt.Fprintf(w, " Max inline data : 0[B]\n")
	}
	fmt.Fprintf(w, " rdma_cm QPs\t : OFF\n")
	fmt.Fprintf(w, " Data ex. method : Ethernet\n")
	fmt.Fprintln(w, perftestLine)
}

// printDest prints ctx_print_pingpong_data: the address line and the GID in decimal bytes.
func (p *perftestPeer) printDest(w io.Writer, side string, d perftestDest) {
	fmt.Fprintf(w, " %s address: LID %s QPN %s PSN %s", side, cAltHex(uint64(d.lid), 4), cAltHex(uint64(d.qpn), 6), cAltHex(uint64(d.psn), 6))
	switch p.t.verb {
	case perftestRead, perftestAtomic:
		fmt.Fprintf(w, " OUT %s", cAltHex(uint64(d.outReads), 4))
		fallthrough
	case perftestWrite:
		fmt.Fprintf(w, " RKey %s VAddr %s", cAltHex(uint64(d.rkey), 8), cAltHex(d.vaddr, 16))
	}
	fmt.Fprintln(w)
	g := make([]string, len(d.gid))
	for i, b := range d.gid {
		g[i] = fmt.Sprintf("%02d", b)
	}
	fmt.Fprintf(w, " GID: %s\n", strings.Join(g, ":"))
}

// printPerftestBW prints a bandwidth result line (REPORT_FMT).
func printPerftestBW(w io.Writer, r perftestBWReport) {
	fmt.Fprintf(w, " %-7d    %-10d       %-7.2f            %-7.2f\t\t   %-7.6f\n", r.size, r.iters, r.bwPeak, r.bwAvg, r.msgRate)
}

// printPerftestLat prints a latency result line (REPORT_FMT_LAT) from one-way samples.
func printPerftestLat(w io.Writer, size, iters int, samples []time.Duration) {
	if len(samples) == 0 {
		return
	}
	us := make([]float64, len(samples))
	for i, s := range samples {
		us[i] = float64(s.Nanoseconds()) / 1e3
	}
	slices.Sort(us)
	n := len(us)
	var sum float64
	for _, v := range us {
		sum += v
	}
	avg := sum / float64(n)
	var sq float64
	for _, v := range us {
		sq += (v - avg) * (v - avg)
	}
	median := us[n/2]
	if n%2 == 0 {
		median = (us[n/2-1] + us[n/2]) / 2
	}
	pct := func(q float64) float64 { return us[max(int(math.Ceil(float64(n)*q))-1, 0)] }
	fmt.Fprintf(w, " %-7d %d          %-7.2f        %-7.2f      %-7.2f  \t       %-7.2f     \t%-7.2f\t\t%-7.2f \t\t%-7.2f\n",
		size, iters, us[0], us[n-1], median, avg, math.Sqrt(sq/float64(n)), pct(0.99), pct(0.999))
}

// bwReport turns a run into perftest's figures: the average over the whole run, from the first post
// to the last completion, and as peak the best rate between two consecutive moderated completions.
func bwReport(size, iters int, elapsed time.Duration, peak float64) perftestBWReport {
	s := elapsed.Seconds()
	return perftestBWReport{size: uint64(size), iters: uint64(iters),
		bwPeak: peak / perftestMB, bwAvg: float64(size) * float64(iters) / s / perftestMB, msgRate: float64(iters) / s / 1e6}
}

// bwClient streams iters requests of size bytes with tx depth outstanding and a completion every cq
// moderation requests, as run_iter_bw: WRITEs into or READs from the peer's buffer, atomics on its
// first 8 bytes, or SENDs.
func (p *perftestPeer) bwClient(ctx context.Context, size int) (perftestBWReport, error) {
	iters := p.o.iters
	txDepth := min(p.o.txDepth, iters)
	cqMod := min(p.o.cqMod, txDepth)
	wr := goroce.SendWR{SGL: []goroce.SGE{p.mr.SGE(0, size)}, RemoteAddr: p.rem.vaddr, RKey: p.rem.rkey}
	switch p.t.verb {
	case perftestWrite:
		wr.Opcode = goroce.WRWrite
	case perftestRead:
		wr.Opcode = goroce.WRRead
	case perftestSend:
		wr.Opcode = goroce.WRSend
	case perftestAtomic:
		wr.Opcode, wr.CompareAdd = goroce.WRFetchAdd, 1
		if p.o.atomicCAS {
			wr.Opcode, wr.CompareAdd, wr.Swap = goroce.WRCompareSwap, 0, 1
		}
	}
	wcs := make([]goroce.Completion, 64)
	posted, completed := 0, 0
	var peak float64
	start := time.Now()
	last := start
	for completed < iters {
		for posted < iters && posted-completed < txDepth {
			wr.WRID, wr.Flags = uint64(posted), 0
			if (posted+1)%cqMod == 0 || posted == iters-1 {
				wr.Flags = goroce.Signaled
			}
			if err := p.qp.PostSend(&wr); err != nil {
				return perftestBWReport{}, fmt.Errorf("couldn't post send: %v (%d posted)", err, posted)
			}
			posted++
		}
		n, err := p.cq.Wait(ctx, wcs)
		if err != nil {
			return perftestBWReport{}, fmt.Errorf("poll CQ failed: %v (%d of %d completed)", err, completed, iters)
		}
		now := time.Now()
		for _, wc := range wcs[:n] {
			if wc.Status != goroce.StatusSuccess {
				return perftestBWReport{}, fmt.Errorf("completion with error at client: %v (%d), wr_id %d", wc.Status, int(wc.Status), wc.WRID)
			}
			if wc.WRID == perftestRecvWRID {
				continue
			}
			done := int(wc.WRID) + 1
			if d := now.Sub(last).Seconds(); d > 0 {
				peak = max(peak, float64(done-completed)*float64(size)/d)
			}
			completed = done
		}
		last = now
	}
	return bwReport(size, iters, last.Sub(start), peak), nil
}

// sendBWServer receives iters SENDs and measures from the first receive to the last; like perftest's
// server it has no peak.
func (p *perftestPeer) sendBWServer(ctx context.Context, size int) (perftestBWReport, error) {
	iters := p.o.iters
	wcs := make([]goroce.Completion, 64)
	var first, last time.Time
	for rcnt := 0; rcnt < iters; {
		n, err := p.cq.Wait(ctx, wcs)
		if err != nil {
			return perftestBWReport{}, fmt.Errorf("poll CQ failed: %v (%d of %d received)", err, rcnt, iters)
		}
		now := time.Now()
		for _, wc := range wcs[:n] {
			if wc.Status != goroce.StatusSuccess {
				return perftestBWReport{}, fmt.Errorf("completion with error at server: %v (%d)", wc.Status, int(wc.Status))
			}
			if wc.WRID != perftestRecvWRID {
				continue
			}
			if rcnt == 0 {
				first = now
			}
			rcnt++
			p.routs--
			last = now
		}
		if err := p.postRecvs(iters - rcnt); err != nil {
			return perftestBWReport{}, err
		}
	}
	r := bwReport(size, iters, max(last.Sub(first), time.Microsecond), 0)
	return r, nil
}

// latency runs one size of a latency test and returns one-way (send) or whole (READ) latencies.
//
// READ: the client issues one READ at a time. SEND: ping-pong, the client sends first and each side
// sends when it has received; like perftest, each side's samples are the times between its
// consecutive sends, halved.
func (p *perftestPeer) latency(ctx context.Context, size int, client bool) ([]time.Duration, error) {
	iters := p.o.iters
	wcs := make([]goroce.Completion, 16)
	wr := goroce.SendWR{Flags: goroce.Signaled, SGL: []goroce.SGE{p.mr.SGE(0, size)}, RemoteAddr: p.rem.vaddr, RKey: p.rem.rkey}
	if p.t.verb == perftestRead {
		wr.Opcode = goroce.WRRead
		samples := make([]time.Duration, 0, iters)
		for i := 0; i < iters; i++ {
			wr.WRID = uint64(i)
			t0 := time.Now()
			if err := p.qp.PostSend(&wr); err != nil {
				return nil, fmt.Errorf("couldn't post send: %v", err)
			}
			n, err := p.cq.Wait(ctx, wcs[:1])
			if err != nil {
				return nil, fmt.Errorf("poll CQ failed: %v (%d of %d completed)", err, i, iters)
			}
			if n != 1 || wcs[0].Status != goroce.StatusSuccess {
				return nil, fmt.Errorf("completion with error: %v (%d)", wcs[0].Status, int(wcs[0].Status))
			}
			samples = append(samples, time.Since(t0))
		}
		return samples, nil
	}
	if p.t.verb == perftestWrite {
		return p.writeLatency(ctx, size, client)
	}
	wr.Opcode = goroce.WRSend
	tstamp := make([]time.Time, 0, iters)
	scnt, rcnt, ccnt := 0, 0, 0
	pending := 0 // receives completed and not yet consumed by the loop
	wait := func() error {
		n, err := p.cq.Wait(ctx, wcs)
		if err != nil {
			return fmt.Errorf("poll CQ failed: %v (%d sent, %d received)", err, scnt, rcnt)
		}
		for _, wc := range wcs[:n] {
			if wc.Status != goroce.StatusSuccess {
				return fmt.Errorf("completion with error: %v (%d), wr_id %d", wc.Status, int(wc.Status), wc.WRID)
			}
			if wc.WRID == perftestRecvWRID {
				pending++
				p.routs--
			} else {
				ccnt++
			}
		}
		return nil
	}
	for scnt < iters || rcnt < iters {
		if rcnt < iters && !(client && scnt < 1) {
			for pending == 0 {
				if err := wait(); err != nil {
					return nil, err
				}
			}
			pending--
			rcnt++
			if err := p.postRecvs(iters - rcnt); err != nil {
				return nil, err
			}
		}
		if scnt < iters {
			// At most a few SENDs unacknowledged: the send queue is not the bottleneck of a ping-pong.
			for scnt-ccnt >= 8 {
				if err := wait(); err != nil {
					return nil, err
				}
			}
			wr.WRID = uint64(scnt)
			tstamp = append(tstamp, time.Now())
			if err := p.qp.PostSend(&wr); err != nil {
				return nil, fmt.Errorf("couldn't post send: %v", err)
			}
			scnt++
		}
	}
	for ccnt < scnt {
		if err := wait(); err != nil {
			return nil, err
		}
	}
	samples := make([]time.Duration, 0, len(tstamp))
	for i := 1; i < len(tstamp); i++ {
		samples = append(samples, tstamp[i].Sub(tstamp[i-1])/2)
	}
	return samples, nil
}

// writeLatency is ib_write_lat's ping-pong: each side WRITEs size bytes into the peer's buffer, the
// last byte numbering the iteration, and waits until the peer's WRITE has put the next number into the
// last byte of its own buffer. There is no completion on the target side: like perftest, this side
// polls memory the device writes from its receive goroutine. In ib_write_lat 6.06 the server writes
// first (seen on the wire between two rxe guests), unlike send_lat, where the client does.
func (p *perftestPeer) writeLatency(ctx context.Context, size int, client bool) ([]time.Duration, error) {
	iters := p.o.iters
	wcs := make([]goroce.Completion, 4)
	wr := goroce.SendWR{Opcode: goroce.WRWrite, Flags: goroce.Signaled, SGL: []goroce.SGE{p.mr.SGE(0, size)}, RemoteAddr: p.rem.vaddr, RKey: p.rem.rkey}
	buf := p.mr.Bytes()
	postBuf := &buf[size-1]
	pollAt := p.maxSize + size - 1
	// The word holding the polled byte, read atomically so that the loop sees the device's write.
	word := (*uint32)(unsafe.Pointer(&buf[pollAt&^3]))
	shift := 8 * uint(pollAt&3) // little-endian hosts
	tstamp := make([]time.Time, 0, iters)
	for scnt, rcnt := 0, 0; scnt < iters || rcnt < iters; {
		if rcnt < iters && !(!client && scnt < 1) {
			rcnt++
			for spins := 0; byte(atomic.LoadUint32(word)>>shift) != byte(rcnt); spins++ {
				if spins%1024 == 1023 {
					if err := ctx.Err(); err != nil {
						return nil, fmt.Errorf("waiting for the peer's WRITE %d: %v", rcnt, err)
					}
				}
				runtime.Gosched()
			}
		}
		if scnt < iters {
			tstamp = append(tstamp, time.Now())
			scnt++
			*postBuf = byte(scnt)
			wr.WRID = uint64(scnt)
			if err := p.qp.PostSend(&wr); err != nil {
				return nil, fmt.Errorf("couldn't post send: %v", err)
			}
			n, err := p.cq.Wait(ctx, wcs[:1])
			if err != nil {
				return nil, fmt.Errorf("poll CQ failed: %v (%d sent)", err, scnt)
			}
			if n != 1 || wcs[0].Status != goroce.StatusSuccess {
				return nil, fmt.Errorf("completion with error: %v (%d)", wcs[0].Status, int(wcs[0].Status))
			}
		}
	}
	samples := make([]time.Duration, 0, len(tstamp))
	for i := 1; i < len(tstamp); i++ {
		samples = append(samples, tstamp[i].Sub(tstamp[i-1])/2)
	}
	return samples, nil
}
