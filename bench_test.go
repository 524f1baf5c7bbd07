package goroce

import (
	"context"
	"testing"
	"time"

	"github.com/goroce/goroce/wire"
)

// BenchmarkSendPingPong measures the round trip of a 16-byte SEND answered by a 16-byte SEND between
// two devices on loopback sockets; the raw UDP path's figure comes from `goroce perf loopback`.
func BenchmarkSendPingPong(b *testing.B) {
	p := newPair(b, nil, RC, ConnectOptions{MTU: wire.MTU1024})
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
	b.ReportAllocs()
	for b.Loop() {
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
	}
	close(stop)
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}
