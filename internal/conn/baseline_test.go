package conn

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/goroce/goroce/wire"
)

func TestRawThroughputMem(t *testing.T) {
	n := NewMemNetwork()
	a, b := memPair(t, n)
	r, err := RawThroughput(context.Background(), a, b, 1024, 256, 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(r)
	if r.Sent == 0 || r.Received != r.Sent || r.Loss != 0 || r.Bytes != r.Sent*1024 || r.Gbps <= 0 || r.PPS <= 0 {
		t.Errorf("result %+v", r)
	}
	if s := n.Stats(); s.DropOverflow != 0 {
		t.Errorf("window 256 overflowed a 4096 queue: %+v", s)
	}
	// The Conns are reusable: a second run ignores nothing of its own and finishes.
	if _, err := RawThroughput(context.Background(), a, b, 64, 64, 5*time.Millisecond); err != nil {
		t.Fatal(err)
	}
}

// TestRawThroughputLossy checks that loss is reported and does not stall the windowed sender.
func TestRawThroughputLossy(t *testing.T) {
	n := NewMemNetwork()
	a, b := memPair(t, n)
	r, err := rawThroughput(context.Background(), Lossy(a, 10, 9), b, 256, 128, 0, 5000)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(r)
	if r.Sent != 5000 || r.Loss < 0.05 || r.Loss > 0.15 {
		t.Errorf("sent %d, loss %.3f; want 5000, about 0.10", r.Sent, r.Loss)
	}
}

func TestRawThroughputLoopback(t *testing.T) {
	a, b := udpPair(t, loop4, Options{})
	r, err := rawThroughput(context.Background(), a, b, 4156, 256, 0, 20000)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(r)
	if r.Sent != 20000 || r.Received == 0 || r.Received > r.Sent {
		t.Errorf("result %+v", r)
	}
	if _, err := RawThroughput(context.Background(), a, b, 8, 1, time.Millisecond); err == nil {
		t.Error("size 8 accepted")
	}
}

func TestRawPingPong(t *testing.T) {
	a, b := udpPair(t, loop4, Options{})
	r, err := RawPingPong(context.Background(), a, b, 64, 500)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(r)
	if r.Sent != 500 || r.Received != 500 || r.RTTP50 <= 0 || r.RTTP99 < r.RTTP50 || r.RTTMax < r.RTTP99 || r.RTTMin > r.RTTP50 {
		t.Errorf("result %+v", r)
	}
}

// TestRawPingPongLossy checks that lost pings are resent and reported, not waited on forever.
func TestRawPingPongLossy(t *testing.T) {
	n := NewMemNetwork()
	a, b := memPair(t, n)
	r, err := RawPingPong(context.Background(), Lossy(a, 20, 11), b, 32, 40)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(r)
	if r.Sent != 40 || r.Received != 40 || r.Loss == 0 || r.Loss > 0.5 {
		t.Errorf("result %+v", r)
	}
}

func TestRawPingPongCancel(t *testing.T) {
	n := NewMemNetwork()
	a, b := memPair(t, n)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := RawPingPong(ctx, a, b, 32, 1000); err != context.Canceled {
		t.Errorf("err = %v, want context.Canceled", err)
	}
}

func TestPercentile(t *testing.T) {
	s := make([]time.Duration, 100)
	for i := range s {
		s[i] = time.Duration(i + 1)
	}
	if p := percentile(s, 0.5); p != 50 {
		t.Errorf("p50 = %d", p)
	}
	if p := percentile(s, 0.99); p != 99 {
		t.Errorf("p99 = %d", p)
	}
	if p := percentile(s[:1], 0.99); p != 1 {
		t.Errorf("p99 of one = %d", p)
	}
}

// baselineSizes are the datagram sizes of the comparison: a small packet, a 1 KiB MTU packet,
// and an MTU-4096 RoCEv2 packet (BTH 12 + RETH 16 + payload 4096 + ICRC 4 + headroom = 4156).
var baselineSizes = []int{64, 1024, 4156}

// BenchmarkRawThroughput streams b.N datagrams one way over 127.0.0.1 with at most ~2 MiB in
// flight (limits.md: a window of a quarter of the receive buffer keeps loopback lossless);
// ns/op is per datagram.
func BenchmarkRawThroughput(b *testing.B) {
	for _, size := range baselineSizes {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			a, c := udpPair(b, loop4, Options{RecvBuffer: 8 << 20})
			window := min(max((2<<20)/size, DefaultBatchSize), 1024)
			b.ReportAllocs()
			b.ResetTimer()
			r, err := rawThroughput(context.Background(), a, c, size, window, 0, uint64(b.N))
			b.StopTimer()
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(r.Gbps, "Gb/s")
			b.ReportMetric(r.PPS, "pps")
			b.ReportMetric(100*r.Loss, "loss%")
		})
	}
}

