package perf

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goroce/goroce/internal/conn"
)

// Raw UDP datagrams of this package start with a header, little-endian:
//
//	0               8               16
//	+---------------+---------------+---------------------
//	|      tag      |  seq or count |  padding to size ...
//	+---------------+---------------+---------------------
//
// The tag, random per measurement (Spec.Tag), lets a run ignore stragglers of an earlier one. A data
// datagram of a stream carries only the tag; an ack carries the count of datagrams received so far;
// a ping carries its sequence number.
const rawHeader = 16

const (
	// lossTimeout is how long the UDP sender waits for an ack before it presumes the datagrams in
	// flight lost and reopens its window, as conn.RawThroughput does.
	lossTimeout = 50 * time.Millisecond
	// pingResend is how long a raw ping may go unanswered before it is sent again, its sample
	// discarded, as conn.RawPingPong does.
	pingResend = 100 * time.Millisecond
	// drainTime is how long the receiving child keeps reading after a stop: the sender has stopped
	// before asking, so what remains is already queued on the socket.
	drainTime = 20 * time.Millisecond
	// maxAckEvery bounds the datagrams a UDP receiver takes before it acknowledges them.
	maxAckEvery = 32
)

// ackEvery is how many datagrams the receiver of s acknowledges at once: half of what the window
// leaves beyond one write, so that a sender blocked on the window always gets an ack, at most
// maxAckEvery.
func ackEvery(s Spec) uint64 {
	return uint64(max(1, min(maxAckEvery, (s.Window-s.Burst+1)/2)))
}

func putHeader(b []byte, tag, v uint64) {
	binary.LittleEndian.PutUint64(b, tag)
	binary.LittleEndian.PutUint64(b[8:], v)
}

func header(b []byte) (tag, v uint64, ok bool) {
	if len(b) < rawHeader {
		return 0, 0, false
	}
	return binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint64(b[8:]), true
}

