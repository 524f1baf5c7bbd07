package goroce

import (
	"errors"
	"net/netip"
	"runtime"

	"github.com/goroce/goroce/internal/conn"
	"github.com/goroce/goroce/qp"
	"github.com/goroce/goroce/wire"
)

// rxItem is a received packet and what the socket said about it.
type rxItem struct {
	qp   *QP
	pkt  wire.Packet
	from netip.AddrPort
	to   netip.Addr
	tos  uint8
}

// rxLoop reads batches from the socket, validates each packet once (wire.Parse, then the ICRC), runs
// it through its QP's engine, and then sends what the engines it touched want to send, in one batch.
// It is the only reader of the socket.
func (d *Device) rxLoop() {
	defer d.wg.Done()
	batch := d.conn.BatchSize()
	msgs := make([]conn.Message, batch)
	bufs := make([][]byte, batch)
	for i := range bufs {
		bufs[i] = make([]byte, rxBufSize)
	}
	v := icrcVerifier{rec: wire.IDRecovery{RequireDF: true}}
	tx := newTxBatch(batch)
	var info qp.RxInfo
	var touched []*QP
	for {
		for i := range msgs {
			msgs[i] = conn.Message{Buf: bufs[i]}
		}
		n, err := d.conn.ReadBatch(msgs)
		if err != nil {
			if errors.Is(err, conn.ErrClosed) || d.closing.Load() {
				return
			}
			d.stats.rxBusy.Add(1)
			continue
		}
		for i := 0; i < n; i++ {
			m := &msgs[i]
			d.stats.rxPackets.Add(1)
			d.stats.rxBytes.Add(uint64(m.N))
			if m.Truncated {
				d.stats.dropTruncated.Add(1)
				continue
			}
			pkt, err := wire.Parse(m.Buf[:m.N])
			if err != nil {
				d.stats.dropMalformed.Add(1)
				continue
			}
			to := m.Local
			if !to.IsValid() {
				to = d.local.Addr()
			}
			if !v.verify(d.cfg.ICRC, m.Addr, netip.AddrPortFrom(to, d.local.Port()), pkt) {
				d.stats.dropICRC.Add(1)
				continue
			}
			q := d.lookup(pkt.BTH().DestQP())
			if q == nil {
				d.stats.dropUnknownQPN.Add(1)
				continue
			}
			// RC and UC QPs take packets only from their peer, as rxe does. IBTA Annex A17.4.5.
			if q.typ != UD {
				if p := q.peer.Load(); p == nil || p.Addr() != m.Addr.Addr().Unmap() {
					d.stats.dropWrongPeer.Add(1)
					continue
				}
			}
			it := rxItem{qp: q, pkt: pkt, from: m.Addr, to: to, tos: m.TOS}
			d.deliver(&it, &info, tx)
			if !q.rxTouched {
				q.rxTouched = true
				touched = append(touched, q)
			}
		}
		// A completion woke an application goroutine waiting on a CQ: let it run now, before this
		// loop pumps and polls the socket again. In a request-reply exchange it posts its reply
		// straight away, which also carries the ACK the engine is holding back (AckDelay), so the
		// pump below finds nothing to send and no timer to file.
		if d.woke.Swap(false) {
			runtime.Gosched()
		}
		d.txMu.Lock()
		for _, q := range touched {
			q.rxTouched = false
			d.pump(q, tx)
		}
		d.flush(tx)
		d.txMu.Unlock()
		clear(touched)
		touched = touched[:0]
	}
}

func (d *Device) lookup(n wire.QPN) *QP {
	v, ok := d.qps.Load(n)
	if !ok {
		return nil
	}
	return v.(*QP)
}

// icrcVerifier checks received ICRCs; it belongs to the receive loop.
type icrcVerifier struct {
	rec wire.IDRecovery
}

// verify checks pkt's ICRC against the IP and UDP headers it must have traveled in.
func (v *icrcVerifier) verify(mode ICRCMode, from, to netip.AddrPort, pkt wire.Packet) bool {
	if mode == ICRCOff {
		return true
	}
	src, dst := from.Addr().Unmap(), to.Addr().Unmap()
	var udp [8]byte
	udpTemplate(&udp, from.Port(), to.Port(), pkt.Len())
	if src.Is4() && dst.Is4() {
		var ip [20]byte
		ipv4Template(&ip, src, dst, pkt.Len())
		if mode == ICRCStrict {
			return wire.VerifyICRC(ip[:], udp[:], pkt.Bytes()) == nil
		}
		_, _, err := v.rec.VerifyIPv4(ip[:], udp[:], pkt.Bytes())
		return err == nil
	}
	var ip [40]byte
	ipv6Template(&ip, src, dst, pkt.Len())
	return wire.VerifyICRC(ip[:], udp[:], pkt.Bytes()) == nil
}
