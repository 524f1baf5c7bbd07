package conn

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// The baselines below measure the raw datagram path goroce is built on, with the same Conn,
// batching and packet sizes, so that `goroce perf loopback` can print goroce's figures side by
// side with what the UDP path alone achieves.
//
// Every baseline datagram starts with a header, little-endian:
//
//	0               8               16
//	+---------------+---------------+---------------------
//	|    run ID     | seq | fin bit |  padding to size ...
//	+---------------+---------------+---------------------
//
// The run ID, random per call, lets a run ignore stragglers of an earlier one on the same Conns.

// MinBaselineSize is the smallest datagram the baselines send: the header above.
const MinBaselineSize = 16

// maxUDPPayload is the largest UDP payload over IPv4: 65535 - 20 (IPv4) - 8 (UDP).
const maxUDPPayload = 65507

const (
	finBit = 1 << 63
	// lossTimeout is how long the throughput sender waits for progress before it presumes the
	// datagrams in flight lost and reopens its window.
	lossTimeout = 50 * time.Millisecond
	// pingTimeout is how long a ping may go unanswered before it is sent again (and its RTT
	// sample discarded as a loss).
	pingTimeout = 100 * time.Millisecond
	// finInterval spaces the retransmissions of the end-of-run datagram.
	finInterval = 5 * time.Millisecond
)

// Result is the outcome of a baseline run.
type Result struct {
	Size     int           // datagram payload size, bytes
	Sent     uint64        // datagrams (or pings) sent, retransmissions excluded
	Received uint64        // datagrams (or pongs) received
	Bytes    uint64        // payload bytes received
	Elapsed  time.Duration // from the first send to the last datagram received
	Gbps     float64       // payload goodput, 10^9 bits per second
	PPS      float64       // datagrams received per second
	Loss     float64       // fraction of datagrams (or pings) sent but never received

	// Round-trip latency of answered pings (RawPingPong only).
	RTTMin, RTTMean, RTTP50, RTTP99, RTTMax time.Duration
}

// String formats r for a report line.
func (r Result) String() string {
	s := fmt.Sprintf("size=%d sent=%d recv=%d loss=%.2f%% %.3f Gb/s %.0f pps", r.Size, r.Sent, r.Received, 100*r.Loss, r.Gbps, r.PPS)
	if r.RTTP50 > 0 {
		s += fmt.Sprintf(" rtt min/p50/p99/max %v/%v/%v/%v", r.RTTMin, r.RTTP50, r.RTTP99, r.RTTMax)
	}
	return s
}

// RawThroughput streams size-byte datagrams from a to b for d, in batches of a.BatchSize(), with
// at most window datagrams in flight: b's reader counts what arrives in a shared atomic and a's
// sender waits on it. In-flight datagrams that make no progress for 50 ms are presumed lost and
// the window reopens, so loss slows the run but does not stall it. The caller must not read b
// meanwhile. If ctx ends first, RawThroughput returns ctx's error with the partial result, and
// its reader returns once b receives a datagram or is closed.
func RawThroughput(ctx context.Context, a, b Conn, size, window int, d time.Duration) (Result, error) {
	return rawThroughput(ctx, a, b, size, window, d, 0)
}

