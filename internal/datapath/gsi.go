package datapath

import (
	"net/netip"
	"time"

	"github.com/goroce/goroce/internal/conn"
	"github.com/goroce/goroce/wire"
)

// QP1, the general services interface (GSI), is not a queue pair of the datapath: the only MADs a
// goroce device answers are the communication manager's, which the device's CM engine handles as they
// arrive, and a MAD leaves as one UD SEND built here. So the datapath takes QP1's packets itself
// (Config.GSI), checks what a UD QP1 would, and hands their payload on; SendMAD builds the packets
// back. No receive queue, CQ or engine stands between: a flood of MADs costs the CM engine's bounded
// work per packet and nothing else. IBTA Vol 1 13.5 (GSI), Annex A17.4 (RoCEv2).

// DropGSI is the reason of a packet for QP1 that is not a MAD: not a UD SEND_ONLY, or with another Q_Key
// than the GSI's or a P_Key outside the default partition.
const DropGSI Drop = "not a MAD"

// pkeyMask keeps a P_Key's 15-bit partition number; the top bit is the membership type. The default
// partition 0x7FFF admits full (0xFFFF) and limited (0x7FFF) members alike. IBTA Vol 1 10.9.
const pkeyMask = 0x7FFF

// receiveGSI takes a packet for QP1: a UD SEND_ONLY with Q_Key GSIQKey in the default partition carries
// a MAD as its payload, which goes to Config.GSI; anything else is dropped and counted. rxe checks the
// same (rxe_recv.c check_keys: QP1's Q_Key is GSIQKey whatever the sender's QP).
func (s *shard) receiveGSI(pkt wire.Packet, b []byte, from, local netip.AddrPort, tos uint8, id uint16, now time.Time) {
	d := s.d
	deth := pkt.DETH()
	if pkt.Opcode() != wire.UDSendOnly || deth == nil || deth.QKey() != wire.GSIQKey ||
		pkt.BTH().PKey()&pkeyMask != wire.DefaultPKey&pkeyMask {
		d.stats.dropGSI.Add(1)
		if t := d.cfg.Tracer; t != nil {
			t.TracePacket(&TraceRecord{At: now, From: from, To: local, TOS: tos, IPID: id, Bytes: b, Packet: pkt, Drop: DropGSI})
		}
		return
	}
	d.stats.rxMADs.Add(1)
	if t := d.cfg.Tracer; t != nil {
		t.TracePacket(&TraceRecord{At: now, From: from, To: local, TOS: tos, IPID: id, Bytes: b, Packet: pkt})
	}
	d.cfg.GSI(from, pkt.Payload(), now)
}

// SendMAD sends mad from QP1 to QP1 at to: one UD SEND_ONLY packet with the GSI Q_Key and the default
// P_Key, from QP1's source port. The PSN counts QP1's packets, as a UD QP's would (receivers ignore it).
// A full socket loses the packet like any datagram: the CM resends what needs an answer.
func (d *Datapath) SendMAD(to netip.AddrPort, mad []byte, now time.Time) error {
	if d.closing.Load() {
		return ErrClosed
	}
	p, err := d.portFor(wire.QPNGSI)
	if err != nil {
		return err
	}
	to = netip.AddrPortFrom(d.scoped(to.Addr().Unmap()), to.Port())
	f := wire.Fields{
		BTH:  wire.BTHFields{Opcode: wire.UDSendOnly, PKey: wire.DefaultPKey, DestQP: wire.QPNGSI},
		DETH: wire.DETHFields{QKey: wire.GSIQKey, SrcQP: wire.QPNGSI},
	}
	tb := getTxBatch()
	defer putTxBatch(tb)
	p.mu.Lock()
	defer p.mu.Unlock()
	f.BTH.PSN = d.gsiPSN
	d.gsiPSN = d.gsiPSN.Add(1)
	out, err := wire.Append(tb.arena[:0], &f, mad)
	if err != nil {
		return err
	}
	tb.arena = out
	src := netip.AddrPortFrom(d.local.Addr(), p.num)
	seal(out, src, to, 0)
	tb.msgs = append(tb.msgs, conn.Message{Buf: out, Addr: to, SegSize: len(out)})
	d.stats.txMADs.Add(1)
	if t := d.cfg.Tracer; t != nil {
		if pp, err := wire.Parse(out); err == nil {
			t.TracePacket(&TraceRecord{Sent: true, At: now, From: src, To: to, Bytes: out, Packet: pp})
		}
	}
	p.flush(tb)
	return nil
}

// NotifyReceive has f called once, when the next packet for q from its peer arrives, on the goroutine
// that handles the packet and before q's engine sees it. f must not block; it runs with no lock held.
// The CM learns so that a passive connection is in use before its RTU came (the communication
// established event, IBV_EVENT_COMM_EST; IBTA Vol 1 11.6.3). A later call replaces an f not yet called;
// nil cancels it.
func (q *QP) NotifyReceive(f func()) {
	if f == nil {
		q.notify.Store(nil)
		return
	}
	q.notify.Store(&f)
}
