package wire

import "strconv"

// AppendText appends a one-line description of the packet to dst, in the words goroce's traces use:
//
//	RC SEND_FIRST qp=0x000011 psn=0x10b60a payload=1024
//	RC ACKNOWLEDGE qp=0x000011 psn=0x10b60d ACK msn=1
//	RC RDMA_READ_REQUEST qp=0x000022 psn=0x000100 ack-req va=0x7f0000001000 rkey=0x12345678 len=8192
//
// It allocates only when dst lacks capacity.
func (p Packet) AppendText(dst []byte) []byte {
	b := p.BTH()
	i := p.info
	if i.Transport != TransportCNP { // "CNP", not "CNP CNP": see Opcode.String
		dst = append(dst, i.Transport.String()...)
		dst = append(dst, ' ')
	}
	dst = append(dst, i.Name...)
	dst = appendHex(append(dst, " qp="...), uint64(b.DestQP()), 6)
	dst = appendHex(append(dst, " psn="...), uint64(b.PSN()), 6)
	if b.AckReq() {
		dst = append(dst, " ack-req"...)
	}
	if b.SolicitedEvent() {
		dst = append(dst, " se"...)
	}
	if b.BECN() {
		dst = append(dst, " becn"...)
	}
	if d := p.DETH(); d != nil {
		dst = appendHex(append(dst, " qkey="...), uint64(d.QKey()), 8)
		dst = appendHex(append(dst, " src-qp="...), uint64(d.SrcQP()), 6)
	}
	if r := p.RETH(); r != nil {
		dst = appendHex(append(dst, " va="...), r.VA(), 0)
		dst = appendHex(append(dst, " rkey="...), uint64(r.RKey()), 8)
		dst = strconv.AppendUint(append(dst, " len="...), uint64(r.DMALen()), 10)
	}
	if a := p.AtomicETH(); a != nil {
		dst = appendHex(append(dst, " va="...), a.VA(), 0)
		dst = appendHex(append(dst, " rkey="...), uint64(a.RKey()), 8)
		if i.Op == OpCompareSwap {
			dst = appendHex(append(dst, " compare="...), a.Compare(), 0)
			dst = appendHex(append(dst, " swap="...), a.SwapAdd(), 0)
		} else {
			dst = appendHex(append(dst, " add="...), a.SwapAdd(), 0)
		}
	}
	if a := p.AETH(); a != nil {
		dst = append(append(dst, ' '), a.Syndrome().String()...)
		dst = strconv.AppendUint(append(dst, " msn="...), uint64(a.MSN()), 10)
	}
	if a := p.AtomicAckETH(); a != nil {
		dst = appendHex(append(dst, " orig="...), a.OrigData(), 0)
	}
	if m := p.ImmDt(); m != nil {
		dst = appendHex(append(dst, " imm="...), uint64(m.Imm()), 8)
	}
	if v := p.IETH(); v != nil {
		dst = appendHex(append(dst, " inv-rkey="...), uint64(v.RKey()), 8)
	}
	if i.Payload {
		dst = strconv.AppendInt(append(dst, " payload="...), int64(p.PayloadLen()), 10)
	}
	return dst
}

// String describes the packet on one line; see AppendText.
func (p Packet) String() string { return string(p.AppendText(nil)) }

// appendHex appends 0x and v in hex, zero-padded to width digits.
func appendHex(dst []byte, v uint64, width int) []byte {
	dst = append(dst, "0x"...)
	var buf [16]byte
	s := strconv.AppendUint(buf[:0], v, 16)
	for n := len(s); n < width; n++ {
		dst = append(dst, '0')
	}
	return append(dst, s...)
}