// rawThroughput is RawThroughput, ending after count datagrams instead if count is non-zero.
func rawThroughput(ctx context.Context, a, b Conn, size, window int, d time.Duration, count uint64) (Result, error) {
	res := Result{Size: size}
	if size < MinBaselineSize || size > maxUDPPayload {
		return res, fmt.Errorf("conn: baseline size %d outside [%d, %d]", size, MinBaselineSize, maxUDPPayload)
	}
	if window < 1 {
		return res, fmt.Errorf("conn: baseline window %d < 1", window)
	}
	run := rand.Uint64()
	dst := dialable(b.LocalAddr())

	var (
		recvd, rbytes atomic.Uint64
		last          atomic.Int64 // nanoseconds from start to the last data datagram received
		progress      = make(chan struct{}, 1)
		done          = make(chan error, 1)
	)
	start := time.Now()
	go func() {
		msgs := newMessages(b.BatchSize(), size)
		for {
			n, err := b.ReadBatch(msgs)
			if err != nil {
				done <- err
				return
			}
			var cnt, by uint64
			fin := false
			for _, m := range msgs[:n] {
				r, seq, ok := parseBaseline(m)
				switch {
				case !ok || r != run:
				case seq&finBit != 0:
					fin = true
				default:
					cnt++
					by += uint64(m.N)
				}
			}
			if cnt > 0 {
				rbytes.Add(by)
				recvd.Add(cnt)
				last.Store(int64(time.Since(start)))
				select {
				case progress <- struct{}{}:
				default:
				}
			}
			if fin {
				done <- nil
				return
			}
		}
	}()

	payload := make([]byte, size)
	binary.LittleEndian.PutUint64(payload, run)
	msgs := make([]Message, a.BatchSize())
	for i := range msgs {
		msgs[i] = Message{Buf: payload, Addr: dst}
	}
	timer := time.NewTimer(lossTimeout)
	defer timer.Stop()
	var sent, forgiven uint64 // forgiven: presumed lost, no longer counted in flight
	var err error
	deadline := start.Add(d)
send:
	for ctx.Err() == nil {
		k := uint64(len(msgs))
		if count > 0 {
			k = min(k, count-sent)
		} else if !time.Now().Before(deadline) {
			break
		}
		if k == 0 {
			break
		}
		k = min(k, uint64(window))
		for int64(sent-forgiven)-int64(recvd.Load())+int64(k) > int64(window) {
			timer.Reset(lossTimeout)
			select {
			case <-progress:
			case <-timer.C:
				forgiven = sent - min(recvd.Load(), sent)
			case <-ctx.Done():
				break send
			}
		}
		var n int
		n, err = a.WriteBatch(msgs[:k])
		sent += uint64(n)
		if err != nil {
			break
		}
	}
	// Drain: wait for the stragglers until they stop coming.
	for err == nil && ctx.Err() == nil && recvd.Load() < sent {
		timer.Reset(lossTimeout)
		select {
		case <-progress:
			continue
		case <-timer.C:
		case <-ctx.Done():
		}
		break
	}
	if err == nil {
		err = finish(ctx, a, dst, run, done)
	}
	res.Sent, res.Received, res.Bytes = sent, recvd.Load(), rbytes.Load()
	res.Elapsed = time.Duration(last.Load())
	if res.Elapsed <= 0 {
		res.Elapsed = time.Since(start)
	}
	if secs := res.Elapsed.Seconds(); secs > 0 {
		res.Gbps = float64(res.Bytes) * 8 / secs / 1e9
		res.PPS = float64(res.Received) / secs
	}
	if sent > 0 && res.Received < sent {
		res.Loss = float64(sent-res.Received) / float64(sent)
	}
	return res, err
}

