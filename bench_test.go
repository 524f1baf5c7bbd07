package goroce

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/goroce/goroce/internal/conn"
)

// BenchmarkSendPingPong measures the round trip of a 16-byte SEND answered by a 16-byte SEND between
// two devices on loopback sockets: ns/op is the mean, p50-µs the median. internal/conn's
// BenchmarkPingPongFloor measures the same exchange without goroce's machinery (its roce-sockets
// case) and raw UDP's; `goroce perf loopback` compares with raw UDP in one run. Built with -tags
// goroce_systrace, it also logs conn.SyscallProfile.
func BenchmarkSendPingPong(b *testing.B) {
	p := newPair(b, nil, RC, ConnectOptions{MTU: MTU1024})
	ma, _ := p.pda.RegMR(make([]byte, 16), LocalWrite)
	mb, _ := p.pdb.RegMR(make([]byte, 16), LocalWrite)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	stop := make(chan struct{})
	go func() {
		wcs := make([]Completion, 8)
		for i := 0; i < 64; i++ {
			if err := p.qb.PostRecv(&RecvWR{SGL: []SGE{mb.SGE(0, 16)}}); err != nil {
				done <- err
				return
			}
		}
		for {
			n, err := p.cqb.Wait(ctx, wcs)
			if err != nil {
				select {
				case <-stop:
					done <- nil
				default:
					done <- err
				}
				return
			}
			for _, wc := range wcs[:n] {
				if wc.Opcode == CompRecv {
					_ = p.qb.PostRecv(&RecvWR{SGL: []SGE{mb.SGE(0, 16)}})
					_ = p.qb.PostSend(&SendWR{Opcode: WRSend, Flags: Inline, InlineData: mb.Bytes()})
				}
			}
		}
	}()
	wcs := make([]Completion, 8)
	send := SendWR{Opcode: WRSend, Flags: Inline, InlineData: ma.Bytes()}
	recv := RecvWR{SGL: []SGE{ma.SGE(0, 16)}}
	var samples []time.Duration
	conn.SyscallProfile() // from here on
	b.ReportAllocs()
	for b.Loop() {
		t0 := time.Now()
		if err := p.qa.PostRecv(&recv); err != nil {
			b.Fatal(err)
		}
		if err := p.qa.PostSend(&send); err != nil {
			b.Fatal(err)
		}
		for answered := false; !answered; {
			n, err := p.cqa.Wait(ctx, wcs)
			if err != nil {
				b.Fatal(err)
			}
			for _, wc := range wcs[:n] {
				answered = answered || wc.Opcode == CompRecv
			}
		}
		samples = append(samples, time.Since(t0))
	}
	b.StopTimer()
	close(stop)
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	if p := conn.SyscallProfile(); p != "" {
		b.Log("\n" + p)
	}
	slices.Sort(samples)
	b.ReportMetric(float64(samples[len(samples)/2].Nanoseconds())/1e3, "p50-µs")
}

// BenchmarkWriteStream measures a stream of 64 KiB RDMA WRITEs at path MTU 4096 between two devices on
// loopback sockets, 16 outstanding, one completion per WRITE; b.SetBytes makes the figure a goodput,
// and the allocations are per WRITE (16 packets each way, GSO runs included).
func BenchmarkWriteStream(b *testing.B) {
	for _, gso := range []GSOMode{GSOAuto, GSOOff} {
		name := map[GSOMode]string{GSOAuto: "gso", GSOOff: "nogso"}[gso]
		b.Run(name, func(b *testing.B) {
			p := newPairConfig(b, Config{GSO: gso}, RC, ConnectOptions{MTU: MTU4096})
			const size = 64 << 10
			src, _ := p.pda.AllocMR(size, LocalWrite)
			dst, _ := p.pdb.AllocMR(size, LocalWrite|RemoteWrite)
			wr := SendWR{Opcode: WRRDMAWrite, Flags: Signaled, SGL: []SGE{src.SGE(0, size)}, RemoteAddr: dst.Addr(), RKey: dst.RKey()}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			wcs := make([]Completion, 16)
			const depth = 16
			for range depth {
				if err := p.qa.PostSend(&wr); err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(size)
			b.ReportAllocs()
			for done := 0; done < b.N; {
				n, err := p.cqa.Wait(ctx, wcs)
				if err != nil {
					b.Fatal(err)
				}
				for _, wc := range wcs[:n] {
					if wc.Status != StatusSuccess {
						b.Fatal(wc.Status)
					}
					if err := p.qa.PostSend(&wr); err != nil {
						b.Fatal(err)
					}
				}
				done += n
			}
		})
	}
}