// udpStream measures raw UDP datagrams of s.Size bytes to the child, one per packet or s.Burst per
// GSO write, with at most s.Window in flight: the child acknowledges what it received and the
// throughput is the acknowledged datagrams of the interval, each counting s.Payload bytes.
func udpStream(ctx context.Context, ch *Child, s Spec, local, remote netip.Addr) (Result, error) {
	res := newResult()
	c, err := conn.Listen(netip.AddrPortFrom(local, 0), conn.Options{GSO: s.GSO})
	if err != nil {
		return res, fmt.Errorf("%s: %w", s.Title, err)
	}
	defer c.Close()
	per := 1
	if s.GSO {
		if got := c.Offload().GSO; got < s.Burst {
			return res, fmt.Errorf("%s: UDP GSO of %d segments unavailable (the socket offers %d)", s.Title, s.Burst, got)
		}
		per = s.Burst
	}
	ep, err := ch.start(ctx, s, remote.String(), Endpoint{})
	if err != nil {
		return res, err
	}
	defer ch.cleanup()
	dst, err := netip.ParseAddrPort(ep.Addr)
	if err != nil {
		return res, fmt.Errorf("%w: start: address %q: %w", ErrChild, ep.Addr, err)
	}

	// The child's acks: the highest count seen, and a signal for the sender.
	var acked atomic.Uint64
	progress := make(chan struct{}, 1)
	readDone := make(chan error, 1)
	go func() {
		msgs := make([]conn.Message, c.BatchSize())
		for i := range msgs {
			msgs[i].Buf = make([]byte, rawHeader)
		}
		for {
			n, err := c.ReadBatch(msgs)
			if err != nil {
				readDone <- err
				return
			}
			for _, m := range msgs[:n] {
				if tag, v, ok := header(m.Buf[:m.N]); ok && tag == s.Tag && v > acked.Load() {
					acked.Store(v)
				}
			}
			select {
			case progress <- struct{}{}:
			default:
			}
		}
	}()

	buf := make([]byte, per*s.Size)
	for k := range per {
		putHeader(buf[k*s.Size:], s.Tag, 0)
	}
	msgs := make([]conn.Message, c.BatchSize())
	for i := range msgs {
		msgs[i] = conn.Message{Buf: buf, Addr: dst}
		if s.GSO {
			msgs[i].SegSize = s.Size
		}
	}
	timer := time.NewTimer(lossTimeout)
	defer timer.Stop()
	w := newWindow(s)
	var sent, forgiven, a0, a1 uint64 // forgiven: presumed lost, no longer counted in flight
	var t0, t1 time.Time
	var cpu cpuSpan
	for started := false; ; {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		now := time.Now()
		if !started && !now.Before(w.start) {
			if err := cpu.beginAfter(func() error { return ch.mark(ctx) }); err != nil {
				return res, err
			}
			started, t0, a0 = true, time.Now(), acked.Load()
		}
		if !now.Before(w.end) {
			cpu.end()
			t1, a1 = now, acked.Load()
			break
		}
		inflight := int64(sent-forgiven) - int64(acked.Load())
		k := min(int64(len(msgs)), (int64(s.Window)-inflight)/int64(per))
		if k <= 0 {
			timer.Reset(lossTimeout)
			select {
			case <-progress:
			case <-timer.C:
				forgiven = sent - min(acked.Load(), sent)
			case err := <-readDone:
				return res, fmt.Errorf("%s: reading acks: %w", s.Title, err)
			case <-ctx.Done():
				return res, ctx.Err()
			}
			continue
		}
		n, err := c.WriteBatch(msgs[:k])
		sent += uint64(n * per)
		if err != nil {
			return res, fmt.Errorf("%s: write: %w", s.Title, err)
		}
	}
	rep, err := ch.stop(ctx)
	if err != nil {
		return res, err
	}
	res.Messages, res.Elapsed = a1-a0, t1.Sub(t0)
	res.Bytes = res.Messages * uint64(s.Payload)
	res.Gbps = gbps(res.Bytes, res.Elapsed)
	res.setCPU(&cpu, &rep)
	if rep.Messages < sent {
		res.notef("%d of %d datagrams lost (%.3f%%)", sent-rep.Messages, sent, 100*float64(sent-rep.Messages)/float64(sent))
	}
	if s.GSO {
		if rep.Runs == 0 {
			res.notef("the child received no coalesced runs: GRO was not in use")
		} else if per := float64(rep.Messages) / float64(rep.Runs); per < float64(s.Burst) {
			res.notef("GRO coalesced %.1f datagrams per run, of %d per GSO write", per, s.Burst)
		}
	}
	return res, nil
}

// udpServer is the child's side of a raw UDP stream (it counts and acknowledges datagrams) or
// ping-pong (it echoes them).
type udpServer struct {
	c        conn.Conn
	done     chan struct{}
	stopping atomic.Bool
	msgs     atomic.Uint64
	bytes    atomic.Uint64
	runs     atomic.Uint64
	errMu    sync.Mutex
	err      error
}

func startUDPServer(s Spec, addr netip.Addr) (*udpServer, Endpoint, error) {
	c, err := conn.Listen(netip.AddrPortFrom(addr, 0), conn.Options{GRO: s.GSO})
	if err != nil {
		return nil, Endpoint{}, fmt.Errorf("listen: %w", err)
	}
	if s.GSO && !c.Offload().GRO {
		c.Close()
		return nil, Endpoint{}, errors.New("UDP GRO unavailable")
	}
	u := &udpServer{c: c, done: make(chan struct{})}
	size := s.Size
	if c.Offload().GRO {
		size = conn.MaxGROSize
	}
	msgs := make([]conn.Message, c.BatchSize())
	for i := range msgs {
		msgs[i].Buf = make([]byte, size)
	}
	if s.Kind == UDPPingPong {
		u.c = conn.BusyPolling(c, s.BusyPoll)
		go u.echo(s, msgs)
	} else {
		go u.sink(s, msgs)
	}
	return u, Endpoint{Addr: c.LocalAddr().String()}, nil
}