// BenchmarkRawPingPong measures b.N round trips over 127.0.0.1; ns/op is the mean round trip.
func BenchmarkRawPingPong(b *testing.B) {
	for _, size := range baselineSizes {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			a, c := udpPair(b, loop4, Options{})
			b.ReportAllocs()
			b.ResetTimer()
			r, err := RawPingPong(context.Background(), a, c, size, b.N)
			b.StopTimer()
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(r.RTTP50.Nanoseconds())/1e3, "p50-µs")
			b.ReportMetric(float64(r.RTTP99.Nanoseconds())/1e3, "p99-µs")
			b.ReportMetric(100*r.Loss, "loss%")
		})
	}
}

// BenchmarkUDPBatch is the cost of one WriteBatch plus ReadBatch of a full 64-datagram batch
// on one goroutine, without the pacing of the throughput baseline.
func BenchmarkUDPBatch(b *testing.B) {
	for _, size := range baselineSizes {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			a, c := udpPair(b, loop4, Options{})
			out := make([]Message, a.BatchSize())
			buf := make([]byte, size)
			for i := range out {
				out[i] = Message{Buf: buf, Addr: c.LocalAddr()}
			}
			in := newMessages(c.BatchSize(), size)
			b.ReportAllocs()
			b.SetBytes(int64(size * len(out)))
			for b.Loop() {
				a.WriteBatch(out)
				for got := 0; got < len(out); {
					n, err := c.ReadBatch(in[got:])
					if err != nil {
						b.Fatal(err)
					}
					got += n
				}
			}
			b.ReportMetric(float64(b.N*len(out))/b.Elapsed().Seconds(), "pps")
		})
	}
}