// finish sends the end-of-run datagram from a until the peer goroutine reports on done.
func finish(ctx context.Context, a Conn, dst netip.AddrPort, run uint64, done <-chan error) error {
	buf := make([]byte, MinBaselineSize)
	binary.LittleEndian.PutUint64(buf, run)
	binary.LittleEndian.PutUint64(buf[8:], finBit)
	fin := []Message{{Buf: buf, Addr: dst}}
	t := time.NewTicker(finInterval)
	defer t.Stop()
	for {
		if _, err := a.WriteBatch(fin); err != nil {
			return err
		}
		select {
		case err := <-done:
			if errors.Is(err, ErrClosed) {
				return fmt.Errorf("conn: baseline receiver: %w", err)
			}
			return err
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// RawPingPong measures iters round trips of size-byte datagrams: a sends a ping and waits for
// it to come back from an echo goroutine reading b, one ping at a time. A ping unanswered for
// 100 ms is sent again and counted as lost, its RTT sample discarded. The caller must not read
// a or b meanwhile.
func RawPingPong(ctx context.Context, a, b Conn, size, iters int) (Result, error) {
	res := Result{Size: size}
	if size < MinBaselineSize || size > maxUDPPayload {
		return res, fmt.Errorf("conn: baseline size %d outside [%d, %d]", size, MinBaselineSize, maxUDPPayload)
	}
	run := rand.Uint64()
	dst := dialable(b.LocalAddr())

	done := make(chan error, 1)
	go func() { // echo: b returns every ping of this run to its sender
		msgs := newMessages(b.BatchSize(), size)
		out := make([]Message, 0, len(msgs))
		for {
			n, err := b.ReadBatch(msgs)
			if err != nil {
				done <- err
				return
			}
			out = out[:0]
			fin := false
			for _, m := range msgs[:n] {
				r, seq, ok := parseBaseline(m)
				switch {
				case !ok || r != run:
				case seq&finBit != 0:
					fin = true
				default:
					out = append(out, Message{Buf: m.Buf[:m.N], Addr: m.Addr, TOS: m.TOS})
				}
			}
			if len(out) > 0 {
				if _, err := b.WriteBatch(out); err != nil {
					done <- err
					return
				}
			}
			if fin {
				done <- nil
				return
			}
		}
	}()

	var outstanding, resent atomic.Uint64 // seq of the ping in flight (0: none), last one resent
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { // watchdog: resends a ping that made no progress for a whole tick
		t := time.NewTicker(pingTimeout)
		defer t.Stop()
		buf := make([]byte, size)
		binary.LittleEndian.PutUint64(buf, run)
		msg := []Message{{Buf: buf, Addr: dst}}
		var prev uint64
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			s := outstanding.Load()
			if s != 0 && s == prev {
				resent.Store(s)
				binary.LittleEndian.PutUint64(buf[8:], s)
				if _, err := a.WriteBatch(msg); err != nil {
					return
				}
			}
			prev = s
		}
	})

	ping := make([]byte, size)
	binary.LittleEndian.PutUint64(ping, run)
	pmsg := []Message{{Buf: ping, Addr: dst}}
	rmsgs := newMessages(a.BatchSize(), size)
	samples := make([]time.Duration, 0, iters)
	var err error
	start := time.Now()
loop:
	for seq := uint64(1); seq <= uint64(iters) && ctx.Err() == nil; seq++ {
		binary.LittleEndian.PutUint64(ping[8:], seq)
		outstanding.Store(seq)
		t0 := time.Now()
		if _, err = a.WriteBatch(pmsg); err != nil {
			break
		}
		res.Sent++
		for got := false; !got; {
			var n int
			if n, err = a.ReadBatch(rmsgs); err != nil {
				break loop
			}
			for _, m := range rmsgs[:n] {
				if r, s, ok := parseBaseline(m); ok && r == run && s == seq {
					got = true
				}
			}
			if !got && ctx.Err() != nil {
				break loop
			}
		}
		rtt := time.Since(t0)
		res.Received++
		res.Bytes += uint64(size)
		if resent.Load() != seq {
			samples = append(samples, rtt)
		}
	}
	res.Elapsed = time.Since(start)
	outstanding.Store(0)
	close(stop)
	wg.Wait()
	if err == nil {
		err = finish(ctx, a, dst, run, done)
	} else if ctx.Err() != nil {
		err = ctx.Err()
	}
	if err == nil && res.Received < uint64(iters) {
		// The loop stopped early because ctx ended; the echo goroutine may still have taken the fin
		// before finish saw ctx end.
		err = ctx.Err()
	}

	if secs := res.Elapsed.Seconds(); secs > 0 {
		res.Gbps = float64(res.Bytes) * 8 / secs / 1e9
		res.PPS = float64(res.Received) / secs
	}
	if res.Sent > 0 {
		res.Loss = float64(res.Sent-uint64(len(samples))) / float64(res.Sent)
	}
	if len(samples) > 0 {
		slices.Sort(samples)
		var sum time.Duration
		for _, s := range samples {
			sum += s
		}
		res.RTTMin, res.RTTMax = samples[0], samples[len(samples)-1]
		res.RTTMean = sum / time.Duration(len(samples))
		res.RTTP50, res.RTTP99 = percentile(samples, 0.50), percentile(samples, 0.99)
	}
	return res, err
}

// percentile returns the nearest-rank p-quantile of sorted.
func percentile(sorted []time.Duration, p float64) time.Duration {
	i := int(float64(len(sorted))*p+0.999999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// parseBaseline reads the baseline header of a received datagram.
func parseBaseline(m Message) (run, seq uint64, ok bool) {
	if m.N < MinBaselineSize {
		return 0, 0, false
	}
	b := m.Buf[:m.N]
	return binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint64(b[8:]), true
}

// newMessages returns n messages with size-byte buffers.
func newMessages(n, size int) []Message {
	msgs := make([]Message, n)
	for i := range msgs {
		msgs[i].Buf = make([]byte, size)
	}
	return msgs
}

// dialable turns a wildcard bound address into the loopback address of its family.
func dialable(ap netip.AddrPort) netip.AddrPort {
	switch a := ap.Addr(); {
	case a == netip.IPv4Unspecified():
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), ap.Port())
	case a == netip.IPv6Unspecified():
		return netip.AddrPortFrom(netip.IPv6Loopback(), ap.Port())
	}
	return ap
}