// segCounter counts the datagrams of one tag; its method value is made once, so that splitting
// runs with Message.Segments allocates nothing per read.
type segCounter struct {
	tag          uint64
	count, bytes uint64
}

func (sc *segCounter) seg(b []byte) {
	if tag, _, ok := header(b); ok && tag == sc.tag {
		sc.count++
		sc.bytes += uint64(len(b))
	}
}

// sink counts the stream's datagrams and acknowledges them every ackEvery.
func (u *udpServer) sink(s Spec, msgs []conn.Message) {
	defer close(u.done)
	sc := &segCounter{tag: s.Tag}
	count := sc.seg
	every := ackEvery(s)
	ack := []conn.Message{{Buf: make([]byte, rawHeader)}}
	var acked uint64
	for {
		n, err := u.c.ReadBatch(msgs)
		if err != nil {
			u.readEnd(err)
			break
		}
		for i := range msgs[:n] {
			m := &msgs[i]
			if m.SegSize > 0 {
				u.runs.Add(1)
			}
			m.Segments(count)
			ack[0].Addr = m.Addr
		}
		if sc.count-acked >= every {
			acked = sc.count
			putHeader(ack[0].Buf, s.Tag, acked)
			if _, err := u.c.WriteBatch(ack); err != nil {
				u.setErr(fmt.Errorf("ack: %w", err))
				break
			}
		}
	}
	u.msgs.Store(sc.count)
	u.bytes.Store(sc.bytes)
}

// echo returns every datagram of the tag to its sender.
func (u *udpServer) echo(s Spec, msgs []conn.Message) {
	defer close(u.done)
	out := make([]conn.Message, 0, len(msgs))
	for {
		n, err := u.c.ReadBatch(msgs)
		if err != nil {
			u.readEnd(err)
			return
		}
		out = out[:0]
		for _, m := range msgs[:n] {
			if tag, _, ok := header(m.Buf[:m.N]); ok && tag == s.Tag {
				out = append(out, conn.Message{Buf: m.Buf[:m.N], Addr: m.Addr})
			}
		}
		if len(out) == 0 {
			continue
		}
		u.msgs.Add(uint64(len(out)))
		if _, err := u.c.WriteBatch(out); err != nil {
			u.setErr(fmt.Errorf("echo: %w", err))
			return
		}
	}
}

// readEnd records why reading ended, unless it was the stop.
func (u *udpServer) readEnd(err error) {
	if u.stopping.Load() && (errors.Is(err, conn.ErrDeadline) || errors.Is(err, conn.ErrClosed)) {
		return
	}
	u.setErr(fmt.Errorf("read: %w", err))
}

func (u *udpServer) setErr(err error) {
	u.errMu.Lock()
	defer u.errMu.Unlock()
	if u.err == nil {
		u.err = err
	}
}

func (u *udpServer) mark() {}

// stop reads what is still queued on the socket, then closes it.
func (u *udpServer) stop() PeerReport {
	u.stopping.Store(true)
	u.c.SetReadDeadline(time.Now().Add(drainTime))
	select {
	case <-u.done:
	case <-time.After(serverStopTimeout):
		u.setErr(fmt.Errorf("the reader did not stop within %v", serverStopTimeout))
	}
	u.c.Close()
	<-u.done
	rep := PeerReport{Messages: u.msgs.Load(), Bytes: u.bytes.Load(), Runs: u.runs.Load()}
	u.errMu.Lock()
	defer u.errMu.Unlock()
	if u.err != nil {
		rep.Err = u.err.Error()
	}
	return rep
}