// BenchmarkPingPongFloor is a ping-pong over 127.0.0.1 of raw 32-byte datagrams (raw), and of what a
// RoCEv2 SEND ping-pong's own per-packet work needs and nothing more (roce): each side builds a
// 16-byte SEND_ONLY and the ACK of the SEND it answers, seals both ICRCs, writes them in one GSO write
// to a GRO reader, and parses both packets it reads and computes their ICRCs. roce-sockets does the
// same over a goroce device's sockets: each side receives on a reuseport group of min(GOMAXPROCS, 4)
// sockets steered by destination QPN (ListenShards), reads the QP's socket, and sends from a socket
// of its own, as a QP sends from its source port. No engine, queue or memory region is involved, so
// goroce's round trip (the root package's BenchmarkSendPingPong, `goroce perf loopback -procs 1 -only
// pingpong`) against roce-sockets' is what its machinery costs; ns/op is the mean round trip, and
// p50-µs its median. Built with -tags goroce_systrace, each case also logs SyscallProfile.
func BenchmarkPingPongFloor(b *testing.B) {
	ip, udp, payload := make([]byte, 20), make([]byte, 8), make([]byte, 16)
	ip[0] = 0x45
	const qpn = 0x11
	for _, name := range []string{"raw", "roce", "roce-sockets"} {
		roce := name != "raw"
		b.Run(name, func(b *testing.B) {
			opts := Options{}
			if roce {
				opts = Options{GSO: true, GRO: true}
			}
			a, c := udpPair(b, loop4, opts) // receive and send
			sa, sc := a, c
			if name == "roce-sockets" {
				a, c = shardOf(b, opts, qpn), shardOf(b, opts, qpn)
			}
			build := func(m []Message, buf []byte, to netip.AddrPort) []Message {
				if !roce {
					m[0] = Message{Buf: buf[:32], Addr: to}
					return m
				}
				f := wire.Fields{BTH: wire.BTHFields{Opcode: wire.RCSendOnly, PKey: wire.DefaultPKey, DestQP: qpn}}
				out, _ := wire.Append(buf[:0], &f, payload)
				_ = wire.SetICRC(ip, udp, out)
				n := len(out)
				f = wire.Fields{BTH: wire.BTHFields{Opcode: wire.RCAcknowledge, PKey: wire.DefaultPKey, DestQP: qpn}}
				out, _ = wire.Append(out, &f, nil)
				_ = wire.SetICRC(ip, udp, out[n:])
				m[0] = Message{Buf: out, Addr: to, SegSize: n}
				return m
			}
			// The last datagram, which ends the echo, is a bare BTH to the same QP (steered alike).
			last := make([]byte, wire.BTHLen)
			last[QPNOffset+2] = qpn
			handle := func(msgs []Message) (fin bool) {
				for i := range msgs {
					if msgs[i].N == len(last) {
						return true
					}
					if roce {
						msgs[i].Segments(func(seg []byte) {
							p, err := wire.Parse(seg)
							if err != nil {
								b.Error(err)
								return
							}
							_, _ = wire.ComputeICRC(ip, udp, p.Bytes()[:p.Len()-wire.ICRCLen])
						})
					}
				}
				return false
			}
			done := make(chan struct{})
			go func() { // echo
				defer close(done)
				msgs, out, buf, to := newMessages(8, 2048), make([]Message, 1), make([]byte, 256), dialable(a.LocalAddr())
				for {
					n, err := c.ReadBatch(msgs)
					if err != nil || handle(msgs[:n]) {
						return
					}
					if _, err := sc.WriteBatch(build(out, buf, to)); err != nil {
						return
					}
				}
			}()
			msgs, out, buf, to := newMessages(8, 2048), make([]Message, 1), make([]byte, 256), dialable(c.LocalAddr())
			var samples []time.Duration
			SyscallProfile() // from here on
			b.ReportAllocs()
			for b.Loop() {
				t0 := time.Now()
				if _, err := sa.WriteBatch(build(out, buf, to)); err != nil {
					b.Fatal(err)
				}
				n, err := a.ReadBatch(msgs)
				if err != nil {
					b.Fatal(err)
				}
				handle(msgs[:n])
				samples = append(samples, time.Since(t0))
			}
			b.StopTimer()
			if _, err := sa.WriteBatch([]Message{{Buf: last, Addr: to}}); err != nil {
				b.Fatal(err)
			}
			<-done
			if p := SyscallProfile(); p != "" {
				b.Log("\n" + p)
			}
			slices.Sort(samples)
			b.ReportMetric(float64(percentile(samples, 0.5).Nanoseconds())/1e3, "p50-µs")
		})
	}
}

// shardOf opens a reuseport group on 127.0.0.1 as a goroce device does (min(GOMAXPROCS, 4) sockets,
// steered by QPN) and returns the socket that datagrams to qpn reach; the group closes at the end of
// the benchmark.
func shardOf(b *testing.B, opts Options, qpn int) *UDPConn {
	b.Helper()
	n := min(runtime.GOMAXPROCS(0), 4)
	group, err := UDP.ListenShards(loop4, n, opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		for _, c := range group {
			c.Close()
		}
	})
	if st := group[0].(*UDPConn).Stats(); st.SteerFailed != 0 {
		b.Skip("the kernel refused the steering program")
	}
	return group[qpn%n].(*UDPConn)
}
