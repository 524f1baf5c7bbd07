package perftest

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/goroce/goroce"
)

// mb is perftest's MB: bandwidths are in 2^20 bytes per second.
const mb = 1 << 20

// bwReport turns a run into perftest's figures: the average over the whole run, from the first post
// to the last completion, and as peak the best rate between two consecutive moderated completions.
func bwReport(size, iters int, elapsed time.Duration, peak float64) BWReport {
	s := elapsed.Seconds()
	return BWReport{Size: uint64(size), Iters: uint64(iters),
		BWPeak: peak / mb, BWAvg: float64(size) * float64(iters) / s / mb, MsgRate: float64(iters) / s / 1e6}
}

// bwClient streams iters requests of size bytes with tx depth outstanding and a completion every cq
// moderation requests, as run_iter_bw: WRITEs into or READs from the peer's buffer, atomics on its
// first 8 bytes, or SENDs.
func (p *peer) bwClient(ctx context.Context, size int) (BWReport, error) {
	iters := p.o.Iters
	txDepth := min(p.o.TxDepth, iters)
	cqMod := min(p.o.CQMod, txDepth)
	wr := goroce.SendWR{SGL: []goroce.SGE{p.mr.SGE(0, size)}, RemoteAddr: p.rem.VAddr, RKey: p.rem.RKey}
	switch p.sh.verb {
	case Write:
		wr.Opcode = goroce.WRRDMAWrite
	case Read:
		wr.Opcode = goroce.WRRDMARead
	case Send:
		wr.Opcode = goroce.WRSend
	case Atomic:
		wr.Opcode, wr.CompareAdd = goroce.WRFetchAdd, 1
		if p.o.AtomicCAS {
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
				return BWReport{}, fmt.Errorf("couldn't post send: %w (%d posted)", err, posted)
			}
			posted++
		}
		n, err := p.cq.Wait(ctx, wcs)
		if err != nil {
			return BWReport{}, fmt.Errorf("poll CQ failed: %w (%d of %d completed)", err, completed, iters)
		}
		now := time.Now()
		for _, wc := range wcs[:n] {
			if wc.Status != goroce.StatusSuccess {
				return BWReport{}, &CompletionError{Side: "client", Completion: wc}
			}
			if wc.WRID == recvWRID {
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
func (p *peer) sendBWServer(ctx context.Context, size int) (BWReport, error) {
	iters := p.o.Iters
	wcs := make([]goroce.Completion, 64)
	var first, last time.Time
	for rcnt := 0; rcnt < iters; {
		n, err := p.cq.Wait(ctx, wcs)
		if err != nil {
			return BWReport{}, fmt.Errorf("poll CQ failed: %w (%d of %d received)", err, rcnt, iters)
		}
		now := time.Now()
		for _, wc := range wcs[:n] {
			if wc.Status != goroce.StatusSuccess {
				return BWReport{}, &CompletionError{Side: "server", Completion: wc}
			}
			if wc.WRID != recvWRID {
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
			return BWReport{}, err
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
func (p *peer) latency(ctx context.Context, size int, client bool) ([]time.Duration, error) {
	iters := p.o.Iters
	wcs := make([]goroce.Completion, 16)
	wr := goroce.SendWR{Flags: goroce.Signaled, SGL: []goroce.SGE{p.mr.SGE(0, size)}, RemoteAddr: p.rem.VAddr, RKey: p.rem.RKey}
	if p.sh.verb == Read {
		wr.Opcode = goroce.WRRDMARead
		samples := make([]time.Duration, 0, iters)
		for i := 0; i < iters; i++ {
			wr.WRID = uint64(i)
			t0 := time.Now()
			if err := p.qp.PostSend(&wr); err != nil {
				return nil, fmt.Errorf("couldn't post send: %w", err)
			}
			n, err := p.cq.Wait(ctx, wcs[:1])
			if err != nil {
				return nil, fmt.Errorf("poll CQ failed: %w (%d of %d completed)", err, i, iters)
			}
			if n != 1 || wcs[0].Status != goroce.StatusSuccess {
				return nil, &CompletionError{Completion: wcs[0]}
			}
			samples = append(samples, time.Since(t0))
		}
		return samples, nil
	}
	if p.sh.verb == Write {
		return p.writeLatency(ctx, size, client)
	}
	wr.Opcode = goroce.WRSend
	tstamp := make([]time.Time, 0, iters)
	scnt, rcnt, ccnt := 0, 0, 0
	pending := 0 // receives completed and not yet consumed by the loop
	wait := func() error {
		n, err := p.cq.Wait(ctx, wcs)
		if err != nil {
			return fmt.Errorf("poll CQ failed: %w (%d sent, %d received)", err, scnt, rcnt)
		}
		for _, wc := range wcs[:n] {
			if wc.Status != goroce.StatusSuccess {
				return &CompletionError{Completion: wc}
			}
			if wc.WRID == recvWRID {
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
				return nil, fmt.Errorf("couldn't post send: %w", err)
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
func (p *peer) writeLatency(ctx context.Context, size int, client bool) ([]time.Duration, error) {
	iters := p.o.Iters
	wcs := make([]goroce.Completion, 4)
	wr := goroce.SendWR{Opcode: goroce.WRRDMAWrite, Flags: goroce.Signaled, SGL: []goroce.SGE{p.mr.SGE(0, size)}, RemoteAddr: p.rem.VAddr, RKey: p.rem.RKey}
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
						return nil, fmt.Errorf("waiting for the peer's WRITE %d: %w", rcnt, err)
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
				return nil, fmt.Errorf("couldn't post send: %w", err)
			}
			n, err := p.cq.Wait(ctx, wcs[:1])
			if err != nil {
				return nil, fmt.Errorf("poll CQ failed: %w (%d sent)", err, scnt)
			}
			if n != 1 || wcs[0].Status != goroce.StatusSuccess {
				return nil, &CompletionError{Completion: wcs[0]}
			}
		}
	}
	samples := make([]time.Duration, 0, len(tstamp))
	for i := 1; i < len(tstamp); i++ {
		samples = append(samples, tstamp[i].Sub(tstamp[i-1])/2)
	}
	return samples, nil
}