// udpPingPong measures round trips of a raw UDP datagram of s.Size bytes the child echoes, one at
// a time; a ping unanswered for pingResend is sent again and its sample discarded.
func udpPingPong(ctx context.Context, ch *Child, s Spec, local, remote netip.Addr) (Result, error) {
	res := newResult()
	c, err := conn.Listen(netip.AddrPortFrom(local, 0), conn.Options{})
	if err != nil {
		return res, fmt.Errorf("%s: %w", s.Title, err)
	}
	defer c.Close()
	ep, err := ch.start(ctx, s, remote.String(), Endpoint{})
	if err != nil {
		return res, err
	}
	defer ch.cleanup()
	dst, err := netip.ParseAddrPort(ep.Addr)
	if err != nil {
		return res, fmt.Errorf("%w: start: address %q: %w", ErrChild, ep.Addr, err)
	}
	samples, cpu, err := rawPingLoop(ctx, conn.BusyPolling(c, s.BusyPoll), dst, s, func() error { return ch.mark(ctx) })
	if err != nil {
		return res, fmt.Errorf("%s: %w", s.Title, err)
	}
	rep, err := ch.stop(ctx)
	if err != nil {
		return res, err
	}
	rttResult(&res, samples)
	res.setCPU(&cpu, &rep)
	if lost := s.Pings - len(samples); lost > 0 {
		res.notef("%d pings sent again after %v", lost, pingResend)
	}
	return res, nil
}

// rawPingLoop sends s.Pings+pingWarmup pings to dst one at a time and returns the round trips of
// those after the warm-up that were answered without being sent again, and this process's CPU time
// over the pings after the warm-up. After the warm-up it calls mark.
func rawPingLoop(ctx context.Context, c conn.Conn, dst netip.AddrPort, s Spec, mark func() error) ([]time.Duration, cpuSpan, error) {
	var outstanding, resent atomic.Uint64 // seq of the ping in flight (0: none), last one resent
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(stop)
	wg.Go(func() { // resends a ping without progress for a whole tick; interrupts the reader on ctx
		t := time.NewTicker(pingResend)
		defer t.Stop()
		buf := make([]byte, s.Size)
		msg := []conn.Message{{Buf: buf, Addr: dst}}
		var prev uint64
		for {
			select {
			case <-stop:
				return
			case <-ctx.Done():
				c.SetReadDeadline(time.Now())
				return
			case <-t.C:
			}
			if seq := outstanding.Load(); seq != 0 && seq == prev {
				resent.Store(seq)
				putHeader(buf, s.Tag, seq)
				if _, err := c.WriteBatch(msg); err != nil {
					return
				}
			}
			prev = outstanding.Load()
		}
	})
	ping := make([]byte, s.Size)
	pmsg := []conn.Message{{Buf: ping, Addr: dst}}
	rmsgs := make([]conn.Message, c.BatchSize())
	for i := range rmsgs {
		rmsgs[i].Buf = make([]byte, s.Size)
	}
	samples := make([]time.Duration, 0, s.Pings)
	var cpu cpuSpan
	for seq := uint64(1); seq <= uint64(s.Pings+pingWarmup); seq++ {
		if seq == pingWarmup+1 {
			if err := cpu.beginAfter(mark); err != nil {
				return nil, cpu, err
			}
		}
		putHeader(ping, s.Tag, seq)
		outstanding.Store(seq)
		t0 := time.Now()
		if _, err := c.WriteBatch(pmsg); err != nil {
			return nil, cpu, fmt.Errorf("ping %d: %w", seq, err)
		}
		for got := false; !got; {
			n, err := c.ReadBatch(rmsgs)
			if err != nil {
				if ctx.Err() != nil {
					err = ctx.Err()
				}
				return nil, cpu, fmt.Errorf("ping %d: %w", seq, err)
			}
			for _, m := range rmsgs[:n] {
				if tag, v, ok := header(m.Buf[:m.N]); ok && tag == s.Tag && v == seq {
					got = true
				}
			}
		}
		rtt := time.Since(t0)
		if seq > pingWarmup && resent.Load() != seq {
			samples = append(samples, rtt)
		}
	}
	cpu.end()
	outstanding.Store(0)
	return samples, cpu, nil
}
